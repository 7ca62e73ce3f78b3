"""Deterministic, seeded 1-D K-means initialisation of the GMM (Appendix "Implementation of SQS").

For the groups G_1..G_K found by K-means on a window's weights:
    μ_k = mean(G_k),  σ_k = sqrt(Σ (θ − μ_k)² / (|G_k| − 1)),  π_k = |G_k| / Σ_j |G_j|.

In 1-D, K-means assignments are intervals between the midpoints of the sorted centres, so one Lloyd
step is a ``bucketize`` plus segment sums (O(T log K)). Centres start at the (k + ½)/K quantiles, which
makes the result deterministic; the generator only breaks ties when an empty cluster must be re-seeded.

Degenerate windows, handled so that every component has finite parameters:
* fewer than K distinct values: the distinct values become the first centres; the surplus components
  copy the most populated centre with mixing weight ``EMPTY_MIX`` (renormalised), so they never win;
* a singleton group, or σ_k = 0: σ_k is floored at ``STD_FLOOR_FRACTION`` × the window's spread (or ×
  max(|θ|, 1) when the window is constant).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["GMMInit", "kmeans_1d"]

EMPTY_MIX = 1e-6
STD_FLOOR_FRACTION = 1e-3


@dataclass(frozen=True)
class GMMInit:
    """Initial (μ, σ, π) of one window, each of shape (K,), means sorted ascending."""

    means: torch.Tensor
    stds: torch.Tensor
    mixing: torch.Tensor


def _assign(values: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    midpoints = (centres[1:] + centres[:-1]) / 2
    return torch.bucketize(values, midpoints)


def _lloyd(values: torch.Tensor, centres: torch.Tensor, iterations: int, generator: torch.Generator):
    k = centres.numel()
    for _ in range(iterations):
        labels = _assign(values, centres)
        counts = torch.bincount(labels, minlength=k).to(values.dtype)
        sums = torch.zeros(k, dtype=values.dtype).index_add_(0, labels, values)
        empty = counts == 0
        new = torch.where(empty, centres, sums / counts.clamp_min(1))
        if empty.any():
            # Re-seed each empty cluster with a random member of the most populated cluster.
            big = int(counts.argmax())
            members = values[labels == big]
            picks = torch.randint(members.numel(), (int(empty.sum()),), generator=generator)
            new[empty] = members[picks]
        new, _ = torch.sort(new)
        if torch.equal(new, centres):
            break
        centres = new
    return centres


def kmeans_1d(values: torch.Tensor, k: int, *, iterations: int = 30, generator: torch.Generator | None = None):
    """K-means of a 1-D tensor into ``k`` groups; returns a :class:`GMMInit` (float32, on CPU)."""
    if k < 2:
        raise ValueError(f"k must be >= 2, got {k}")
    flat = values.detach().reshape(-1).double().cpu()
    if flat.numel() == 0:
        raise ValueError("kmeans_1d needs at least one value")
    if not torch.isfinite(flat).all():
        raise ValueError("kmeans_1d got a NaN or infinite value")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    distinct = torch.unique(flat)
    if distinct.numel() <= k:
        centres = distinct
    else:
        sorted_vals, _ = torch.sort(flat)
        positions = ((torch.arange(k, dtype=torch.double) + 0.5) / k * (flat.numel() - 1)).round().long()
        centres = torch.unique(sorted_vals[positions])
        if centres.numel() < k:  # repeated quantiles: top up with evenly spaced distinct values
            extra = distinct[torch.linspace(0, distinct.numel() - 1, k).round().long()]
            centres = torch.unique(torch.cat([centres, extra]))[:k]
            centres, _ = torch.sort(centres)
        centres = _lloyd(flat, centres, iterations, gen)
    return _statistics(flat, centres, k)


def _statistics(flat: torch.Tensor, centres: torch.Tensor, k: int) -> GMMInit:
    found = centres.numel()
    labels = _assign(flat, centres)
    counts = torch.bincount(labels, minlength=found).double()
    means = torch.zeros(found, dtype=torch.double).index_add_(0, labels, flat) / counts
    sq = torch.zeros(found, dtype=torch.double).index_add_(0, labels, (flat - means[labels]) ** 2)
    stds = torch.sqrt(sq / (counts - 1).clamp_min(1))
    spread = float(flat.max() - flat.min())
    floor = STD_FLOOR_FRACTION * (spread if spread > 0 else max(float(flat.abs().max()), 1.0))
    stds = torch.where((counts > 1) & (stds > floor), stds, torch.full_like(stds, floor))
    mixing = counts / counts.sum()
    if found < k:
        fill = int(counts.argmax())
        pad = k - found
        means = torch.cat([means, means[fill].repeat(pad)])
        stds = torch.cat([stds, stds[fill].repeat(pad)])
        mixing = torch.cat([mixing, torch.full((pad,), EMPTY_MIX, dtype=torch.double)])
        mixing = mixing / mixing.sum()
        order = torch.argsort(means, stable=True)
        means, stds, mixing = means[order], stds[order], mixing[order]
    return GMMInit(means=means.float(), stds=stds.float(), mixing=mixing.float())
