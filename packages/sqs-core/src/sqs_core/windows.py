"""Windowing strategies (Section "Windowing strategy in quantization"): each window gets its own K components.

* ``none``    one window for the whole tensor.
* ``equal``   4 windows of width (max − min)/4 (paper, "Equal-size windowing").
* ``outlier`` 4 windows (eq. outlier-window): the lower tail [min, q1 − 5·IQR], the upper tail
  [q3 + 5·IQR, max], and the middle (q1 − 5·IQR, q3 + 5·IQR) split at the median. The paper does not
  say how the middle is split; the median puts half of the bulk in each middle window, which keeps the
  two middle codebooks equally loaded and symmetric for the (usual) zero-centred weight distribution.

Empty windows are dropped and the remaining ids compacted, so window ids are always 0..W−1 and every
window holds at least one weight. Windows are value intervals, ordered from the most negative.
"""

from __future__ import annotations

import torch

__all__ = ["NUM_WINDOWS", "OUTLIER_IQR_FACTOR", "assign_windows"]

OUTLIER_IQR_FACTOR = 5.0
NUM_WINDOWS = 4


def _kth(flat: torch.Tensor, q: float, ordered: torch.Tensor | None = None) -> torch.Tensor:
    """The q-quantile by order statistic (torch.quantile refuses tensors above 2**24 elements), read from
    ``ordered`` (θ's values sorted, any float dtype, on any device: initial_mixtures sorts on the CPU) when the
    caller has them; the quantile is on ``flat``'s device either way."""
    k = min(flat.numel(), max(1, round(q * (flat.numel() - 1)) + 1))
    if ordered is not None:  # rounding to float32 keeps the order, so this is flat.kthvalue(k) exactly
        return ordered[k - 1].to(device=flat.device, dtype=flat.dtype)
    return flat.kthvalue(k).values


def _interval_ids(flat: torch.Tensor, inner_edges: torch.Tensor) -> torch.Tensor:
    """Window index of each value given sorted interior edges (a value equal to an edge goes right)."""
    return torch.bucketize(flat, inner_edges, right=True)


def assign_windows(
    theta: torch.Tensor, kind: str, *, ordered: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Window id (uint8, same shape as ``theta``) and the interior edges that define the windows.

    Returns ``(window_ids, edges)`` where ``edges`` holds the W−1 interior boundaries of the compacted,
    non-empty windows (empty for ``none``). ``ordered``: θ's values sorted ascending, when the caller has
    them (the quantiles are read off instead of three ``kthvalue`` passes).
    """
    flat = theta.detach().reshape(-1).float()
    if flat.numel() == 0:
        raise ValueError("cannot assign windows to an empty tensor")
    if kind == "none":
        return torch.zeros(theta.shape, dtype=torch.uint8, device=theta.device), flat.new_zeros(0)
    if kind == "equal":
        lo, hi = flat.min(), flat.max()
        width = (hi - lo) / NUM_WINDOWS
        edges = lo + width * torch.arange(1, NUM_WINDOWS, dtype=flat.dtype, device=flat.device)
    elif kind == "outlier":
        q1, median, q3 = (_kth(flat, q, ordered) for q in (0.25, 0.5, 0.75))
        iqr = q3 - q1
        edges = torch.stack([q1 - OUTLIER_IQR_FACTOR * iqr, median, q3 + OUTLIER_IQR_FACTOR * iqr])
        # The tails are closed intervals [min, q1 − 5·IQR] and [q3 + 5·IQR, max].
        ids = _interval_ids(flat, edges)
        ids = torch.where(flat == edges[0], torch.zeros_like(ids), ids)
        return _compact(ids, edges, theta.shape)
    else:
        raise ValueError(f"unknown window kind {kind!r}; expected 'none', 'equal' or 'outlier'")
    return _compact(_interval_ids(flat, edges), edges, theta.shape)


def _compact(ids: torch.Tensor, edges: torch.Tensor, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    counts = torch.bincount(ids, minlength=edges.numel() + 1)
    present = (counts > 0).nonzero().squeeze(1)
    remap = torch.full((edges.numel() + 1,), -1, dtype=torch.long, device=ids.device)
    remap[present] = torch.arange(present.numel(), device=ids.device)
    # Interior edge j separates windows j and j+1; keep it when both sides are non-empty windows that
    # stay adjacent after dropping empties, i.e. keep edges just below each present window but the first.
    kept_edges = edges[present[1:] - 1] if present.numel() > 1 else edges.new_zeros(0)
    return remap[ids].to(torch.uint8).reshape(shape), kept_edges
