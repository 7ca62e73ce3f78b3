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
from dataclasses import MISSING, asdict, dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import sqs_core as sqs
import torch
from sqs_core import keep_top_fraction

from . import _validate as check
from ._io import check_output_dir, write_text_atomic
from ._json import jsonable
from .hellinger import bootstrap_slope_ci, fit_slope, hellinger_sq
from .hspace import in_h
from .plots import plot_convergence
from .projection import canonicalize_
from .rates import eps_n
from .recovery import recovery
from .risk import predict, risk_summary
from .student import StudentSpec, fit_student
from .synthetic import (
    LEVELS,
    check_teacher_shape,
    fit_full_precision,
    layers,
    make_teacher,
    sample_data,
    teacher_theta,
    training_nll,
)

__all__ = [
    "ESTIMATORS",
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

TIER_VERSION = 1
_MIN_N = 8  # the smallest n of a tier
THEORY_SLOPE = -1.0  # ε_n² ∝ r_n log^{2δ} n with r_n ~ (s/n)·log terms
ESTIMATORS = (
    "hellinger_sq",
    "hellinger_sq_avg",
    "hellinger_sq_sampled",
    "hellinger_sq_bma",
    "hellinger_sq_greedy",
    "hellinger_sq_fp",
)
MAIN = ("spike_slab", "projection", "moment_matched")


@dataclass(frozen=True, kw_only=True)
class Tier:
    """One size of the study; ``ablation_ns`` / ``default_ns``: the n at which the ablations also run."""

    name: str
    ns: tuple[int, ...]
    seeds: tuple[int, ...]
    ablation_ns: tuple[int, ...] = ()
    default_ns: tuple[int, ...] = ()
    steps: int = 500
    fp_restarts: int = 4
    fp_max_iter: int = 500
    projection_starts: int = 10
    check_ns: tuple[int, ...] = ()  # n at which seed seeds[0] is refitted with check_factor × steps
    check_factor: int = 3
    draws: int = 16  # M posterior draws
    n_test: int = 8192
    p: int = 4
    width: int = 6
    sigma: float = 0.1
    init_noise: float = 0.3
    quant_lr: float = 2e-3
    gate_lr: float = 6e-4
    gate_logit: float = 20.0
    delta: float = 1.5
    teacher_seed: int = 1234
    test_seed: int = 99
    version: int = TIER_VERSION

    def __post_init__(self) -> None:
        with check.within("Tier"):
            if not isinstance(self.name, str) or not self.name:
                raise ValueError(f"name must be a non-empty string, got {self.name!r}")
            for key in ("ns", "seeds", "ablation_ns", "default_ns", "check_ns"):
                # int(2.5) had made an n of 2; a repeated seed counted its fits twice
                object.__setattr__(
                    self, key, check.distinct_counts(key, getattr(self, key), low=0 if key == "seeds" else _MIN_N)
                )
            if not self.ns or not self.seeds:
                raise ValueError(f"need at least one n >= {_MIN_N} and one seed, got ns={self.ns}, seeds={self.seeds}")
            for key in ("ablation_ns", "default_ns", "check_ns"):  # check_ns outside ns was a StopIteration
                if not set(getattr(self, key)) <= set(self.ns):
                    raise ValueError(f"{key} must be a subset of ns={self.ns}, got {getattr(self, key)}")
            _torch_seed(max(self.ns), max(self.seeds))
            for key in ("steps", "fp_restarts", "fp_max_iter", "projection_starts", "check_factor", "draws", "n_test",
                        "p", "width"):  # fmt: skip
                object.__setattr__(self, key, check.count(key, getattr(self, key), low=1))
            check_teacher_shape(self.p, self.width)
            for key in ("sigma", "quant_lr", "gate_lr", "gate_logit", "delta"):
                check.real(key, getattr(self, key), low=0.0, strict=True)
            check.real("init_noise", self.init_noise, low=0.0)
            for key in ("teacher_seed", "test_seed"):
                object.__setattr__(self, key, check.seed(key, getattr(self, key)))
            if self.version != TIER_VERSION:
                raise ValueError(f"unsupported tier version {self.version!r} (this library: {TIER_VERSION})")

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> Tier:
        if not isinstance(data, dict):
            raise ValueError(f"a Tier dict must be a dict, got {type(data).__name__}")
        unknown = set(data) - {f.name for f in fields(cls)}
        missing = {f.name for f in fields(cls) if f.default is MISSING} - set(data)
        if unknown or missing:
            raise ValueError(f"unknown Tier fields: {sorted(unknown)}; missing: {sorted(missing)}")
        return cls(**data)


def _torch_seed(n: int, seed: int) -> int:
    """The torch seed 10 000·seed + n of a fit, which must fit in int64."""
    value = 10_000 * seed + n
    if value >= 2**63:
        raise ValueError(f"seed={seed!r} with n={n!r} makes the torch seed 10000·seed + n = {value} >= 2**63")
    return value


TIERS = {
    "tiny": Tier(name="tiny", ns=(64, 256), seeds=(0,), ablation_ns=(64,), default_ns=(64,), steps=40,
                 fp_restarts=1, fp_max_iter=100, draws=2, n_test=512),
    "quick": Tier(name="quick", ns=(64, 256, 1024, 4096), seeds=(0, 1), ablation_ns=(1024,),
                  default_ns=(1024,), steps=400, fp_restarts=3, draws=8, n_test=4096),
    "full": Tier(name="full", ns=(64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384), seeds=tuple(range(10)),
                 ablation_ns=(256, 1024, 4096, 16384), default_ns=(256, 1024, 4096, 16384),
                 check_ns=(256, 4096, 16384), steps=1000, draws=32, n_test=16384),
}  # fmt: skip


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


@check.arguments(n=functools.partial(check.count, low=_MIN_N), seed="seed")
def fit_point(tier: Tier | str, n: int, seed: int) -> list[dict]:
    """Every variant of ``tier`` (a Tier or a name in TIERS) at (n, seed): one full-precision fit, then one SQS
    fit per variant; n >= 8 and seed >= 0 integers."""
    tier = _tier(tier)
    with check.within("fit_point"):
        torch_seed = _torch_seed(n, seed)
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
    fp_time = time.perf_counter() - start
    points = []
    for spec in _variants(tier, n):
        start = time.perf_counter()
        torch.manual_seed(torch_seed)  # the moment-matched forward draws from torch's global generator
        base = canonical if spec.init == "projection" else fp.model
        model = fit_student(base, x, y, sigma=tier.sigma, density=density, spec=spec)
        risk = risk_summary(model, x_test, f0, sigma=tier.sigma, density=density, draws=tier.draws, generator=gen)
        gates = _gate_diagnostics(model, canonical, density)
        sqs.greedy_(model, nonzero=density)
        greedy_w1, greedy_w2 = _fixed_weights(model)
        t_first, t_last = layers(teacher)
        rec = recovery(t_first.weight.numpy(), t_last.weight.numpy(), greedy_w1, greedy_w2, levels=LEVELS)
        points.append({
            "n": n, "seed": seed, "variant": spec.key, "prior": spec.prior, "init": spec.init,
            "likelihood": spec.likelihood, **risk, "hellinger_sq_fp": h_fp,
            "fp_nll": fp.nll, "fp_restart_nlls": list(fp.restart_nlls), "projection_nll": canon.nll,
            "greedy_train_nll": training_nll(model, x, y, tier.sigma), **gates, **rec,
            "greedy_W1": greedy_w1.tolist(), "greedy_W2": greedy_w2.tolist(),
            "wall_s": time.perf_counter() - start + fp_time,
        })  # fmt: skip
        log.info("n=%d seed=%d %s: d2_q=%.3g d2_avg=%.3g", n, seed, spec.key, risk["hellinger_sq"],
                 risk["hellinger_sq_avg"])  # fmt: skip
    return points


def _slopes(points: list[dict]) -> dict:
    out: dict = {}
    for key in sorted({q["variant"] for q in points}):
        sel = [q for q in points if q["variant"] == key]
        ns = [q["n"] for q in sel]
        enough = len(ns) >= 3 and len(set(ns)) >= 2
        fits = {k: fit_slope(ns, [max(q[k], 1e-300) for q in sel]) if enough else None for k in ESTIMATORS}
        out[key] = fits
    return out


@check.arguments(s="positive", k_sqs="count")
def theory_reference(tier: Tier | str, s: int, k_sqs: int) -> dict:
    """ε_n*² of the Theorem on the tier's grid (L = 1, N = width, δ) and its log-log slope there; s > 0, k_sqs
    (the free parameters of the parametric reference) >= 1."""
    tier = _tier(tier)
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


def _summary(points: list[dict]) -> list[dict]:
    """Per n: quartiles of E_q̂ d², n × median, recovery rates, and the slope between consecutive medians."""
    out: list[dict] = []
    for n in sorted({q["n"] for q in points}):
        at = [q for q in points if q["n"] == n]
        h = np.array([q["hellinger_sq"] for q in at])
        out.append({
            "n": n, "fits": len(at), "median": float(np.median(h)), "q25": float(np.quantile(h, 0.25)),
            "q75": float(np.quantile(h, 0.75)), "n_times_median": float(n * np.median(h)),
            "median_fp": float(np.median([q["hellinger_sq_fp"] for q in at])),
            "support_exact": float(np.mean([q["support_exact"] for q in at])),
            "false_positive_mean": float(np.mean([q["false_positive"] for q in at])),
            "level_accuracy_mean": float(np.nanmean([q["level_accuracy"] for q in at])),
        })  # fmt: skip
        if len(out) > 1:
            prev = out[-2]
            out[-1]["local_slope"] = float(np.log(out[-1]["median"] / prev["median"]) / np.log(n / prev["n"]))
    return out


def _tier(tier: Tier | str) -> Tier:
    if isinstance(tier, Tier):
        return tier
    if isinstance(tier, str) and tier in TIERS:
        return TIERS[tier]
    raise ValueError(f"tier must be a Tier or one of {sorted(TIERS)}, got {tier!r}")


def run_study(tier: Tier | str) -> dict:
    """Every fit of ``tier``; the slope of E_q̂ d² against n for the study variant, with 95% CIs."""
    tier = _tier(tier)
    start = time.perf_counter()
    points = [q for n in tier.ns for seed in tier.seeds for q in fit_point(tier, n, seed)]
    theta0 = teacher_theta(make_teacher(tier.p, tier.width, seed=tier.teacher_seed))
    s = int(np.count_nonzero(theta0))
    w1, w2 = theta0[: tier.width * tier.p], theta0[tier.width * tier.p :]
    k_sqs = len(np.unique(w1[w1 != 0])) + len(np.unique(w2[w2 != 0])) - 1  # minus the rescaling direction
    slopes = _slopes(points)
    main = slopes["/".join(MAIN)]["hellinger_sq"]
    main_pts = [q for q in points if q["variant"] == "/".join(MAIN)]
    boot = bootstrap_slope_ci([q["n"] for q in main_pts], [q["hellinger_sq"] for q in main_pts]) if main else None
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
        "slope_ci_bootstrap": boot,
        "main_variant": "/".join(MAIN),
        "slopes": slopes,
        "summary": _summary(main_pts),
        "theory": theory_reference(tier, s, k_sqs),
        "optimizer_check": _optimizer_check(tier, points),
        "wall_time_s": time.perf_counter() - start,
    }  # fmt: skip


def machine_info() -> dict:
    """Where and with what the study ran (recorded next to its results)."""
    import os
    import platform
    import subprocess

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, timeout=10)
        git = {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        git = None
    return {
        "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "numpy": np.__version__, "sqs_core": sqs.__version__,
        "sqs_core_path": str(Path(sqs.__file__).parent), "git": git,
    }  # fmt: skip


def write_study(tier: Tier | str, out_dir: Path, *, threads: int = 1) -> tuple[Path, Path]:
    """Run ``tier`` with ``threads >= 1`` torch threads; write ``convergence.json`` and ``convergence.png``.

    The arguments and ``out_dir`` are checked before the study runs; the JSON is replaced atomically.
    """
    tier, threads = _tier(tier), check.count("threads", threads, low=1)
    out_dir = check_output_dir(out_dir, name="out_dir", files=("convergence.json", "convergence.png"))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)  # tiny models: threads only add overhead (and the machine is shared)
    try:
        started = datetime.now(UTC).isoformat(timespec="seconds")
        result = {**run_study(tier), "started_utc": started, "machine": machine_info()}
    finally:
        torch.set_num_threads(previous)
    text = json.dumps(jsonable(result), indent=1, allow_nan=False) + "\n"
    json_path = write_text_atomic(out_dir / "convergence.json", text)
    return json_path, plot_convergence(json.loads(json_path.read_text()), out_dir / "convergence.png")
