"""The generated parts of ``docs/theory.md``: the verdict table, the errata table and the convergence tables.

Each part stands between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``. ``python -m sqs_theory
docs`` rewrites them from the checks, the errata and the committed ``convergence.json``; ``--check`` reports
a difference instead (a test runs it, so the committed document cannot drift from what the code computes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .checks import all_verdicts
from .errata import Erratum, build_errata
from .hellinger import parametric_reference
from .verdict import Verdict, format_markdown, markdown_cell

__all__ = [
    "BLOCKS",
    "check_convergence_result",
    "convergence_block",
    "errata_block",
    "generated_blocks",
    "render",
    "verdict_block",
]

BLOCKS = ("verdicts", "errata", "convergence")
_MARK = re.compile(r"(<!-- generated:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)", re.S)


def _g(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{digits}g}"


def _f(x: float | None, spec: str = ".2f") -> str:
    """``x`` in ``spec``, or – for a null (a mean over no defined value) or a non-finite value."""
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, spec)


# The keys each table reads: a JSON of another shape is a ValueError naming the key, not a TypeError.
_REQUIRED: dict[str, tuple[str, ...]] = {
    "": ("tier", "config", "seeds", "machine", "teacher", "theory", "summary", "slopes", "main_variant", "points",
         "wall_time_s"),
    "config": ("ns", "p", "width", "sigma", "steps", "draws", "n_test"),
    "machine": ("processor", "cpu_count", "torch"),
    "teacher": ("T", "s", "K", "levels"),
    "theory": ("delta", "parametric", "theory_slope", "eps_n_sq_slope_on_grid"),
    "theory.parametric": ("k_sqs", "k_fp"),
}  # fmt: skip
_SUMMARY_KEYS = ("n", "fits", "median", "q25", "q75", "n_times_median", "median_fp", "support_exact",
                 "false_positive_mean", "level_accuracy_mean")  # fmt: skip
_POINT_KEYS = ("n", "variant", "hellinger_sq", "hellinger_sq_avg", "hellinger_sq_sampled", "hellinger_sq_bma",
               "hellinger_sq_greedy", "hellinger_sq_x_se", "hellinger_sq_se", "support_kept_from_init",
               "gate_logit_kept_min", "gate_logit_pruned_max")  # fmt: skip


def _records(result: Mapping, key: str, keys: tuple[str, ...]) -> None:
    rows = result[key]
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{key!r} must be a non-empty list, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        missing = [k for k in keys if not isinstance(row, Mapping) or k not in row]
        if missing:
            raise ValueError(f"{key}[{i}] has no key {missing[0]!r}")


def check_convergence_result(result: Any) -> Mapping:
    """``result`` if it has every key the convergence tables read (a ValueError naming the first missing one)."""
    if not isinstance(result, Mapping):
        raise ValueError(f"the result must be a JSON object, got {type(result).__name__}")
    for where, keys in _REQUIRED.items():  # parents before children
        node = result
        for part in filter(None, where.split(".")):
            node = node[part]
        if not isinstance(node, Mapping):
            raise ValueError(f"{where!r} must be a JSON object, got {type(node).__name__}")
        for k in keys:
            if k not in node:
                raise ValueError(f"no key {'.'.join(filter(None, (where, k)))!r}")
    _records(result, "summary", _SUMMARY_KEYS)
    _records(result, "points", _POINT_KEYS)
    if not isinstance(result["slopes"], Mapping) or result["main_variant"] not in result["slopes"]:
        raise ValueError(f"slopes has no entry for the main_variant {result['main_variant']!r}")
    if not any(q["variant"] == result["main_variant"] for q in result["points"]):
        raise ValueError(f"no point of the main_variant {result['main_variant']!r}")
    return result


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
    theory, threads = result["theory"], machine.get("torch_threads", 1)
    minutes = None if result["wall_time_s"] is None else result["wall_time_s"] / 60
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
            "wall time, one thread" if threads == 1 else f"wall time, {threads} threads",
            f"{_f(minutes, '.1f')} min ({machine.get('cpu_model') or machine['processor']}, "
            f"{machine['cpu_count']} cores, torch {machine['torch']})",
        ),
    ]
    return ["| setting | value |", "| --- | --- |", *[f"| {k} | {v} |" for k, v in rows]]


def _level_accuracy(row: Mapping) -> str:
    """The mean level accuracy, and how many fits it left out (undefined: no true weight kept) when any."""
    undefined = row.get("level_accuracy_undefined") or 0
    return _f(row["level_accuracy_mean"]) + (f" ({undefined} of {row['fits']} undefined)" if undefined else "")


def _per_n_table(result: Mapping) -> list[str]:
    k = result["theory"]["parametric"]["k_sqs"]
    head = "| n | fits | median ∫d² dq̂ | IQR | n × median | k/(8n) | local slope | median d² FP | support exact | mean FP | level acc. |"  # noqa: E501
    lines = [head, "|" + " --- |" * 11]
    for r in result["summary"]:
        parametric = float(parametric_reference(k, r["n"]))
        lines.append(
            f"| {r['n']} | {r['fits']} | {_g(r['median'])} | {_g(r['q25'])}–{_g(r['q75'])} | {_g(r['n_times_median'])} "
            f"| {_g(parametric)} | {_g(r.get('local_slope'), 2)} | {_g(r['median_fp'])} "
            f"| {_f(r['support_exact'])} | {_f(r['false_positive_mean'])} | {_level_accuracy(r)} |"
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
        f"Theory: ε_n² ∝ n^{{{_g(theory['theory_slope'])}}} up to log factors; the bound ε_n*² itself has slope "
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
                at = [q[key] for q in result["points"] if q["variant"] == variant and q["n"] == n
                      and q.get(key) is not None]  # fmt: skip
                cells.append(_g(float(np.median(at))) if at else "–")
            lines.append(f"| {variant} | median {_ESTIMATOR_NAMES[key]} | " + " | ".join(cells) + " |")
    return lines


def _largest(values: Sequence[float | None], spec: str, *, smallest: bool = False) -> str:
    """The largest (or smallest) of the defined values in ``spec``; – if none is (nulls in the JSON: a NaN
    standard error of one draw, no kept or no pruned gate)."""
    defined = [v for v in values if v is not None and np.isfinite(v)]
    return _f((min if smallest else max)(defined), spec) if defined else "–"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _diagnostics(result: Mapping) -> list[str]:
    main = [q for q in result["points"] if q["variant"] == result["main_variant"]]
    keys = ("hellinger_sq", "hellinger_sq_avg", "hellinger_sq_sampled", "hellinger_sq_bma", "hellinger_sq_greedy")
    spread = [_ratio(max(q[k] for k in keys) - min(q[k] for k in keys), q["hellinger_sq"])
              if all(q[k] is not None for k in keys) else None for q in main]  # fmt: skip
    kept = np.mean([bool(q["support_kept_from_init"]) for q in main])
    gates = (f"{_largest([q['gate_logit_kept_min'] for q in main], '.3g', smallest=True)} / "
             f"{_largest([q['gate_logit_pruned_max'] for q in main], '.3g')}")  # fmt: skip
    rows = [
        ("largest Monte Carlo s.e. of the x-average, relative to d² at θ^avg",
         _largest([_ratio(q["hellinger_sq_x_se"], q["hellinger_sq_avg"]) for q in main], ".2%")),
        ("largest Monte Carlo s.e. of the M-draw average ∫d² dq̂, relative",
         _largest([_ratio(q["hellinger_sq_se"], q["hellinger_sq"]) for q in main], ".2%")),
        ("largest spread of the five estimators of a fit, relative to ∫d² dq̂", _largest(spread, ".2%")),
        ("fits whose final support is the projection's", f"{kept:.0%}"),
        ("smallest kept / largest pruned gate logit s̃/τ' at the end", gates),
    ]  # fmt: skip
    return ["| diagnostic (study variant, all fits) | value |", "| --- | --- |", *[f"| {k} | {v} |" for k, v in rows]]


def _optimizer_table(result: Mapping) -> list[str]:
    rows = result.get("optimizer_check") or []
    if not rows:
        return []
    lines = ["| n | seed | steps | ∫d² dq̂ at the tier's steps | at ×steps | relative change |", "|" + " --- |" * 6]
    for r in rows:
        lines.append(f"| {r['n']} | {r['seed']} | {r['steps']} | {_g(r['hellinger_sq_at_tier_steps'])} "
                     f"| {_g(r['hellinger_sq'])} | {_f(r['relative_change'], '+.2%')} |")  # fmt: skip
    return lines


def convergence_block(result: Mapping) -> str:
    """The tables of §7 from the study's JSON: setup, per-n summary, slopes, ablations, optimiser check (a
    ValueError naming a key the tables need that ``result`` lacks, a null shown as –)."""
    check_convergence_result(result)
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
