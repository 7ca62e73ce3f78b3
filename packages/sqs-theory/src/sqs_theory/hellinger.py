"""Squared Hellinger distance for Gaussian regression, and the log-log rate fit (numpy / scipy only).

For equal known σ, d²(N(f, σ²), N(f0, σ²)) = 1 − ∫√(p q) = 1 − exp(−(f − f0)² / (8σ²)). The theory compares
∫ d² q̂(dθ) with ε_n*² = r_n* log^{2δ} n (Theorem ``convergence``), i.e. n^{-1} up to log factors; a regular
parametric model with k free parameters fitted by maximum likelihood has E d² ≈ E KL / 4 ≈ k / (8n).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

__all__ = ["bootstrap_slope_ci", "fit_slope", "hellinger_sq", "hellinger_sq_gaussian", "parametric_reference"]


def hellinger_sq_gaussian(f, f0, sigma: float) -> np.ndarray:
    """Pointwise d²(N(f, σ²), N(f0, σ²)) = 1 − exp(−(f − f0)² / (8σ²))."""
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    diff = np.asarray(f, dtype=float) - np.asarray(f0, dtype=float)
    return -np.expm1(-(diff**2) / (8.0 * sigma**2))


def hellinger_sq(f, f0, sigma: float) -> float:
    """d²(P_f, P_0) for Y | x ~ N(f(x), σ²), averaged over the x at which f and f0 are evaluated."""
    return float(np.mean(hellinger_sq_gaussian(f, f0, sigma)))


def parametric_reference(k: int, n) -> np.ndarray:
    """k / (8n): the asymptotic E d² of the maximum-likelihood fit of k regular parameters (d² ≈ KL/4)."""
    return k / (8.0 * np.asarray(n, dtype=float))


def fit_slope(ns: Sequence[float], values: Sequence[float], level: float = 0.95) -> dict:
    """OLS of log(values) on log(ns): slope, intercept and a t-interval for the slope."""
    with np.errstate(divide="ignore", invalid="ignore"):  # a value <= 0 is reported below
        x, y = np.log(np.asarray(ns, dtype=float)), np.log(np.asarray(values, dtype=float))
    if x.size < 3 or np.ptp(x) == 0:
        raise ValueError("need at least 3 points with at least two distinct n")
    if not np.all(np.isfinite(y)):
        raise ValueError("values must be finite and > 0")
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


def bootstrap_slope_ci(
    ns: Sequence[float], values: Sequence[float], *, level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> list[float]:
    """Percentile interval of the OLS slope when the fits at each n are resampled with replacement
    (a check on the t-interval, which assumes homoscedastic independent log-errors)."""
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"need resamples >= 1 and 0 < level < 1, got {resamples=}, {level=}")
    ns_a, v_a = np.asarray(ns, dtype=float), np.log(np.asarray(values, dtype=float))
    groups = [np.flatnonzero(ns_a == n) for n in np.unique(ns_a)]
    if len(groups) < 2:
        raise ValueError("need at least two distinct n")
    rng = np.random.default_rng(seed)
    slopes = np.empty(resamples)
    for b in range(resamples):
        idx = np.concatenate([rng.choice(g, size=g.size, replace=True) for g in groups])
        slopes[b] = np.polyfit(np.log(ns_a[idx]), v_a[idx], 1)[0]
    lo, hi = np.quantile(slopes, [0.5 - level / 2, 0.5 + level / 2])
    return [float(lo), float(hi)]
