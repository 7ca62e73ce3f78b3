"""Pieces shared by the baselines: which layers are compressed, global magnitude masks, 1-D k-means,
uniform round-to-nearest, and the paper's compression rate.

Compression rate (paper, eq. compression-rate), computed over the compressed layers only::

    rate = 32 · T / ( Σ_l log2(K_l) · nnz_l  +  32 · Σ_l K_l )

with T = Σ_l numel(W_l) the weights of the compressed layers, nnz_l the non-zero weights of layer l, and K_l
the size of layer l's codebook (per window, summed over windows). As in the paper, the sparsity mask is not
charged and layers left uncompressed (biases, batch-norm) are not counted on either side. A method's
``bits`` is log2 K (K = levels per codebook).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
from torch import nn

__all__ = [
    "PAPER_RATE_FORMULA",
    "Layer",
    "LayerStats",
    "compressible_layers",
    "global_magnitude_masks",
    "kmeans_1d",
    "layer_stats",
    "paper_compression_rate",
    "uniform_quantize",
    "weight_parametrizations",
]

PAPER_RATE_FORMULA = "32*sum_l(T_l) / (sum_l(log2(K_l)*nnz_l) + 32*sum_l(K_l)), over compressed layers"


Layer = nn.Conv2d | nn.Linear


def compressible_layers(model: nn.Module) -> dict[str, Layer]:
    """Every ``nn.Conv2d`` and ``nn.Linear`` of ``model`` by qualified name (their weights get compressed)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Conv2d | nn.Linear)}


def weight_parametrizations(module: nn.Module) -> Any:
    """The ``ParametrizationList`` registered on ``module.weight`` (``torch.nn.utils.parametrize``)."""
    return cast(Any, module).parametrizations.weight


def global_magnitude_masks(weights: dict[str, torch.Tensor], nonzero: float) -> dict[str, torch.Tensor]:
    """Keep exactly ``round(nonzero · T)`` weights of largest magnitude across all tensors (bool masks)."""
    if not 0.0 < nonzero <= 1.0:
        raise ValueError(f"nonzero must be in (0, 1], got {nonzero}")
    flat = torch.cat([w.detach().abs().flatten() for w in weights.values()])
    keep = round(nonzero * flat.numel())
    chosen = torch.zeros(flat.numel(), dtype=torch.bool)
    chosen[torch.topk(flat, keep, sorted=False).indices] = True
    masks, offset = {}, 0
    for name, w in weights.items():
        masks[name] = chosen[offset : offset + w.numel()].view_as(w)
        offset += w.numel()
    return masks


def _assign(values: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """Index of the nearest center of each value (1-D, via the sorted centers' midpoints)."""
    order = torch.argsort(centers)
    sorted_centers = centers[order]
    midpoints = (sorted_centers[1:] + sorted_centers[:-1]) / 2
    return order[torch.bucketize(values, midpoints)]


def kmeans_1d(
    values: torch.Tensor, k: int, *, iters: int = 50, pin_zero: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's k-means on a 1-D tensor; returns (centers (k,), assignment (n,)). Deterministic.

    Centers start at evenly spaced quantiles. An emptied cluster is re-seeded at the value farthest from its
    center, so with at least ``k`` distinct values every center ends up used. ``pin_zero`` keeps center 0 at
    exactly 0 (the pruning component of DGMS).
    """
    values = values.detach().flatten().double()
    if k < 1 or values.numel() < k:
        raise ValueError(f"k-means needs 1 <= k <= number of values, got k={k}, n={values.numel()}")
    centers = torch.quantile(values, torch.linspace(0, 1, k + 2, dtype=torch.float64)[1:-1])
    if pin_zero:
        centers[torch.argmin(centers.abs())] = centers[0].item()
        centers[0] = 0.0
    assign = _assign(values, centers)
    for _ in range(iters):
        counts = torch.bincount(assign, minlength=k)
        sums = torch.zeros(k, dtype=torch.float64).index_add_(0, assign, values)
        new = torch.where(counts > 0, sums / counts.clamp(min=1), centers)
        for empty in torch.nonzero(counts == 0).flatten().tolist():
            far = torch.argmax((values - new[assign]).abs())
            new[empty] = values[far]
            assign[far] = empty
        if pin_zero:
            new[0] = 0.0
        new_assign = _assign(values, new)
        converged = torch.equal(new_assign, assign) and torch.allclose(new, centers)
        centers, assign = new, new_assign
        if converged:
            break
    return centers.float(), assign


def uniform_quantize(weight: torch.Tensor, mask: torch.Tensor, bits: int) -> torch.Tensor:
    """Symmetric round-to-nearest onto ``2**bits`` evenly spaced levels over [−m, m], m = max|kept w|."""
    if bits < 1:
        raise ValueError(f"bits must be >= 1, got {bits}")
    kept = weight[mask]
    if kept.numel() == 0 or kept.abs().max() == 0:
        return torch.zeros_like(weight)  # nothing kept, or every kept weight is already 0
    m = kept.abs().max()
    step = 2 * m / (2**bits - 1)
    q = torch.round((weight + m) / step).clamp(0, 2**bits - 1) * step - m
    return torch.where(mask, q, torch.zeros_like(q))


@dataclass(frozen=True)
class LayerStats:
    """Size, non-zeros and codebook size of one compressed layer."""

    name: str
    numel: int
    nnz: int
    codebook: int  # K_l: levels charged at 32 bits in the paper's rate
    distinct_levels: int  # distinct non-zero values actually present

    def to_dict(self) -> dict:
        return asdict(self)


def layer_stats(weights: dict[str, torch.Tensor], codebook: int | dict[str, int]) -> list[LayerStats]:
    """:class:`LayerStats` of each (already compressed) weight tensor."""
    stats = []
    for name, w in weights.items():
        nonzero = w[w != 0]
        k = codebook[name] if isinstance(codebook, dict) else codebook
        stats.append(LayerStats(name, w.numel(), nonzero.numel(), k, torch.unique(nonzero).numel()))
    return stats


def paper_compression_rate(stats: list[LayerStats]) -> float:
    """The paper's compression rate over ``stats`` (see :data:`PAPER_RATE_FORMULA`)."""
    total = sum(s.numel for s in stats)
    bits = sum(math.log2(s.codebook) * s.nnz for s in stats) + 32 * sum(s.codebook for s in stats)
    if bits <= 0:
        raise ValueError("compressed size is zero (K = 1 everywhere?): the paper's rate is undefined")
    return 32 * total / bits
