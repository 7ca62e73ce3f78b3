"""The convergence figure, drawn from the study's JSON alone (so a committed JSON can be re-plotted)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from ._io import write_text_atomic
from .hellinger import parametric_reference

__all__ = ["plot_convergence", "render_convergence"]


def _medians(points: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    ns = np.array(sorted({q["n"] for q in points}), dtype=float)
    return ns, np.array([np.median([q[key] for q in points if q["n"] == n]) for n in ns])


def _risk_panel(ax, result: dict, main: list[dict], by_variant: dict[str, list[dict]]) -> None:
    ax.loglog([q["n"] for q in main], [q["hellinger_sq"] for q in main], "o", ms=3, alpha=0.35, color="C0")
    for key, label, style in (
        ("hellinger_sq", r"$\int d^2\, d\hat q$ (median)", "o-"),
        ("hellinger_sq_sampled", "discrete inference (median)", "x--"),
        ("hellinger_sq_fp", "full precision (median)", "s:"),
    ):
        ax.loglog(*_medians(main, key), style, label=label)
    for variant, key, label, style in (
        ("gaussian/projection/moment_matched", "hellinger_sq", r"Gaussian prior, $\int d^2 d\hat q$", "^-."),
        ("gaussian/projection/plugin", "hellinger_sq_avg", r"Gaussian prior, plug-in, $\theta^{avg}$", "v-."),
        ("spike_slab/default/plugin", "hellinger_sq_greedy", "sqs-core defaults, greedy", "D--"),
    ):
        if by_variant.get(variant):
            ax.loglog(*_medians(by_variant[variant], key), style, ms=5, alpha=0.8, label=label)
    ns = np.geomspace(min(q["n"] for q in main), max(q["n"] for q in main), 50)
    ref = result["theory"]["parametric"]
    for k, style in ((ref["k_sqs"], "k--"), (ref["k_fp"], "k:")):
        ax.loglog(ns, parametric_reference(k, ns), style, lw=0.8, label=f"k/(8n), k={k}")
    if result.get("slope") is not None:
        fit = result["slopes"][result["main_variant"]]["hellinger_sq"]
        lo, hi = result["slope_ci"]
        label = f"OLS slope {result['slope']:.2f} [{lo:.2f}, {hi:.2f}]"
        ax.loglog(ns, np.exp(fit["intercept"]) * ns ** fit["slope"], "-", color="C3", label=label)
    ax.set(xlabel="n", ylabel=r"squared Hellinger $d^2(P_\theta, P_0)$", title=f"Risk ({result['tier']} tier)")
    ax.legend(fontsize=7)


def _recovery_panel(ax, main: list[dict]) -> None:
    ns = np.array(sorted({q["n"] for q in main}), dtype=float)
    at = [[q for q in main if q["n"] == n] for n in ns]
    ax.semilogx(ns, [np.mean([q["support_exact"] for q in g]) for g in at], "o-", label="support exact")
    accuracy = [np.nanmean([np.nan if q["level_accuracy"] is None else q["level_accuracy"] for q in g]) for g in at]
    ax.semilogx(ns, accuracy, "s--", label="level accuracy")
    s = max(q["true_positive"] + q["false_negative"] for q in main)
    ax.semilogx(ns, [np.mean([q["false_positive"] for q in g]) / s for g in at], "x:", label="false positives / s")
    ax.set(xlabel="n", ylabel="fraction", ylim=(-0.05, 1.05), title="Support and level recovery")
    ax.legend(fontsize=7)


def render_convergence(result: dict) -> bytes:
    """The figure of :func:`plot_convergence` as PNG bytes, drawn in memory (nothing is written)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_variant: dict[str, list[dict]] = {}
    for q in result["points"]:
        by_variant.setdefault(q["variant"], []).append(q)
    main = by_variant[result["main_variant"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    try:
        _risk_panel(left, result, main, by_variant)
        _recovery_panel(right, main)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=120)
    finally:
        plt.close(fig)
    return buffer.getvalue()


def plot_convergence(result: dict, path: Path) -> Path:
    """Two panels: the risk against n (log-log) and support / level recovery against n."""
    return write_text_atomic(path, render_convergence(result))  # no half-written PNG if the run is stopped
