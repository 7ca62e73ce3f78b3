"""Projection of a full-precision one-hidden-layer ReLU fit onto H(T, s, K), modulo its rescaling symmetry.

f(x) = Σ_j w2_j relu(w1_j · x) is unchanged by w1_j → c_j w1_j, w2_j → w2_j / c_j (c_j > 0), so a least-squares
fit is identified only up to these per-unit scales, and projecting the raw weights onto a K-level grid can
assign a weight to the wrong level although the function is right. We minimise the squared distance

    D(c, Q) = Σ_j ‖c_j w1_j − Q1_j‖² + (w2_j / c_j − Q2_j)²,   Q = (Q1, Q2) s-sparse, K levels per layer,

by block-coordinate descent (exact per-layer K-level quantization of the s largest |rescaled| weights, then
for each unit the best c_j among the scales that put one of its weights exactly on a level, refined by a
1-D search), from several starting scales, and keep the start whose projected network has the smallest
*training* NLL (the point of H the data prefer).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .hspace import quantize_exact
from .recovery import best_unit_scale
from .synthetic import layers, mlp_from_weights, training_nll

__all__ = ["Canonical", "canonicalize_", "project_rescaled"]

log = logging.getLogger(__name__)


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


def _jump_scale(w1_j, w2_j, q1_j, q2_j, levels1, levels2, c_j: float) -> float:
    """The discrete step: among the scales that put one of unit j's weights exactly on a level (and c_j),
    the one with the smallest distance to the levels at a fixed support. Block descent alone cannot
    leave a basin in which a whole unit sits on the wrong levels."""
    kept1, kept2 = q1_j != 0, q2_j != 0
    candidates = [c_j]
    candidates += [lv / w for w in w1_j[kept1] for lv in levels1 if lv * w > 0]
    candidates += [w2_j / lv for lv in levels2 if kept2 and lv * w2_j > 0]

    def cost(c: float) -> float:
        a1, a2 = c * w1_j, w2_j / c
        return float(np.sum((a1 - _snap(a1, kept1, levels1)) ** 2) + (a2 - _snap(np.array(a2), kept2, levels2)) ** 2)

    return min(candidates, key=cost)


def project_rescaled(w1, w2, *, s: int, k: int, scales, iterations: int = 50):
    """Block-coordinate descent on D(c, Q) from ``scales``; returns the best (c, Q1, Q2, D) it visited.

    (The support step keeps the s largest rescaled weights, which is not always the best support for D,
    so D is tracked rather than assumed to decrease.)"""
    w1, w2 = np.asarray(w1, dtype=float), np.asarray(w2, dtype=float)
    c = np.asarray(scales, dtype=float).copy()
    best = None
    for _ in range(iterations):
        q1, q2 = _quantize_layers(c[:, None] * w1, w2 / c[None, :], s, k)
        distance = float(np.sum((c[:, None] * w1 - q1) ** 2) + np.sum((w2 / c[None, :] - q2) ** 2))
        if best is not None and distance >= best[3] - 1e-12:
            break
        best = (c.copy(), q1, q2, distance)
        levels1, levels2 = np.unique(q1[q1 != 0]), np.unique(q2[q2 != 0])
        c = np.array([_jump_scale(w1[j], w2[0, j], q1[j], q2[0, j], levels1, levels2, c[j]) for j in range(c.size)])
        q1 = np.stack([_snap(c[j] * w1[j], q1[j] != 0, levels1) for j in range(c.size)])
        q2 = _snap(w2 / c[None, :], q2 != 0, levels2)
        # the continuous step: c_j minimising ‖c w1_j − Q1_j‖² + (w2_j / c − Q2_j)² for fixed Q
        c = np.array([best_unit_scale(w1[j], w2[0, j], q1[j], q2[0, j]) for j in range(c.size)])
    return best


@torch.no_grad()
def canonicalize_(model: nn.Module, x, y, *, sigma: float, s: int, k: int, starts: int, seed: int) -> Canonical:
    """Rescale ``model``'s hidden units in place (its function is unchanged) to the scales whose projection
    onto H has the best training NLL; starts: c = 1, balanced ‖c w1_j‖ = |w2_j / c|, and random log-uniform."""
    if starts < 1 or s < 0 or k < 1:
        raise ValueError(f"need starts >= 1, s >= 0 and k >= 1, got {starts=}, {s=}, {k=}")
    first, last = layers(model)
    w1, w2 = first.weight.double().numpy(), last.weight.double().numpy()
    rng = np.random.default_rng(seed)
    balanced = np.sqrt(np.abs(w2[0]) / np.maximum(np.linalg.norm(w1, axis=1), 1e-12))
    inits = [np.ones(w1.shape[0]), np.clip(balanced, 0.05, 20.0)][:starts]
    inits += [np.exp(rng.uniform(-0.7, 0.7, w1.shape[0])) for _ in range(max(0, starts - 2))]
    best: Canonical | None = None
    for c0 in inits:
        c, q1, q2, distance = project_rescaled(w1, w2, s=s, k=k, scales=c0)
        nll = training_nll(mlp_from_weights(q1, q2), x, y, sigma)
        if best is None or nll < best.nll:
            best = Canonical(scales=c, q1=q1, q2=q2, distance=distance, nll=nll)
    if best is None:
        raise ValueError("no starting scales")
    scale = torch.tensor(best.scales, dtype=first.weight.dtype)
    first.weight.mul_(scale[:, None])
    last.weight.div_(scale[None, :])
    log.debug("canonical scales %s, projection NLL %.4g", best.scales, best.nll)
    return best
