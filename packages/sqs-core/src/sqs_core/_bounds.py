"""The bounds table of the one-hot certificate's bins (sqs_core.onehot.bin_table): for every bin b and component k
of the bin's window, Q_bk, the largest log π_k N(θ | μ_k, σ_k²) over θ in the bin."""

from __future__ import annotations

import math

import torch

from .mixture import HALF_LOG_2PI

__all__ = ["BOUND_BLOCK"]

BOUND_BLOCK = 2048  # bins per block of the eager table (_blocked_bin_bounds)


def _bin_bounds(left, right, row, means, log_stds, log_mixing, pad: int):
    """(B, K + ``pad``): Q_bk = peak_bk − ½ dist(μ_k, bin b)²/σ_k² (:func:`_peak_log_density`) for bins
    [left, right] and the components of each bin's window ``row`` of the (W, K) parameters, then ``pad``
    columns of −inf. peak and ½/σ² are formed per (W, K) component and their rows gathered (compiled, no
    (B, K) copy is written out), the rest in place: the same bits as forming them per bin (½ scales
    exactly). Eager, the whole table of 65,536 bins × 64 components took 50–66 ms within a training step
    instead of 124–138 ms. A bound that overflows to −inf (dist²/σ² beyond float32: tiny σ or far μ) is kept
    at −FLT_MAX, strictly above the padding, so that the top columns are always real components (a padding
    column picked among −inf ties indexed past K)."""
    peak, half_precision = _peak_log_density(log_mixing, log_stds), 0.5 * torch.exp(-2 * log_stds)
    mu, bound, half_precision = (t.index_select(0, row) for t in (means, peak, half_precision))
    dist = torch.maximum(left[:, None] - mu, mu - right[:, None]).clamp_(min=0.0)
    bound = bound.sub_(dist.mul_(dist).mul_(half_precision)).clamp_(min=torch.finfo(bound.dtype).min)
    return torch.cat([bound, bound.new_full((bound.shape[0], pad), -math.inf)], dim=1) if pad else bound


def _blocked_bin_bounds(left, right, row, means, log_stds, log_mixing, pad: int):
    """:func:`_bin_bounds` eagerly, :data:`BOUND_BLOCK` bins at a time into one (B, K + ``pad``) table (the same
    bits): its (bins, K) temporaries stay in cache and in the allocator's free lists, where whole-table ones
    (16 MiB each at 65,536 bins × 64) were mapped and zeroed afresh every forward. The 4096² layer's table at its
    step-300 state (AMD EPYC, 2 threads): 20 against 40 ms, 6k against 18k page faults."""
    bins = left.shape[0]
    table = torch.empty((bins, means.shape[1] + pad), dtype=means.dtype, device=means.device)
    for a in range(0, bins, BOUND_BLOCK):
        b = min(bins, a + BOUND_BLOCK)
        table[a:b] = _bin_bounds(left[a:b], right[a:b], row[a:b], means, log_stds, log_mixing, pad)
    return table


def _peak_log_density(log_mixing, log_std):
    """peak_k = log π_k − log σ_k − ½ log 2π: the largest log π_k N(θ | μ_k, σ_k²) over θ (at θ = μ_k)."""
    return log_mixing - log_std - HALF_LOG_2PI
