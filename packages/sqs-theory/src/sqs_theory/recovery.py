"""Support and level recovery of a sparse quantized student against the teacher (issue 4, item 5).

A one-hidden-layer bias-free ReLU network is unchanged by permuting its hidden units and by the positive
rescaling of a unit, w1_j → c_j·w1_j, w2_j → w2_j / c_j (relu(c·z) = c·relu(z) for c > 0); a rescaled unit
can stay in H(T, s, K) (inputs ±0.5 with output 1.5 is inputs ±1.5 with output 0.5). Recovery is therefore
measured after matching hidden units (Hungarian assignment on the cosine of each unit's [input weights,
output weight]) and, for levels, after the best rescaling of each matched unit.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment, minimize_scalar

from . import _validate as check

__all__ = ["best_unit_scale", "match_units", "recovery"]


def _networks(t1, t2, s1, s2, *, names: tuple[str, str, str, str]) -> tuple[np.ndarray, ...]:
    """Teacher (t1, t2) and student (s1, s2) as float arrays: finite, t1 and s1 (width, p) of one shape with
    width, p >= 1, t2 and s2 (1, width). (A student with fewer units was matched to some of the teacher's, a w2
    of another width indexed out of range.)"""
    t1, t2 = check.weight_pair(t1, t2, names[:2])
    s1, s2 = check.weight_pair(s1, s2, names[2:])
    if s1.shape != t1.shape:
        raise ValueError(f"{names[2]} must have the shape of {names[0]}, {t1.shape}, got {s1.shape}")
    return t1, t2, s1, s2


def match_units(t1: np.ndarray, t2: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> np.ndarray:
    """perm with student unit perm[j] matched to teacher unit j; t1, s1 (width, p), t2, s2 (1, width).
    Units are compared by the cosine of their input weights w1_j, whose direction the rescaling w1_j → c w1_j,
    w2_j → w2_j / c (c > 0) leaves unchanged and which tells the units of a teacher apart (no two read the same
    ordered pair of inputs). The cosine of the concatenated [w1_j, w2_j] changed with c (rescaling one unit by
    0.44 could swap its match with another's); that of w2_j·w1_j does not, but confuses a unit with one of
    opposite input and output signs, which computes another function (relu is not odd). t2 and s2 are therefore
    not read; they stay in the signature so that a teacher and a student are passed whole."""
    with check.within("match_units"):
        t1, t2, s1, s2 = _networks(t1, t2, s1, s2, names=("t1", "t2", "s1", "s2"))
    tn = t1 / np.maximum(np.linalg.norm(t1, axis=1, keepdims=True), 1e-12)
    sn = s1 / np.maximum(np.linalg.norm(s1, axis=1, keepdims=True), 1e-12)
    _, perm = linear_sum_assignment(-(tn @ sn.T))
    return perm


@check.arguments(s1="finite_array", s2="finite_array", t1="finite_array", t2="finite_array")
def best_unit_scale(s1, s2, t1, t2) -> float:
    """c > 0 minimising ‖c·s1 − t1‖² + ‖s2 / c − t2‖² over log c in [−3, 3] (one unit's input weights s1 and
    output weight(s) s2 against targets t1, t2, finite, s1 of the shape of t1 and s2 of t2); 1 when the unit has
    no entries."""
    for name, s, t in (("s1", s1, t1), ("s2", s2, t2)):
        if s.shape != t.shape:
            raise ValueError(f"{name} must have the shape of its target, {t.shape}, got {s.shape} (in best_unit_scale)")
    if np.size(s1) + np.size(s2) == 0:
        return 1.0

    def cost(log_c: float) -> float:
        c = np.exp(log_c)
        return float(np.sum((c * s1 - t1) ** 2) + np.sum((s2 / c - t2) ** 2))

    return float(np.exp(minimize_scalar(cost, bounds=(-3.0, 3.0), method="bounded").x))


def recovery(teacher_w1, teacher_w2, w1, w2, *, levels) -> dict:
    """Support recovery (true / false positive kept weights, false negatives) and level recovery of the
    student (w1 (width, p), w2 (1, width)) against the teacher (same shapes), after matching units; every
    weight and the ``levels`` (at least one) finite. The sign, level error and level accuracy entries are NaN
    when no teacher weight is kept (there is nothing to compare)."""
    with check.within("recovery"):
        names = ("teacher_w1", "teacher_w2", "w1", "w2")
        t1, t2, w1, w2 = _networks(teacher_w1, teacher_w2, w1, w2, names=names)
        grid = check.finite_array("levels", levels)
        if grid.ndim != 1 or grid.size == 0:
            raise ValueError(f"levels must be a non-empty 1-D sequence, got shape {grid.shape}")
    perm = match_units(t1, t2, w1, w2)
    s1, s2 = w1[perm], w2[:, perm]
    kept1, kept2, true1, true2 = s1 != 0, s2 != 0, t1 != 0, t2 != 0
    tp1, tp2 = kept1 & true1, kept2 & true2
    c = np.array([best_unit_scale(s1[j, tp1[j]], s2[tp2[:, j], j], t1[j, tp1[j]], t2[tp2[:, j], j])
                  for j in range(t1.shape[0])])  # fmt: skip
    raw = np.concatenate([s1[tp1] - t1[tp1], s2[tp2] - t2[tp2]])
    scaled_s = np.concatenate([(c[:, None] * s1)[tp1], (s2 / c[None, :])[tp2]])
    truth = np.concatenate([t1[tp1], t2[tp2]])
    nearest = grid[np.argmin(np.abs(scaled_s[:, None] - grid[None, :]), axis=1)] if truth.size else truth
    kept, true = np.concatenate([kept1.ravel(), kept2.ravel()]), np.concatenate([true1.ravel(), true2.ravel()])
    return {
        "true_positive": int(np.sum(kept & true)),
        "false_positive": int(np.sum(kept & ~true)),
        "false_negative": int(np.sum(~kept & true)),
        "support_exact": bool(np.array_equal(kept, true)),
        "sign_agreement": float(np.mean(np.sign(scaled_s) == np.sign(truth))) if truth.size else float("nan"),
        "levels_layer1": sorted({float(v) for v in s1[kept1]}),
        "levels_layer2": sorted({float(v) for v in s2[kept2]}),
        "max_level_error": float(np.max(np.abs(raw))) if raw.size else float("nan"),
        "unit_scales": [float(v) for v in c],
        "max_level_error_rescaled": float(np.max(np.abs(scaled_s - truth))) if truth.size else float("nan"),
        "level_accuracy": float(np.mean(nearest == truth)) if truth.size else float("nan"),
    }
