"""Indices of the entries that pass a test, found chunk by chunk, and grouped by class (sqs_core.onehot)."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["INDEX_CHUNK", "flat_indices", "grouped_by_class"]

INDEX_CHUNK = 1 << 20  # entries of a bool mask per nonzero call in flat_indices


def flat_indices(
    values: torch.Tensor,
    dtype: torch.dtype = torch.int64,
    *,
    test: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The indices of the true entries of a flat bool mask, as ``mask.nonzero()`` but as ``dtype`` (int64 past
    2³¹ − 1 entries), found INDEX_CHUNK entries at a time, so that asking for int32 makes no int64 index of
    all of them on the way. int32 is for indices kept a while (a compiled training step keeps its uncovered
    weights' from forward to backward: 4 bytes each, not 8); eager indexing with int32 is 10–50% slower.
    ``values`` is the mask itself, or with ``test`` any flat tensor whose mask ``test(part)`` gives for each
    INDEX_CHUNK part (a bool mask, or any tensor non-zero where the mask is true), so that no bool tensor of
    all entries is made (a T-sized one is fresh memory, mapped and zeroed, every step). On an accelerator,
    one ``nonzero`` (each waits for the device; its allocator reuses the memory)."""
    if values.numel() > torch.iinfo(torch.int32).max:
        dtype = torch.int64
    chunk = INDEX_CHUNK if values.device.type == "cpu" else max(values.numel(), 1)
    starts = range(0, max(values.numel(), 1), chunk)  # an empty tensor: one empty part
    select = (lambda part: part) if test is None else test
    parts = [select(values[a : a + chunk]).nonzero().squeeze(1).to(dtype).add_(a) for a in starts]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def grouped_by_class(indices, index_classes):
    """(``indices`` reordered by class, ascending within each class (a stable sort), {class: (first position,
    count)} of the classes present)."""
    ordered_classes, order = torch.sort(index_classes, stable=True)
    values, counts = (t.tolist() for t in torch.unique_consecutive(ordered_classes, return_counts=True))
    firsts = [sum(counts[:i]) for i in range(len(counts))]
    return indices.index_select(0, order), dict(zip(values, zip(firsts, counts, strict=True), strict=True))
