"""The generated parts of ``docs/theory.md``: the verdict table, the errata table and the convergence tables.

Each part stands between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``. ``python -m sqs_theory
docs`` rewrites them from the checks, the errata and the committed ``convergence.json``; ``--check`` reports
a difference instead (a test runs it, so the committed document cannot drift from what the code computes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from .checks import all_verdicts
from .errata import Erratum, build_errata
from .hellinger import parametric_reference
from .verdict import Verdict, format_markdown, markdown_cell

__all__ = ["BLOCKS", "convergence_block", "errata_block", "generated_blocks", "render", "verdict_block"]

BLOCKS = ("verdicts", "errata", "convergence")
_MARK = re.compile(r"(<!-- generated:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)", re.S)


def _g(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{digits}g}"


def _ci(fit: Mapping | None) -> str:
    if not fit:
        return "–"
    lo, hi = fit["slope_ci"]
    return f"{fit['slope']:.2f} [{lo:.2f}, {hi:.2f}]"


def verdict_block(verdicts: Sequence[Verdict]) -> str:
    return format_markdown(verdicts) + "\n"


def errata_block(errata: Sequence[Erratum]) -> str:
    lines = ["| id | severity | one line |", "| --- | --- | --- |"]
    lines += [f"| {e.id} | {e.severity} | {markdown_cell(e.summary)} |" for e in errata]
    return "\n".join(lines) + "\n"


def _setup_table(result: Mapping) -> list[str]:
    cfg, machine, teacher = result["config"], result["machine"], result["teacher"]
    theory = result["theory"]
    rows = [
        ("tier", result["tier"]),
        ("n grid", ", ".join(str(n) for n in cfg["ns"])),
        ("seeds per n", str(len(result["seeds"]))),
        (
            "teacher",
            f"p={cfg['p']}, width={cfg['width']}, T={teacher['T']}, s={teacher['s']}, "
            f"K={teacher['K']}, levels {teacher['levels']}, σ={cfg['sigma']}",
        ),
        ("SQS steps / M draws / test x", f"{cfg['steps']} / {cfg['draws']} / {cfg['n_test']}"),
        ("λ (Theorem, δ)", f"δ = {theory['delta']}"),
        ("parametric k (SQS levels, FP)", f"{theory['parametric']['k_sqs']}, {theory['parametric']['k_fp']}"),
        (
            "wall time, one thread",
            f"{result['wall_time_s'] / 60:.1f} min ({machine['processor']}, "
            f"{machine['cpu_count']} cores, torch {machine['torch']})",
        ),
    ]
    return ["| setting | value |", "| --- | --- |", *[f"| {k} | {v} |" for k, v in rows]]


def _per_n_table(result: Mapping) -> list[str]:
    k = result["theory"]["parametric"]["k_sqs"]
    head = "| n | fits | median ∫d² dq̂ | IQR | n × median | k/(8n) | local slope | median d² FP | support exact | mean FP | level acc. |"  # noqa: E501
    lines = [head, "|" + " --- |" * 11]
    for r in result["summary"]:
        parametric = float(parametric_reference(k, r["n"]))
        lines.append(
            f"| {r['n']} | {r['fits']} | {_g(r['median'])} | {_g(r['q25'])}–{_g(r['q75'])} | {_g(r['n_times_median'])} "
            f"| {_g(parametric)} | {_g(r.get('local_slope'), 2)} | {_g(r['median_fp'])} "
            f"| {r['support_exact']:.2f} | {r['false_positive_mean']:.2f} | {r['level_accuracy_mean']:.2f} |"
        )
    return lines


_ESTIMATOR_NAMES = {
    "hellinger_sq": "∫ d² dq̂ (Theorem)",
    "hellinger_sq_avg": "at θ^avg",
    "hellinger_sq_sampled": "discrete inference distribution",
    "hellinger_sq_bma": "Bayesian average (M draws)",
    "hellinger_sq_greedy": "greedy",
    "hellinger_sq_fp": "full-precision fit",
}


def _slope_table(result: Mapping) -> list[str]:
    fits = result["slopes"][result["main_variant"]]
    lines = ["| estimator | slope [95% t-CI] | R² |", "| --- | --- | --- |"]
    for key, name in _ESTIMATOR_NAMES.items():
        lines.append(f"| {name} | {_ci(fits.get(key))} | {_g(fits[key]['r2'], 3) if fits.get(key) else '–'} |")
    boot = result.get("slope_ci_bootstrap")
    theory = result["theory"]
    lines += [
        "",
        f"Bootstrap 95% interval of the ∫ d² dq̂ slope (fits resampled within each n): "
        f"[{_g(boot[0], 3)}, {_g(boot[1], 3)}]."
        if boot
        else "",
        f"Theory: ε_n² ∝ n^{{{theory['theory_slope']:g}}} up to log factors; the bound ε_n*² itself has slope "
        f"{_g(theory['eps_n_sq_slope_on_grid'], 3)} on this n grid (its log^{{2δ}} n factor flattens it).",
    ]
    return lines


def _ablation_table(result: Mapping) -> list[str]:
    variants = sorted({q["variant"] for q in result["points"]})
    ns = sorted({q["n"] for q in result["points"] if q["variant"] != result["main_variant"]})
    if not ns:
        return []
    lines = ["| variant (prior/init/likelihood) | estimator | " + " | ".join(f"n={n}" for n in ns) + " |",
             "| --- | --- |" + " --- |" * len(ns)]  # fmt: skip
    for variant in variants:
        for key in ("hellinger_sq", "hellinger_sq_avg", "hellinger_sq_greedy"):
            cells = []
            for n in ns:
                at = [q[key] for q in result["points"] if q["variant"] == variant and q["n"] == n]
                cells.append(_g(float(np.median(at))) if at else "–")
            lines.append(f"| {variant} | median {_ESTIMATOR_NAMES[key]} | " + " | ".join(cells) + " |")
    return lines


def _diagnostics(result: Mapping) -> list[str]:
    main = [q for q in result["points"] if q["variant"] == result["main_variant"]]
    x_se = max(q["hellinger_sq_x_se"] / q["hellinger_sq_avg"] for q in main)
    q_se = max(q["hellinger_sq_se"] / q["hellinger_sq"] for q in main)
    keys = ("hellinger_sq", "hellinger_sq_avg", "hellinger_sq_sampled", "hellinger_sq_bma", "hellinger_sq_greedy")
    spread = max((max(q[k] for k in keys) - min(q[k] for k in keys)) / q["hellinger_sq"] for q in main)
    kept = np.mean([q["support_kept_from_init"] for q in main])
    rows = [
        ("largest Monte Carlo s.e. of the x-average, relative to d² at θ^avg", f"{x_se:.2%}"),
        ("largest Monte Carlo s.e. of the M-draw average ∫d² dq̂, relative", f"{q_se:.2%}"),
        ("largest spread of the five estimators of a fit, relative to ∫d² dq̂", f"{spread:.2%}"),
        ("fits whose final support is the projection's", f"{kept:.0%}"),
        ("smallest kept / largest pruned gate logit s̃/τ' at the end",
         f"{min(q['gate_logit_kept_min'] for q in main):.3g} / {max(q['gate_logit_pruned_max'] for q in main):.3g}"),
    ]  # fmt: skip
    return ["| diagnostic (study variant, all fits) | value |", "| --- | --- |", *[f"| {k} | {v} |" for k, v in rows]]


def _optimizer_table(result: Mapping) -> list[str]:
    rows = result.get("optimizer_check") or []
    if not rows:
        return []
    lines = ["| n | seed | steps | ∫d² dq̂ at the tier's steps | at ×steps | relative change |", "|" + " --- |" * 6]
    for r in rows:
        lines.append(f"| {r['n']} | {r['seed']} | {r['steps']} | {_g(r['hellinger_sq_at_tier_steps'])} "
                     f"| {_g(r['hellinger_sq'])} | {r['relative_change']:+.2%} |")  # fmt: skip
    return lines


def convergence_block(result: Mapping) -> str:
    """The tables of §7 from the study's JSON: setup, per-n summary, slopes, ablations, optimiser check."""
    parts = (
        ("**Setup.**", _setup_table(result)),
        ("**Study variant, per n** (medians over seeds).", _per_n_table(result)),
        ("**Slopes** (OLS of log d² on log n over all fits of the study variant).", _slope_table(result)),
        ("**Diagnostics.**", _diagnostics(result)),
        ("**Ablations** (medians over seeds).", _ablation_table(result)),
        ("**Optimiser check.**", _optimizer_table(result)),
    )
    out = []
    for title, lines in parts:
        if lines:
            out += [title, "", *lines, ""]
    return "\n".join(out)


def generated_blocks(convergence: Mapping | None, *, n_random: int = 20, seed: int = 0) -> dict[str, str]:
    """Every generated block; the convergence block only when a result is given."""
    blocks = {
        "verdicts": verdict_block(all_verdicts(n_random=n_random, seed=seed)),
        "errata": errata_block(build_errata()),
    }
    if convergence is not None:
        blocks["convergence"] = convergence_block(convergence)
    return blocks


def render(text: str, blocks: Mapping[str, str]) -> str:
    """``text`` with every generated block named in ``blocks`` replaced; each must have its markers."""
    found = {m.group("name") for m in _MARK.finditer(text)}
    missing = set(blocks) - found
    if missing:
        raise ValueError(f"no <!-- generated:NAME --> markers for {sorted(missing)} in the document")
    return _MARK.sub(lambda m: m.group(1) + blocks.get(m.group("name"), m.group("body")) + m.group(4), text)
