"""Projection of a full-precision one-hidden-layer ReLU fit onto H(T, s, K), modulo its rescaling symmetry.

f(x) = Σ_j w2_j relu(w1_j · x) is unchanged by w1_j → c_j w1_j, w2_j → w2_j / c_j (c_j > 0), so a least-squares
fit is identified only up to these per-unit scales, and projecting the raw weights onto a K-level grid can
assign a weight to the wrong level although the function is right. We minimise the squared distance

    D(c, Q) = Σ_j ‖c_j w1_j − Q1_j‖² + (w2_j / c_j − Q2_j)²,   Q = (Q1, Q2) s-sparse, K levels per layer,

by block-coordinate descent from several starting scales, and keep the start whose projected network has the
smallest *training* NLL (the point of H the data prefer). NLLs within 1e-6 of each other (relative) are ties,
broken by the smaller D: the NLL is a float32 mean, and two projections that compute the same function differ
in it by ~1e-7, so without the tie the choice among them would be rounding noise.

Scale of the problem. A common factor a on all c_j multiplies layer 1's residuals by a and layer 2's by 1/a,
so D is not invariant under it, and for s ≥ width, K ≥ 2 its infimum over c is 0 for *any* network (put
every w2_j / c_j on the two levels ±v and shrink layer 1 towards 0, or push some units' scales to 0 and others
to ∞); left free, the descent drifts there and the projected network loses the function. The descent therefore
holds the gauge Σ_j log c_j at its start, every start sits at the gauge of the balanced scales
(‖c_j w1_j‖ = |w2_j / c_j|, the rescaling-invariant choice), and each c_j stays within e^±3 of its balanced
value. Points of H that represent the network exactly (D = 0) exist at every gauge, so the gauge costs
nothing when the network is in H up to rescaling.

One iteration: (i) support and levels: keep the s largest |rescaled| weights, quantize each layer's kept
entries to K levels exactly; (ii) the discrete step, unit by unit: move c_j to the scale that puts one of the
unit's weights on another unit's weight if that lowers D after one Lloyd step of the levels (block descent
alone cannot leave a basin in which a whole unit sits on the wrong levels); (iii) the continuous step:
minimise D jointly over (log c, levels) at the support and level assignment by Levenberg-Marquardt
(alternating per-unit scales and refitted levels converges only linearly, D shrinking by ~15 % a sweep, and
stopped half-way it leaves a projection that is neither the nearest point nor an exact one). The descent
stops when an iteration no longer lowers D.

Starts (the first ``starts`` of): the model's own scales (c = 1), each unit's largest |w1| on a common
magnitude, each |w2| on a common magnitude, the balanced scales, then random log-uniform in [e^-0.7, e^0.7]
about the model's. For a network in H up to rescaling, the two magnitude starts leave each unit off an exact
point by at most a ratio of two levels, which step (ii) repairs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import least_squares
from torch import nn

from . import _tensors
from . import _validate as check
from .hspace import quantize_exact
from .synthetic import _weight_matrices, layers, mlp_from_weights, training_nll

__all__ = ["Canonical", "canonicalize_", "project_rescaled"]

log = logging.getLogger(__name__)

_SCALE_RANGE = 3.0  # each log c_j stays within ±3 of its balanced value
_NLL_TIE = 1e-6  # training NLLs (float32) within this relative difference are ties
_STALL = 1e-14  # the descent stops when D falls by less than this × ‖(c w1, w2 / c)‖² (rounding: ~1e-16 ×)


@dataclass(frozen=True)
class Canonical:
    scales: np.ndarray  # c (width,)
    q1: np.ndarray  # projected W1 (width, p)
    q2: np.ndarray  # projected W2 (1, width)
    distance: float  # D(c, Q)
    nll: float  # training NLL of the projected network


def _quantize_layers(a1: np.ndarray, a2: np.ndarray, s: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep the s largest |a| over both layers, quantize each layer's kept entries to k levels exactly."""
    flat = np.concatenate([np.abs(a1).ravel(), np.abs(a2).ravel()])
    keep = np.zeros(flat.size, dtype=bool)
    keep[np.argsort(-flat, kind="stable")[:s]] = True
    out = []
    for a, mask in ((a1, keep[: a1.size].reshape(a1.shape)), (a2, keep[a1.size :].reshape(a2.shape))):
        q = np.zeros_like(a)
        if mask.any():
            q[mask] = quantize_exact(a[mask], K=k, B=float(np.abs(a).max()) + 1.0).theta
        out.append(q)
    return out[0], out[1]


def _snap(values: np.ndarray, kept: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Kept entries to their nearest level, the others to 0."""
    if levels.size == 0:
        return np.zeros_like(values)
    nearest = levels[np.argmin(np.abs(values[..., None] - levels), axis=-1)]
    return np.where(kept, nearest, 0.0)


def _kept_levels(q1: np.ndarray, q2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct non-zero values of each projected layer, ascending: its levels in use."""
    return np.unique(q1[q1 != 0]), np.unique(q2[q2 != 0])


def _log_balanced(w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """log c_j with ‖c_j w1_j‖ = |w2_j / c_j| (a unit without weights in a layer counts them as 1e-12)."""
    return 0.5 * np.log(np.maximum(np.abs(w2[0]), 1e-12) / np.maximum(np.linalg.norm(w1, axis=1), 1e-12))


def _lloyd_cost(values: np.ndarray, kept: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """D of each row of ``values`` (candidates, entries) after one Lloyd step from ``levels``: kept entries
    go to their nearest level, each level moves to the mean of its entries; pruned entries cost their square."""
    if levels.size == 0:
        return np.sum(values**2, axis=-1)
    nearest = np.argmin(np.abs(values[..., None] - levels), axis=-1)
    onehot = (nearest[..., None] == np.arange(levels.size)) & kept[:, None]
    count = onehot.sum(axis=1)
    means = np.where(count > 0, np.einsum("cnm,cn->cm", onehot, values) / np.maximum(count, 1), levels)
    return np.sum((values - np.einsum("cnm,cm->cn", onehot, means)) ** 2, axis=-1)


def _jump_scale(w1: np.ndarray, w2: np.ndarray, c: np.ndarray, q1: np.ndarray, q2: np.ndarray) -> np.ndarray:
    """The discrete step, unit by unit at the support of (Q1, Q2): c_j or a scale that puts one of unit j's
    kept weights exactly on another unit's kept rescaled weight of the same layer, whichever has the smallest
    D after one Lloyd step of the levels. Scoring against refitted rather than fixed levels matters: a unit
    alone on the wrong level drags a level half-way between two values, and against that level the move that
    puts it on its true level costs no less than staying."""
    c = c.copy()
    kept1, kept2 = q1 != 0, q2[0] != 0
    levels1, levels2 = _kept_levels(q1, q2)
    for j in range(c.size):
        a1, a2 = c[:, None] * w1, w2[0] / c
        others = np.arange(c.size) != j
        own = w1[j][kept1[j] & (w1[j] != 0)]
        ratios = [np.ravel(a1[others][kept1[others]][None, :] / own[:, None])]
        if kept2[j]:
            targets = a2[others][kept2[others]]
            ratios.append(w2[0, j] / targets[targets != 0])
        cand = np.concatenate([[c[j]], *ratios])
        cand = cand[np.isfinite(cand) & (cand > 0)]
        b1, b2 = np.repeat(a1[None], cand.size, axis=0), np.repeat(a2[None], cand.size, axis=0)
        b1[:, j], b2[:, j] = cand[:, None] * w1[j], w2[0, j] / cand
        cost = _lloyd_cost(b1.reshape(cand.size, -1), kept1.ravel(), levels1) + _lloyd_cost(b2, kept2, levels2)
        c[j] = cand[int(np.argmin(cost))]  # c_j itself comes first: kept on ties
    return c


def _polish(w1: np.ndarray, w2: np.ndarray, c: np.ndarray, q1: np.ndarray, q2: np.ndarray) -> np.ndarray:
    """The continuous step: the c minimising D jointly over (log c, levels) at the support and level
    assignment of (Q1, Q2), Σ_j log c_j held fixed, by Levenberg-Marquardt (exact where the minimum is 0)."""
    levels1, levels2 = _kept_levels(q1, q2)
    lab1 = np.where(q1 != 0, np.searchsorted(levels1, q1), -1).ravel()
    lab2 = np.where(q2[0] != 0, np.searchsorted(levels2, q2[0]), -1)
    width, m1, n1, t0 = c.size, w1.size, levels1.size, np.log(c)
    basis = np.eye(width)[:, :-1] - 1.0 / width  # log-scale moves that keep Σ log c_j
    kept1, kept2 = np.flatnonzero(lab1 >= 0), np.flatnonzero(lab2 >= 0)

    def residuals(x: np.ndarray) -> np.ndarray:
        e, lv = np.exp(t0 + basis @ x[: width - 1]), x[width - 1 :]
        r1, r2 = (e[:, None] * w1).ravel(), w2[0] / e
        r1[kept1] -= lv[lab1[kept1]]
        r2[kept2] -= lv[n1 + lab2[kept2]]
        return np.concatenate([r1, r2])

    def jacobian(x: np.ndarray) -> np.ndarray:
        e = np.exp(t0 + basis @ x[: width - 1])
        d_t = np.zeros((m1 + width, width))
        d_t[np.arange(m1), np.repeat(np.arange(width), w1.shape[1])] = (e[:, None] * w1).ravel()
        d_t[m1 + np.arange(width), np.arange(width)] = -w2[0] / e
        d_levels = np.zeros((m1 + width, n1 + levels2.size))
        d_levels[kept1, lab1[kept1]] = -1.0
        d_levels[m1 + kept2, n1 + lab2[kept2]] = -1.0
        return np.hstack([d_t @ basis, d_levels])

    x0 = np.concatenate([np.zeros(width - 1), levels1, levels2])
    if x0.size == 0 or m1 + width < x0.size:  # nothing to fit, or more unknowns than weights
        return c
    fit = least_squares(residuals, x0, jac=jacobian, method="lm", xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=50)
    return np.exp(t0 + basis @ fit.x[: width - 1])


def _distance(w1, w2, c, q1, q2) -> float:
    """D(c, Q); with Q = 0, ‖(c w1, w2 / c)‖²."""
    return float(np.sum((c[:, None] * w1 - q1) ** 2) + np.sum((w2 / c[None, :] - q2) ** 2))


def _scales(scales, width: int) -> np.ndarray:
    """Starting scales c: finite and > 0, one per unit (a scalar is every unit's)."""
    c = check.finite_array("scales", scales, positive=True)
    if c.shape not in ((), (width,)):
        raise ValueError(f"scales must have shape (width,) = {(width,)}, got {c.shape}")
    return c


@check.arguments(s="size", k="count", iterations="count")
def project_rescaled(w1, w2, *, s: int, k: int, scales, iterations: int = 50):
    """Block-coordinate descent on D(c, Q) from ``scales`` (at their gauge Σ log c_j, each c_j within e^±3 of
    its balanced value); returns the best (c, Q1, Q2, D) it visited. w1 (width, p) and w2 (1, width) finite
    and within float32's range; s >= 0 and k >= 1 integers; scales > 0, one per unit.

    (The support step keeps the s largest rescaled weights, which is not always the best support for D,
    so D is tracked rather than assumed to decrease.)"""
    with check.within("project_rescaled"):
        w1, w2 = _weight_matrices(w1, w2)
        scales = _scales(scales, w1.shape[0])
    ref = _log_balanced(w1, w2)

    def bound(c: np.ndarray) -> np.ndarray:
        return np.exp(np.clip(np.log(c), ref - _SCALE_RANGE, ref + _SCALE_RANGE))

    c = bound(np.asarray(scales, dtype=float))
    gauge = float(np.mean(np.log(c)))
    best = None
    for _ in range(iterations):
        q1, q2 = _quantize_layers(c[:, None] * w1, w2 / c[None, :], s, k)
        distance = _distance(w1, w2, c, q1, q2)
        if best is not None and distance >= best[3] - _STALL * _distance(w1, w2, c, 0.0, 0.0):
            break
        best = (c.copy(), q1, q2, distance)
        levels1, levels2 = _kept_levels(q1, q2)
        c = _jump_scale(w1, w2, c, q1, q2)
        c = bound(c * np.exp(gauge - np.mean(np.log(c))))
        q1, q2 = _snap(c[:, None] * w1, q1 != 0, levels1), _snap(w2 / c[None, :], q2 != 0, levels2)
        c = bound(_polish(w1, w2, c, q1, q2))
    return best


def _starts(w1: np.ndarray, w2: np.ndarray, starts: int, seed: int) -> list[np.ndarray]:
    """The first ``starts`` of: c = 1, each unit's largest |w1| on a common magnitude, each |w2| on a common
    magnitude, balanced, then random log-uniform in [e^-0.7, e^0.7]; all moved to the balanced gauge."""
    rng = np.random.default_rng(seed)
    log_balanced = _log_balanced(w1, w2)
    informed = [
        np.zeros(w1.shape[0]),
        -np.log(np.maximum(np.abs(w1).max(axis=1), 1e-12)),
        np.log(np.maximum(np.abs(w2[0]), 1e-12)),
        log_balanced,
    ][:starts]
    informed += [rng.uniform(-0.7, 0.7, w1.shape[0]) for _ in range(max(0, starts - len(informed)))]
    return [np.exp(t - t.mean() + log_balanced.mean()) for t in informed]


def _select(candidates: list[Canonical]) -> Canonical:
    """The smallest training NLL; NLLs within a relative _NLL_TIE of it (float32 rounding: two projections
    computing the same function differ by ~1e-7) are ties, broken by the smaller D."""
    best_nll = min(cand.nll for cand in candidates)
    ties = [cand for cand in candidates if cand.nll <= best_nll + _NLL_TIE * abs(best_nll)]
    return min(ties, key=lambda cand: cand.distance)


@torch.no_grad()
@check.arguments(sigma="positive", s="size", k="count", starts="count", seed="seed")
def canonicalize_(model: nn.Module, x, y, *, sigma: float, s: int, k: int, starts: int, seed: int) -> Canonical:
    """Rescale ``model``'s hidden units in place (its function is unchanged) to the scales whose projection
    onto H has the best training NLL, over ``starts`` starting scales (see the module docstring); x (n, p) and
    y (n, 1) finite, of the model's dtype, and the model's weights finite."""
    first, last = layers(model)
    with check.within("canonicalize_"):
        _tensors.data(model, x, y)
        w1, w2 = _weight_matrices(first.weight.double().numpy(), last.weight.double().numpy())
    candidates = []
    for c0 in _starts(w1, w2, starts, seed):
        c, q1, q2, distance = project_rescaled(w1, w2, s=s, k=k, scales=c0)
        nll = training_nll(mlp_from_weights(q1, q2), x, y, sigma)
        candidates.append(Canonical(scales=c, q1=q1, q2=q2, distance=distance, nll=nll))
    best = _select(candidates)
    scale = torch.tensor(best.scales, dtype=first.weight.dtype)
    first.weight.mul_(scale[:, None])
    last.weight.div_(scale[None, :])
    log.debug("canonical scales %s, projection D %.3g, NLL %.4g", best.scales, best.distance, best.nll)
    return best
