"""Hellinger convergence study on synthetic sparse-quantized ReLU regression (issue 4, item 5).

For each n on a geometric grid and each seed: data from the teacher f0 in H(T, s, K) (:mod:`synthetic`), a
full-precision least-squares fit θ, then sqs-core's variational posterior q̂ (:mod:`student`), whose squared
Hellinger risk is estimated under every distribution the paper uses for θ̃ (:mod:`risk`), with support and
level recovery (:mod:`recovery`). The slope of log d² against log n is compared with the Theorem's rate
ε_n*² = r_n* log^{2δ} n (n^{-1} up to logs) and with the parametric k/(8n).

Variants (``prior``, ``init``): the study is (spike_slab, projection); (gaussian, projection) is the
Gaussian-prior ablation of the appendix, and (spike_slab, default) runs sqs-core's defaults as shipped.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import sqs_core as sqs
import torch
from sqs_core import keep_top_fraction
from torch import nn

from . import _validate as check
from ._io import check_output_dir, write_files_atomic
from ._json import jsonable
from .hellinger import fit_slope, hellinger_sq
from .hspace import in_h
from .plots import render_convergence
from .projection import canonicalize_
from .provenance import machine_info
from .rates import eps_n
from .recovery import recovery
from .risk import predict, risk_summary
from .student import StudentSpec, fit_student
from .summary import ESTIMATORS, bootstrap_interval, per_n_summary, slopes
from .synthetic import (
    LEVELS,
    FullPrecisionFit,
    fit_full_precision,
    layers,
    make_teacher,
    sample_data,
    teacher_theta,
    training_nll,
)
from .tiers import MAX_THREADS, MIN_N, TIER_VERSION, TIERS, Tier, check_threads, get_tier, torch_seed_of

__all__ = [
    "ESTIMATORS",
    "MAX_THREADS",
    "TIERS",
    "TIER_VERSION",
    "Tier",
    "fit_point",
    "machine_info",
    "run_study",
    "theory_reference",
    "write_study",
]

log = logging.getLogger(__name__)

THEORY_SLOPE = -1.0  # ε_n² ∝ r_n log^{2δ} n with r_n ~ (s/n)·log terms
MAIN = ("spike_slab", "projection", "moment_matched")


def _variants(tier: Tier, n: int) -> list[StudentSpec]:
    """The study's variant at every n; the prior × likelihood ablation and sqs-core's defaults where asked."""
    keys = [MAIN]
    if n in tier.ablation_ns:
        keys += [("spike_slab", "projection", "plugin"), ("gaussian", "projection", "moment_matched"),
                 ("gaussian", "projection", "plugin")]  # fmt: skip
    if n in tier.default_ns:
        keys.append(("spike_slab", "default", "plugin"))
    return [
        StudentSpec(prior=p, init=i, likelihood=lik, steps=tier.steps, quant_lr=tier.quant_lr, gate_lr=tier.gate_lr,
                    gate_logit=tier.gate_logit, delta=tier.delta, B=max(abs(v) for v in LEVELS))
        for p, i, lik in keys
    ]  # fmt: skip


@torch.no_grad()
def _gate_diagnostics(model, canonical, density: float) -> dict:
    """Extreme gate logits s̃/τ' of kept / pruned weights at the end, and whether the kept set is still the
    support the projection started from (the ELBO could have moved it)."""
    posts = sqs.posteriors(model)
    logits = torch.cat([(p.gate_logits / p.gate_temperature).reshape(-1) for p in posts.values()])
    mask = torch.cat([p.mask.reshape(-1) for p in posts.values()])
    start = keep_top_fraction({str(i): layer.weight.abs() for i, layer in enumerate(layers(canonical))}, density)
    initial = torch.cat([m.reshape(-1) for m in start.values()])
    return {
        "gate_logit_kept_min": float(logits[mask].min()) if mask.any() else None,
        "gate_logit_pruned_max": float(logits[~mask].max()) if (~mask).any() else None,
        "support_kept_from_init": bool(torch.equal(mask, initial)),
    }


def _fixed_weights(model) -> tuple[np.ndarray, np.ndarray]:
    layers = sqs.sqs_layers(model)
    weights = [layers[name].fixed_weight for name in ("0", "2")]
    if weights[0] is None or weights[1] is None:
        raise RuntimeError("internal: the student's layers hold no fixed weight (greedy_/sample_ not applied)")
    return weights[0].numpy().copy(), weights[1].numpy().copy()


@contextmanager
def _naming(n: int, seed: int, what: str) -> Iterator[None]:
    """Add which fit failed to a ValueError or FloatingPointError (sqs-core's for a non-finite posterior): a
    diverged fit had aborted a study of hours without saying which (n, seed, variant) it was."""
    try:
        yield
    except (ValueError, FloatingPointError) as err:
        kind = FloatingPointError if isinstance(err, FloatingPointError) else ValueError
        raise kind(f"{err} (at n={n}, seed={seed}, {what})") from err


@dataclass(frozen=True)
class _Shared:
    """What the variants at one (n, seed) share: the data, the test sample and the full-precision fit."""

    teacher: nn.Module
    x: torch.Tensor  # (n, p)
    y: torch.Tensor  # (n, 1)
    x_test: torch.Tensor  # (n_test, p)
    f0: np.ndarray  # (n_test,)
    density: float
    gen: torch.Generator
    torch_seed: int
    fp: FullPrecisionFit
    h_fp: float
    canonical: nn.Module
    canon_nll: float
    fp_time: float


def _shared(tier: Tier, n: int, seed: int, torch_seed: int) -> _Shared:
    teacher = make_teacher(tier.p, tier.width, seed=tier.teacher_seed)
    theta0 = teacher_theta(teacher)
    density = float(np.count_nonzero(theta0)) / theta0.size
    gen = torch.Generator().manual_seed(torch_seed)
    x, y = sample_data(teacher, n, tier.sigma, gen)
    x_test = torch.rand(tier.n_test, tier.p, generator=torch.Generator().manual_seed(tier.test_seed))
    f0 = predict(teacher, x_test)
    start = time.perf_counter()
    fp = fit_full_precision(
        teacher, x, y, sigma=tier.sigma, init_noise=tier.init_noise, restarts=tier.fp_restarts,
        max_iter=tier.fp_max_iter, generator=gen,
    )  # fmt: skip
    h_fp = hellinger_sq(predict(fp.model, x_test), f0, tier.sigma)
    canonical = copy.deepcopy(fp.model)
    canon = canonicalize_(canonical, x, y, sigma=tier.sigma, s=int(np.count_nonzero(theta0)), k=len(LEVELS),
                          starts=tier.projection_starts, seed=seed)  # fmt: skip
    return _Shared(teacher=teacher, x=x, y=y, x_test=x_test, f0=f0, density=density, gen=gen, torch_seed=torch_seed,
                   fp=fp, h_fp=h_fp, canonical=canonical, canon_nll=canon.nll,
                   fp_time=time.perf_counter() - start)  # fmt: skip


def _fit_variant(tier: Tier, spec: StudentSpec, d: _Shared) -> dict:
    """One SQS fit from the shared full-precision fit: its risks, gate diagnostics and recovery."""
    start = time.perf_counter()
    torch.manual_seed(d.torch_seed)  # the moment-matched forward draws from torch's global generator
    base = d.canonical if spec.init == "projection" else d.fp.model
    model = fit_student(base, d.x, d.y, sigma=tier.sigma, density=d.density, spec=spec)
    risk = risk_summary(model, d.x_test, d.f0, sigma=tier.sigma, density=d.density, draws=tier.draws,
                        generator=d.gen)  # fmt: skip
    gates = _gate_diagnostics(model, d.canonical, d.density)
    sqs.greedy_(model, nonzero=d.density)
    greedy_w1, greedy_w2 = _fixed_weights(model)
    t_first, t_last = layers(d.teacher)
    rec = recovery(t_first.weight.numpy(), t_last.weight.numpy(), greedy_w1, greedy_w2, levels=LEVELS)
    return {
        "variant": spec.key, "prior": spec.prior, "init": spec.init,
        "likelihood": spec.likelihood, **risk, "hellinger_sq_fp": d.h_fp,
        "fp_nll": d.fp.nll, "fp_restart_nlls": list(d.fp.restart_nlls), "projection_nll": d.canon_nll,
        "greedy_train_nll": training_nll(model, d.x, d.y, tier.sigma), **gates, **rec,
        "greedy_W1": greedy_w1.tolist(), "greedy_W2": greedy_w2.tolist(),
        "wall_s": time.perf_counter() - start + d.fp_time,
    }  # fmt: skip


@check.arguments(n=functools.partial(check.count, low=MIN_N), seed="seed")
def fit_point(tier: Tier | str, n: int, seed: int) -> list[dict]:
    """Every variant of ``tier`` (a Tier or a name in TIERS) at (n, seed): one full-precision fit, then one SQS
    fit per variant; n >= 8 and seed >= 0 integers. A fit that fails (a ValueError, or sqs-core's
    FloatingPointError for a non-finite posterior) raises that error naming n, seed and the variant."""
    tier = get_tier(tier)
    with check.within("fit_point"):
        torch_seed = torch_seed_of(n, seed)
    with _naming(n, seed, "the full-precision fit"):
        shared = _shared(tier, n, seed, torch_seed)
    points = []
    for spec in _variants(tier, n):
        with _naming(n, seed, f"variant {spec.key}"):
            point = {"n": n, "seed": seed, **_fit_variant(tier, spec, shared)}
        points.append(point)
        log.info("n=%d seed=%d %s: d2_q=%.3g d2_avg=%.3g", n, seed, spec.key, point["hellinger_sq"],
                 point["hellinger_sq_avg"])  # fmt: skip
    return points


@check.arguments(s="positive", k_sqs="count")
def theory_reference(tier: Tier | str, s: int, k_sqs: int) -> dict:
    """ε_n*² of the Theorem on the tier's grid (L = 1, N = width, δ) and its log-log slope there; s > 0, k_sqs
    (the free parameters of the parametric reference) >= 1."""
    tier = get_tier(tier)
    T = tier.width * (tier.p + 1)
    eps_sq = [eps_n(n, 1, tier.width, s, tier.p, tier.delta) ** 2 for n in tier.ns]
    bound = fit_slope(tier.ns, eps_sq) if len(tier.ns) >= 3 else None
    return {
        "theory_slope": THEORY_SLOPE,
        "rate": "eps_n*^2 = r_n* log^{2 delta} n, r_n* = ((L+1) s/n) log N + (s/n) log(p sqrt(n/s))",
        "delta": tier.delta,
        "eps_n_sq": eps_sq,
        "eps_n_sq_slope_on_grid": bound["slope"] if bound else None,
        "parametric": {"formula": "k/(8n)", "k_sqs": k_sqs, "k_fp": T - tier.width},
    }


def _optimizer_check(tier: Tier, points: list[dict]) -> list[dict]:
    """Refit the study variant with check_factor × steps: is the reported risk the optimiser's limit?"""
    longer = replace(tier, steps=tier.steps * tier.check_factor, ablation_ns=(), default_ns=())
    out = []
    for n in tier.check_ns:
        seed = tier.seeds[0]
        base = next(q for q in points if q["n"] == n and q["seed"] == seed and q["variant"] == "/".join(MAIN))
        again = fit_point(longer, n, seed)[0]
        out.append({"n": n, "seed": seed, "steps": longer.steps, "hellinger_sq": again["hellinger_sq"],
                    "hellinger_sq_at_tier_steps": base["hellinger_sq"],
                    "relative_change": again["hellinger_sq"] / base["hellinger_sq"] - 1.0})  # fmt: skip
    return out


def run_study(tier: Tier | str) -> dict:
    """Every fit of ``tier``; the slope of E_q̂ d² against n for the study variant, with 95% CIs."""
    tier = get_tier(tier)
    start = time.perf_counter()
    points = [q for n in tier.ns for seed in tier.seeds for q in fit_point(tier, n, seed)]
    theta0 = teacher_theta(make_teacher(tier.p, tier.width, seed=tier.teacher_seed))
    s = int(np.count_nonzero(theta0))
    w1, w2 = theta0[: tier.width * tier.p], theta0[tier.width * tier.p :]
    k_sqs = len(np.unique(w1[w1 != 0])) + len(np.unique(w2[w2 != 0])) - 1  # minus the rescaling direction
    fits = slopes(points)
    main = fits["/".join(MAIN)]["hellinger_sq"]
    main_pts = [q for q in points if q["variant"] == "/".join(MAIN)]
    return {
        "tier": tier.name,
        "config": tier.to_dict(),
        "seeds": list(tier.seeds),
        "teacher": {
            "T": int(theta0.size), "s": s, "K": len(LEVELS), "levels": list(LEVELS),
            "in_h": in_h(theta0, s=s, K=len(LEVELS), B=max(abs(v) for v in LEVELS)),
            "W1": w1.reshape(tier.width, tier.p).tolist(), "W2": w2.tolist(),
        },
        "points": points,
        "slope": main["slope"] if main else None,
        "slope_ci": main["slope_ci"] if main else None,
        "slope_ci_bootstrap": bootstrap_interval(main_pts),
        "main_variant": "/".join(MAIN),
        "slopes": fits,
        "summary": per_n_summary(main_pts),
        "theory": theory_reference(tier, s, k_sqs),
        "optimizer_check": _optimizer_check(tier, points),
        "wall_time_s": time.perf_counter() - start,
    }  # fmt: skip


def _write_files(out_dir: Path, result: dict) -> tuple[Path, Path]:
    """The JSON and its figure, the figure drawn in memory first: a figure that cannot be drawn or written
    leaves both files as they were (the JSON had been replaced before the PNG failed)."""
    text = json.dumps(jsonable(result), indent=1, allow_nan=False) + "\n"
    png = render_convergence(json.loads(text))
    json_path, png_path = out_dir / "convergence.json", out_dir / "convergence.png"
    write_files_atomic({png_path: png, json_path: text})
    return json_path, png_path


def write_study(tier: Tier | str, out_dir: Path | str, *, threads: int = 1) -> tuple[Path, Path]:
    """Run ``tier`` with ``1 <= threads <= MAX_THREADS`` torch threads; write ``convergence.json`` and
    ``convergence.png`` in ``out_dir``.

    The arguments and ``out_dir`` are checked before the study runs (each file's folder is probed with a new
    empty file); both files are replaced atomically, after the figure is drawn. The results are
    bit-reproducible only on the same CPU with the same ``threads`` (see :mod:`provenance`).
    """
    tier, threads = get_tier(tier), check_threads("threads", threads)
    out_dir = check_output_dir(out_dir, name="out_dir", files=("convergence.json", "convergence.png"))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)  # tiny models: threads only add overhead (and the machine is shared)
    try:
        started = datetime.now(UTC).isoformat(timespec="seconds")
        result = {**run_study(tier), "started_utc": started, "machine": machine_info()}
    finally:
        torch.set_num_threads(previous)
    return _write_files(out_dir, result)
