"""The PNG plot of each report kind: accuracy drop with its bootstrap interval against what the recipe varies,
the paper's reported points in gray beside ours (never mixed into our series)."""

from __future__ import annotations

from collections import defaultdict

__all__ = ["plot_samples", "plot_series", "plot_table1", "plot_variants"]


def _errorbar(ax, xs: list, group: list[dict], label: str, **kwargs) -> None:
    ys = [r["drop"] for r in group]
    err = [[r["drop"] - r["drop_ci"][0] for r in group], [r["drop_ci"][1] - r["drop"] for r in group]]
    ax.errorbar(xs, ys, yerr=err, capsize=3, label=label, **kwargs)


def plot_table1(ax, primary: list[dict], paper: dict) -> None:
    for r in primary:
        _errorbar(ax, [r["rate_paper"]], [r], r["label"], marker="o", linestyle="none")
    for row in paper.get("rows", []):
        ax.scatter([row["compression_rate"]], [row["drop"]], marker="x", color="gray")
        ax.annotate(f"{row['method']} (paper)", (row["compression_rate"], row["drop"]), fontsize=7)
    ax.set_xlabel("compression rate (paper's formula)")


def plot_samples(ax, group: list[dict], paper: dict) -> None:
    bayes = sorted((r for r in group if r["inference"] == "bayes"), key=lambda r: r["samples"])
    _errorbar(ax, [r["samples"] for r in bayes], bayes, "Bayesian averaging (ours)", marker="o")
    for r in (r for r in group if r["inference"] == "greedy"):
        ax.axhline(r["drop"], linestyle="--", color="gray", label="greedy (ours)")
    reported = paper.get("rows", [])
    if reported:
        ax.plot(
            [p["samples"] for p in reported],
            [p["drop"] for p in reported],
            "x:",
            color="gray",
            label=f"paper, {paper.get('model', '')}",
        )
    ax.set_xscale("log")
    ax.set_xlabel("M (samples)")


def plot_variants(ax, primary: list[dict]) -> None:
    """One point per labelled variant (its primary evaluation), in recipe order, drop with its interval."""
    for i, r in enumerate(primary):
        _errorbar(ax, [i], [r], r["label"], marker="o", linestyle="none")
    ax.set_xticks(range(len(primary)), [r["label"] for r in primary], rotation=30, ha="right", fontsize=6)
    ax.set_xlabel("variant")


def plot_series(ax, group: list[dict], x: str, series: str, xlabel: str) -> None:
    buckets: dict[tuple, list[dict]] = defaultdict(list)
    for r in group:
        buckets[(r["model"], r[series])].append(r)
    for (model, name), members in sorted(buckets.items(), key=lambda kv: str(kv[0])):
        members.sort(key=lambda r: r[x])
        _errorbar(ax, [r[x] for r in members], members, f"{model} {name}", marker="o")
    ax.set_xlabel(xlabel)
