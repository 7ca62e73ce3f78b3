"""float64 sums of per-weight gradient terms into the small (W, K) parameters, deterministic on the CPU.

A training step's backward sums millions of per-weight terms into a few hundred entries, with
``acc.index_add_(0, index, source)`` semantics. Atomic adds would make the bits depend on scheduling; on the
CPU every sum is taken in an order fixed by the sizes alone, so a step gives the same bits on every run and
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
only.

On an accelerator (CUDA) the same split serves another end: ``index_add_`` there is one atomic add per source,
and millions of them meet at a few hundred addresses (session 30's H200 profile: 9 of the eager step's 31 ms
of GPU time). A long job into at most ``DEVICE_MAX_ENTRIES`` entries is cut into up to ``DEVICE_ROWS`` rows of
at least ``DEVICE_MIN_ROW`` sources, each summed into its own partial accumulator (a few adds per address), the
partial accumulators summed by ``sum(0)``, then the rest added. On session 33's H200, per 2^20 float64 sources:
0.046 against 0.307 ms (``index_add_``) into 128 entries, 0.044 against 0.051 ms into 1,024, but 0.041 against
0.031 ms into 4,096 and 0.042 against 0.019 ms into 16,384, where the atomic adds spread out by themselves:
hence the cap on entries. Atomic adds make the last bits vary between runs there, as ``index_add_``'s do; with
``torch.use_deterministic_algorithms(True)`` every job runs ``index_add_`` (torch's deterministic one).

Other jobs (few sources, int32 indices) run ``index_add_`` (1-D int64 on the CPU: ``scatter_add_``, the same
bits, faster), one after another.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["DEVICE_MAX_ENTRIES", "DEVICE_MIN_ROW", "DEVICE_ROWS", "MIN_ROW", "ROWS", "index_add_all"]

ROWS = 16  # parts of a long sum: a constant, so that the bits do not depend on the number of threads
MIN_ROW = 4096  # sources per part below which a job is summed in one piece
DEVICE_ROWS = 1024  # on an accelerator: at most this many parts, so that few atomic adds meet at one address
DEVICE_MIN_ROW = 1024  # sources per part, at least, on an accelerator
DEVICE_MAX_ENTRIES = 1024  # on an accelerator: entries above which index_add_ is as fast (module docstring)


def index_add_all(jobs: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
    """``acc.index_add_(0, index, source)`` for every ``(acc, index, source)``, in turn, each in the fixed
    order of the module docstring (float64 rounding apart, the same sums)."""
    for acc, index, source in jobs:
        one_d_int64 = acc.dim() == 1 and index.dtype == torch.int64
        rows = row_count(acc.device.type, acc.numel(), index.numel()) if one_d_int64 else 0
        if rows:
            sum_in_rows(acc, index, source, rows, in_order=acc.device.type == "cpu")
        elif one_d_int64 and acc.device.type == "cpu":
            acc.scatter_add_(0, index, source)  # index_add_'s sums in its order (module docstring)
        else:
            acc.index_add_(0, index, source)


def row_count(device_type: str, entries: int, sources: int) -> int:
    """How many rows a job of ``sources`` sources into ``entries`` entries is summed in on ``device_type``
    (module docstring); 0: in one piece."""
    if device_type == "cpu":
        return ROWS if sources // ROWS >= MIN_ROW and entries * ROWS <= sources else 0
    if torch.are_deterministic_algorithms_enabled():
        return 0
    rows = min(DEVICE_ROWS, sources // DEVICE_MIN_ROW)
    return rows if rows >= 2 and entries <= DEVICE_MAX_ENTRIES else 0


def sum_in_rows(acc: torch.Tensor, index: torch.Tensor, source: torch.Tensor, rows: int, *, in_order: bool) -> None:
    """Add the first ``rows`` equal rows of sources to ``acc`` through one partial accumulator each, the
    partial accumulators in row order (``in_order``) or by ``sum(0)``, then the sources left over."""
    length = index.numel() // rows
    head = rows * length
    parts = acc.new_zeros(rows + 1, acc.numel())  # row 0: acc itself, so that a running sum starts from it
    parts[1:].scatter_add_(1, index[:head].reshape(rows, length), source[:head].reshape(rows, length))
    if in_order and acc.dtype == torch.float64:
        # acc + part 1 + part 2 + ... in that order: the last row of a cumulative sum, one op (16 adds took
        # 0.04-0.05 ms more a job, ~7 ms of a compiled 4096² step's 151 jobs; session 51). float64 only: the CPU
        # cumsum of float32 accumulates in float64, other bits than float32 adds
        parts[0] = acc
        acc.copy_(parts.cumsum(0)[-1])
    elif in_order:
        for part in parts[1:]:
            acc += part
    else:
        acc += parts[1:].sum(0)
    if head < index.numel():
        acc.scatter_add_(0, index[head:], source[head:])
