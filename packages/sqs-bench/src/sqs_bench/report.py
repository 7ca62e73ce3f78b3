"""Markdown tables and PNG plots built from result JSON files only (nothing is re-run).

One section per recipe; the recipe's ``report.kind`` picks the view: ``table1`` (method comparison, the
paper's columns), ``samples`` (drop vs M), ``greedy_vs_bayes`` (drop vs K, greedy and Bayesian averaging),
``prior`` (drop vs non-zero rate per prior), anything else a flat table. The paper's own numbers are printed
in a separate table labelled as reported by the paper, never mixed into ours.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from .config import load_recipe
from .plots import plot_samples, plot_series, plot_table1, plot_variants
from .results import is_result_file, load_result_files, out_dir_path, prepare_out_dir, write_atomic

__all__ = ["build_report", "load_results", "rows", "summaries"]

logger = logging.getLogger(__name__)


def load_results(results_dir: str | Path) -> list[dict[str, Any]]:
    """Every result JSON under ``results_dir`` (recursively), validated, sorted by run id.

    Raises :class:`~sqs_bench.results.ResultFileError` naming the file and key of a damaged result, for
    results of more than one tier, and for two results of the same run."""
    return load_result_files(results_dir)


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per evaluation of a result (SQS: greedy and each M; baselines: one)."""
    m, config = result["metrics"], result["config"]
    prior = config.get("sqs", {}).get("prior", {}).get("kind", "spike_slab") if m["method"] == "sqs" else None
    base = {
        "model": m["model"],
        "method": m["method"],
        "bits": m["bits"],
        "nonzero": m["nonzero"],
        "rate_paper": m["compression_rate_paper"],
        "rate_file": m["compression_rate_file"],
        "fp32_acc": m["fp32_acc"],
        "prior": prior,
        "label": result["label"],
        "n": m["test_images"],
        "wall_time_s": result.get("wall_time_s"),
    }
    return [{**base, **ev, "primary": ev["name"] == m["inference"]} for ev in result["evaluations"]]


def _num(value: Any, fmt: str = "{:.2f}") -> str:
    return "–" if value is None else fmt.format(value)


def _drop(row: dict[str, Any]) -> str:
    lo, hi = row["drop_ci"]
    return f"{row['drop']:.2f} [{lo:.2f}, {hi:.2f}]"


def _comp_type(row: dict[str, Any]) -> str:
    pruned, quantized = row["nonzero"] < 1.0, row["bits"] < 32
    return "P+Q" if pruned and quantized else ("P" if pruned else "Q")


def _markdown(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def _paper_table(paper: dict[str, Any]) -> str:
    """The paper's reported rows for this experiment, verbatim keys."""
    reported = paper.get("rows", [])
    if not reported:
        return f"_{paper['note']}_" if "note" in paper else ""
    keys = list(dict.fromkeys(k for row in reported for k in row))
    body = [[str(row.get(k, "")) for k in keys] for row in reported]
    fp32 = f", fp32 {paper['fp32_acc']}%" if "fp32_acc" in paper else ""
    title = f"Reported by the paper (not re-run here; {paper.get('model', 'paper model')}{fp32}):"
    return title + "\n\n" + _markdown(keys, body)


def _table1(group: list[dict]) -> tuple[str, list[dict]]:
    primary = [r for r in group if r["primary"]]
    header = [
        "Method",
        "Type",
        "Bits",
        "Non-zero (%)",
        "Rate (paper eq.)",
        "Rate (file)",
        "fp32 acc",
        "Acc",
        "Drop [95% CI]",
        "Val acc",
        "Wall (s)",
    ]
    body = [
        [
            r["label"],
            _comp_type(r),
            _num(r["bits"], "{:g}"),
            _num(100 * r["nonzero"], "{:.1f}"),
            _num(r["rate_paper"], "{:.1f}×"),
            _num(r["rate_file"], "{:.1f}×"),
            _num(r["fp32_acc"]),
            _num(r["acc"]),
            _drop(r),
            _num(r["val_acc"]),
            _num(r["wall_time_s"], "{:.0f}"),
        ]
        for r in primary
    ]
    return _markdown(header, body), primary


def _by_inference(group: list[dict]) -> str:
    header = [
        "Model",
        "Run",
        "Bits",
        "Non-zero (%)",
        "Prior",
        "Inference",
        "M",
        "Acc",
        "Drop [95% CI]",
        "Val acc",
    ]
    body = [
        [
            r["model"],
            r["label"],
            _num(r["bits"], "{:g}"),
            _num(100 * r["nonzero"], "{:.1f}"),
            r["prior"] or "–",
            r["inference"],
            _num(r["samples"], "{:d}"),
            _num(r["acc"]),
            _drop(r),
            _num(r["val_acc"]),
        ]
        for r in group
    ]
    return _markdown(header, body)


def _recipe_meta(recipe: str, result: dict) -> dict:
    """Title and substitute label: the packaged recipe's current ones (results of one recipe may have been
    run at different times, when its label said something else), else those stored in the result."""
    labels = _current_labels(recipe)
    return result["meta"] if labels is None else result["meta"] | dict(labels)


@functools.cache
def _current_labels(recipe: str) -> tuple[tuple[str, Any], ...] | None:
    """The packaged recipe's title and substitute (read once per process; the recipes ship with the package)."""
    try:
        current = load_recipe(recipe)
    except (FileNotFoundError, ValueError):
        return None
    return tuple((k, current[k]) for k in ("title", "substitute") if k in current)


def _section(recipe: str, results: list[dict], out_dir: Path) -> str:
    """Markdown for one recipe plus its PNG (written to ``out_dir``)."""
    first = results[0]
    kind, paper, meta = first["report"].get("kind", "flat"), first["paper"], _recipe_meta(recipe, first)
    group = [row for result in results for row in rows(result)]
    lines = [f"## {meta.get('title') or recipe}", ""]
    if meta.get("substitute"):
        lines += [f"**{meta['substitute']}**", ""]
    fp32 = {r["metrics"]["model"]: r["metrics"]["fp32_acc"] for r in results}
    fp32_text = ", ".join(f"{model} {acc:.2f}%" for model, acc in sorted(fp32.items()))
    lines += [
        f"Tier `{first['tier']}`, {first['metrics']['test_images']} test images, fp32 accuracy {fp32_text}; "
        "drops in points with paired bootstrap 95% intervals.",
        "",
    ]
    fig, ax = plt.subplots(figsize=(6, 4))
    if kind == "table1":
        table, primary = _table1(group)
        plot_table1(ax, primary, paper)
    else:
        table = _by_inference(group)
        if kind == "samples":
            plot_samples(ax, group, paper)
        elif kind == "variants":
            plot_variants(ax, [r for r in group if r["primary"]])
        elif kind == "greedy_vs_bayes":
            plot_series(ax, [dict(r, K=2 ** r["bits"]) for r in group], "K", "inference", "K (components)")
            ax.set_xscale("log", base=2)
        else:
            plot_series(ax, [r for r in group if r["primary"]], "nonzero", "prior", "non-zero rate")
    ax.set_ylabel("top-1 accuracy drop (points)")
    ax.set_title(meta.get("title") or recipe, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    png, buffer = out_dir / f"{recipe}.png", io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    write_atomic(png, buffer.getvalue())
    lines += [table, "", _paper_table(paper), "", f"![{recipe}]({png.name})", ""]
    return "\n".join(lines)


_TABLE1_KEYS = (
    "model",
    "method",
    "bits",
    "nonzero",
    "compression_rate_paper",
    "compression_rate_file",
    "fp32_acc",
    "acc",
    "drop",
    "drop_ci",
    "inference",
    "val_acc",
    "test_images",
)


def summaries(results: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Table 1 summary, ablations summary): machine-readable rows made from the result files only.

    Table 1: one row per (model, method) with the keys of :data:`_TABLE1_KEYS` plus wall time, run id and
    label, and the paper's reported rows per recipe. Ablations: per recipe, its title, the substitute
    label and one row per evaluation (greedy and each M for SQS)."""
    machines = sorted({json.dumps(r["machine"], sort_keys=True) for r in results})
    common = {
        "git_commits": sorted({str(r["git_commit"]) for r in results}),
        "machines": [json.loads(m) for m in machines],
    }
    table1 = [r for r in results if r["report"].get("kind") == "table1"]
    table1_rows = [
        {k: r["metrics"].get(k) for k in _TABLE1_KEYS}
        | {"wall_time_s": r["wall_time_s"], "run_id": r["run_id"], "label": r["label"], "tier": r["tier"]}
        for r in table1
    ]
    paper = {r["recipe"]: r["paper"] for r in table1}
    ablations: dict[str, Any] = {}
    for r in results:
        if r["report"].get("kind") == "table1":
            continue
        meta = _recipe_meta(r["recipe"], r)
        entry = ablations.setdefault(
            r["recipe"], {"title": meta.get("title"), "substitute": meta.get("substitute"), "rows": []}
        )
        entry["rows"] += [row | {"run_id": r["run_id"]} for row in rows(r)]
        entry["paper"] = r["paper"]
    return common | {"rows": table1_rows, "paper": paper}, common | {"ablations": ablations}


_PREFIX = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


def _check_prefix(prefix: Any) -> None:
    """A ValueError unless ``prefix`` names a file inside the output folder (no separator, not hidden)."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ValueError(
            f"prefix must be a plain file name (letters, digits, '.', '_', '-', not starting with '.'), got {prefix!r}"
        )


def _machine_line(results: list[dict[str, Any]]) -> str:
    """The machine of the results; every distinct one, with its thread count and result count, when several
    computed them (the first result's machine alone was printed for all)."""
    keys = ("platform", "cpu_count", "torch", "torch_threads")
    counts = Counter(tuple(r["machine"].get(k) for k in keys) for r in results)
    if len(counts) == 1:
        machine = results[0]["machine"]
        return f"Machine: {machine['platform']}, {machine['cpu_count']} CPUs, torch {machine['torch']}."
    listed = "; ".join(
        f"{platform}, {cpus} CPUs, torch {torch}, {'?' if threads is None else threads} torch thread(s) ({n} results)"
        for (platform, cpus, torch, threads), n in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))
    )
    return f"Machines ({len(counts)}, the rows of one table may come from different ones): {listed}."


def _summary_names(prefix: str) -> tuple[str, str]:
    return f"{prefix}.json", f"{prefix}_ablations.json"


def _refuse_overwriting_results(out: Path, prefix: str) -> None:
    """A ValueError if a summary ``<prefix>*.json`` would replace a result file (``--prefix`` set to a run id)."""
    for name in _summary_names(prefix):
        if is_result_file(out / name):
            raise ValueError(
                f"prefix {prefix!r} would overwrite the result file {out / name} with a summary; choose another"
            )


_PNG_LINK = re.compile(r"!\[[^\]]*\]\(([A-Za-z0-9_][A-Za-z0-9._-]*\.png)\)")


def _remove_stale(out: Path, earlier_pngs: set[str], written: set[str], prefix: str) -> None:
    """Remove what an earlier report in ``out`` wrote that this one does not rewrite: the PNGs its report.md
    linked and this prefix's summaries (only summaries: never a result or any other file)."""
    stale = [out / name for name in sorted(earlier_pngs - written) if (out / name).is_file()]
    for name in _summary_names(prefix):
        path = out / name
        if name not in written and path.is_file() and not is_result_file(path) and _is_summary(path):
            stale.append(path)
    for path in stale:
        path.unlink()
        logger.info("removed %s, left by an earlier report", path)


def _is_summary(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and {"git_commits", "machines"} <= set(data)


def build_report(results_dir: str | Path, out_dir: str | Path | None = None, *, prefix: str = "results") -> Path:
    """Write ``report.md``, one PNG per recipe, ``<prefix>.json`` (Table 1 rows) and
    ``<prefix>_ablations.json`` into ``out_dir`` (default: ``results_dir``); ``prefix`` is a plain file name
    (letters, digits, ``.``, ``_``, ``-``; not starting with ``.``), checked before anything is read or written,
    and refused if a summary would replace a result file. What an earlier report left in ``out_dir`` and this
    one does not rewrite (its PNGs, this prefix's summaries) is removed."""
    _check_prefix(prefix)
    results = load_results(results_dir)
    out = out_dir_path(out_dir if out_dir is not None else results_dir)
    _refuse_overwriting_results(out, prefix)
    out = prepare_out_dir(out)
    earlier = out / "report.md"
    earlier_pngs = set(_PNG_LINK.findall(earlier.read_text(errors="replace"))) if earlier.is_file() else set()
    by_recipe: dict[str, list[dict]] = defaultdict(list)
    for result in results:
        by_recipe[result["recipe"]].append(result)
    commits = sorted({str(r["git_commit"]) for r in results})
    parts = ["# SQS benchmark results", "", f"Commit(s): {', '.join(commits)}. {_machine_line(results)}", ""]
    parts += [_section(recipe, group, out) for recipe, group in sorted(by_recipe.items())]
    path = out / "report.md"
    write_atomic(path, "\n".join(parts))
    written = {f"{recipe}.png" for recipe in by_recipe}
    table1, ablations = summaries(results)
    # allow_nan=False: a bare NaN is not JSON (the loaded results were checked finite already)
    for name, summary, has_rows in zip(
        _summary_names(prefix), (table1, ablations), (table1["rows"], ablations["ablations"]), strict=True
    ):
        if has_rows:
            write_atomic(out / name, json.dumps(summary, indent=1, allow_nan=False) + "\n")
            written.add(name)
    _remove_stale(out, earlier_pngs, written, prefix)
    logger.info("wrote %s (%d results)", path, len(results))
    return path
