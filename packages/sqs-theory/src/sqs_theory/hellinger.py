"""Squared Hellinger distance for Gaussian regression, and the log-log rate fit (numpy / scipy only).

For equal known σ, d²(N(f, σ²), N(f0, σ²)) = 1 − ∫√(p q) = 1 − exp(−(f − f0)² / (8σ²)). The theory compares
∫ d² q̂(dθ) with ε_n*² = r_n* log^{2δ} n (Theorem ``convergence``), i.e. n^{-1} up to log factors; a regular
parametric model with k free parameters fitted by maximum likelihood has E d² ≈ E KL / 4 ≈ k / (8n).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from . import _validate as check

__all__ = ["bootstrap_slope_ci", "fit_slope", "hellinger_sq", "hellinger_sq_gaussian", "parametric_reference"]


# 8σ² below this is subnormal or 0 (1/(8σ²) loses digits or is inf), above max it is inf: use (diff/σ)²/8 there
_TINY, _HUGE = float(np.finfo(float).tiny), float(np.finfo(float).max)


def _predictions(f, f0) -> tuple[np.ndarray, np.ndarray]:
    """f and f0 as float arrays of one shape, every entry finite (a broadcast (n,) against (n, 1) or (1,) was an
    average over the wrong pairs; inf − inf a NaN)."""
    f, f0 = check.finite_array("f", f), check.finite_array("f0", f0)
    if f.shape != f0.shape:
        raise ValueError(f"f and f0 must have the same shape, got {f.shape} and {f0.shape}")
    return f, f0


@check.arguments(sigma="positive")
def hellinger_sq_gaussian(f, f0, sigma: float) -> np.ndarray:
    """Pointwise d²(N(f, σ²), N(f0, σ²)) = 1 − exp(−(f − f0)² / (8σ²)); f and f0 finite, of one shape, σ > 0."""
    with check.within("hellinger_sq_gaussian"):
        f, f0 = _predictions(f, f0)
    diff = f - f0
    try:
        scale = 8.0 * sigma**2
    except OverflowError:  # a Python float's ** raises there
        scale = math.inf
    with np.errstate(over="ignore"):  # a square past float64 is inf: d² = 1, as it should
        if not _TINY <= scale <= _HUGE:  # σ² under- or overflows: the same ratio, scaled first
            return -np.expm1(-((diff / sigma) ** 2) / 8.0)
        return -np.expm1(-(diff**2) / scale)


@check.arguments(sigma="positive")
def hellinger_sq(f, f0, sigma: float) -> float:
    """d²(P_f, P_0) for Y | x ~ N(f(x), σ²), averaged over the x at which f and f0 are evaluated (at least one)."""
    if np.size(f) == 0:
        raise ValueError("f must hold at least one prediction, got none (in hellinger_sq)")
    return float(np.mean(hellinger_sq_gaussian(f, f0, sigma)))


@check.arguments(k="count", n="positive_array")
def parametric_reference(k: int, n) -> np.ndarray:
    """k / (8n): the asymptotic E d² of the maximum-likelihood fit of k regular parameters (d² ≈ KL/4);
    k >= 1 an integer, every n finite and > 0."""
    return k / (8.0 * n)


def _log_points(ns: Sequence[float], values: Sequence[float], level: float) -> tuple[np.ndarray, np.ndarray]:
    """(log ns, log values), each 1-D, of one length, every entry finite and > 0 (a 0 or a NaN made the fit NaN,
    silently); ``level`` in (0, 1)."""
    check.real("level", level, low=0.0, high=1.0, strict=True)
    arrays = [check.finite_array(name, a, positive=True) for name, a in (("ns", ns), ("values", values))]
    if any(a.ndim != 1 for a in arrays) or arrays[0].size != arrays[1].size:
        raise ValueError(f"ns and values must be 1-D and of the same length, got shapes {[a.shape for a in arrays]}")
    return np.log(arrays[0]), np.log(arrays[1])


def fit_slope(ns: Sequence[float], values: Sequence[float], level: float = 0.95) -> dict:
    """OLS of log(values) on log(ns): slope, intercept and a t-interval for the slope."""
    x, y = _log_points(ns, values, level)
    if x.size < 3 or np.ptp(x) == 0:
        raise ValueError("need at least 3 points with at least two distinct n")
    res = stats.linregress(x, y)
    half = stats.t.ppf(0.5 + level / 2, x.size - 2) * res.stderr
    return {
        "slope": float(res.slope),
        "slope_ci": [float(res.slope - half), float(res.slope + half)],
        "intercept": float(res.intercept),
        "stderr": float(res.stderr),
        "r2": float(res.rvalue**2),
        "num_points": int(x.size),
    }


@check.arguments(resamples="count", seed="seed")
def bootstrap_slope_ci(
    ns: Sequence[float], values: Sequence[float], *, level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> list[float]:
    """Percentile interval of the OLS slope when the fits at each n are resampled with replacement
    (a check on the t-interval, which assumes homoscedastic independent log-errors)."""
    log_ns, v_a = _log_points(ns, values, level)
    groups = [np.flatnonzero(log_ns == n) for n in np.unique(log_ns)]
    if len(groups) < 2:
        raise ValueError("need at least two distinct n")
    rng = np.random.default_rng(seed)
    slopes = np.empty(resamples)
    for b in range(resamples):
        idx = np.concatenate([rng.choice(g, size=g.size, replace=True) for g in groups])
        slopes[b] = np.polyfit(log_ns[idx], v_a[idx], 1)[0]
    lo, hi = np.quantile(slopes, [0.5 - level / 2, 0.5 + level / 2])
    return [float(lo), float(hi)]
