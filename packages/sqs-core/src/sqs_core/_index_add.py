"""Deterministic float64 sums of per-weight gradient terms into the small (W, K) parameters.

A training step's backward sums millions of per-weight terms into a few hundred entries, with
``acc.index_add_(0, index, source)`` semantics. Atomic adds would make the bits depend on scheduling; here
every sum is taken in an order fixed by the sizes alone, so a step gives the same bits on every run and
with any number of threads.

On the CPU a flat accumulator with an int64 index and at least ``ROWS`` × ``MIN_ROW`` sources (and no more
entries than sources / ``ROWS``) is summed in ``ROWS`` parts: the sources are cut into ``ROWS`` equal rows,
a 2-D ``scatter_add_`` along the rows sums each row into its own partial accumulator, in index order (torch
runs the rows in parallel), the partial accumulators are added to ``acc`` in row order, and the sources left
over after the last full row are added last, in index order. Against the 1-D ``scatter_add_`` (which sorts
the index, then sums each entry's sources in their original order) on session 31's Intel Xeon (2 threads):
0.52 against 0.99 ms per 2^20 float64 sources into 128 entries, and the compiled 4096² step (2,048 tokens,
step-50 state) 1.07–1.08 s against 1.13–1.15 s, the eager one 1.96 against 2.07 s (paired runs). Session
16 had measured the same split on an AMD EPYC and kept the 1-D sums, then run side by side on a worker
thread, for bit-identity with ``index_add_``; the rows' sums differ from that serial order by float64 rounding
only. Other jobs (few sources, int32 indices, other devices) run ``index_add_`` (1-D int64 on the CPU:
``scatter_add_``, the same bits, faster), one after another.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["MIN_ROW", "ROWS", "index_add_all"]

ROWS = 16  # parts of a long sum: a constant, so that the bits do not depend on the number of threads
MIN_ROW = 4096  # sources per part below which a job is summed in one piece


def index_add_all(jobs: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
    """``acc.index_add_(0, index, source)`` for every ``(acc, index, source)``, in turn, each in the fixed
    order of the module docstring (float64 rounding apart, the same sums)."""
    for acc, index, source in jobs:
        if acc.device.type != "cpu" or acc.dim() != 1 or index.dtype != torch.int64:
            acc.index_add_(0, index, source)
            continue
        length = index.numel() // ROWS
        if length < MIN_ROW or acc.numel() * ROWS > index.numel():
            acc.scatter_add_(0, index, source)  # index_add_'s sums in its order (module docstring)
            continue
        head = ROWS * length
        parts = acc.new_zeros(ROWS, acc.numel())
        parts.scatter_add_(1, index[:head].reshape(ROWS, length), source[:head].reshape(ROWS, length))
        for part in parts:  # in row order
            acc += part
        if head < index.numel():
            acc.scatter_add_(0, index[head:], source[head:])
