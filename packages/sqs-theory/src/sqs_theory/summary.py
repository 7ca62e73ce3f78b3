"""The convergence study's statistics from its fits: per-n summaries, log-log slopes and the bootstrap interval.

d² is in [0, 1]; an exact 0 (a fit equal to the truth on every test x) has no logarithm, so the slopes fit
it as ``ZERO_FLOOR`` and say how many they did (``zeros_clamped`` of each fit, and a warning in the log).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

import numpy as np

from .hellinger import bootstrap_slope_ci, fit_slope

__all__ = ["ESTIMATORS", "MIN_BOOTSTRAP_FITS", "ZERO_FLOOR", "bootstrap_interval", "per_n_summary", "slopes"]

log = logging.getLogger(__name__)

ESTIMATORS = (
    "hellinger_sq",
    "hellinger_sq_avg",
    "hellinger_sq_sampled",
    "hellinger_sq_bma",
    "hellinger_sq_greedy",
    "hellinger_sq_fp",
)
ZERO_FLOOR = 1e-300  # an exact d² = 0 is fitted as this (log 0 = -inf)
MIN_BOOTSTRAP_FITS = 5  # with fewer fits at an n, resampling them gives few distinct sets: a degenerate interval


def _floored(values: Sequence[float], what: str) -> tuple[list[float], int]:
    """``values`` with each exact 0 replaced by ZERO_FLOOR, and how many were (logged when any)."""
    zeros = sum(1 for v in values if v == 0)
    if zeros:
        log.warning("%s: %d of %d d² values are exactly 0, fitted as %g", what, zeros, len(values), ZERO_FLOOR)
    return [max(v, ZERO_FLOOR) for v in values], zeros


def slopes(points: list[dict]) -> dict:
    """Per variant and estimator: the OLS fit of log d² on log n (None with < 3 fits or one n), with the count
    of exact zeros it fitted as ZERO_FLOOR in ``zeros_clamped``."""
    out: dict = {}
    for key in sorted({q["variant"] for q in points}):
        sel = [q for q in points if q["variant"] == key]
        ns = [q["n"] for q in sel]
        fits: dict = dict.fromkeys(ESTIMATORS)
        if len(ns) >= 3 and len(set(ns)) >= 2:
            for k in ESTIMATORS:
                values, zeros = _floored([q[k] for q in sel], f"{key} {k}")
                fits[k] = {**fit_slope(ns, values), "zeros_clamped": zeros}
        out[key] = fits
    return out


def bootstrap_interval(points: list[dict]) -> list[float] | None:
    """The bootstrap interval of the ∫ d² dq̂ slope (fits resampled within each n), or None unless every n has
    at least MIN_BOOTSTRAP_FITS fits and there are two n: with 2 fits an n has 3 distinct resamples, and the
    interval is the spread of a handful of slopes, not a confidence interval."""
    counts = Counter(q["n"] for q in points)
    if len(counts) < 2 or min(counts.values()) < MIN_BOOTSTRAP_FITS:
        return None
    values, _ = _floored([q["hellinger_sq"] for q in points], "bootstrap hellinger_sq")
    return bootstrap_slope_ci([q["n"] for q in points], values)


def _mean_defined(values: Sequence[float | None]) -> tuple[float | None, int]:
    """The mean of the values that are defined (not None or NaN), and how many were not (None if none is)."""
    arr = np.array([np.nan if v is None else v for v in values], dtype=float)
    undefined = int(np.isnan(arr).sum())
    return (float(np.mean(arr[~np.isnan(arr)])) if undefined < arr.size else None), undefined


def per_n_summary(points: list[dict]) -> list[dict]:
    """Per n: quartiles of E_q̂ d², n × median, recovery rates, and the slope between consecutive medians. The
    level accuracy is undefined (NaN) for a fit that kept no true weight: the mean is over the others, and
    ``level_accuracy_undefined`` counts those left out."""
    out: list[dict] = []
    for n in sorted({q["n"] for q in points}):
        at = [q for q in points if q["n"] == n]
        h = np.array([q["hellinger_sq"] for q in at])
        level, undefined = _mean_defined([q["level_accuracy"] for q in at])
        out.append({
            "n": n, "fits": len(at), "median": float(np.median(h)), "q25": float(np.quantile(h, 0.25)),
            "q75": float(np.quantile(h, 0.75)), "n_times_median": float(n * np.median(h)),
            "median_fp": float(np.median([q["hellinger_sq_fp"] for q in at])),
            "support_exact": float(np.mean([q["support_exact"] for q in at])),
            "false_positive_mean": float(np.mean([q["false_positive"] for q in at])),
            "level_accuracy_mean": level, "level_accuracy_undefined": undefined,
        })  # fmt: skip
        if len(out) > 1:
            prev = out[-2]
            out[-1]["local_slope"] = float(np.log(out[-1]["median"] / prev["median"]) / np.log(n / prev["n"]))
    return out
