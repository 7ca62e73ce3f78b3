"""sqs_core._index_add: the sums of index_add_ in a fixed order on the CPU (ROWS parts of a long job, then the
rest), the same bits with any number of threads, and within float rounding of index_add_'s serial sums; the
accelerator's split (many rows, summed by sum(0)) in its arithmetic, run here on the CPU (tests/core/test_cuda.py
runs it on a GPU)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sqs_core import _index_add
from sqs_core._index_add import (
    DEVICE_MAX_ENTRIES,
    DEVICE_MIN_ROW,
    DEVICE_ROWS,
    MIN_ROW,
    ROWS,
    index_add_all,
    row_count,
    sum_in_rows,
)

SIZES = [0, 1, 7, 5000, ROWS * MIN_ROW - 1, ROWS * MIN_ROW, ROWS * MIN_ROW + 37, 3 * ROWS * MIN_ROW + 5]


def _jobs(seed, jobs, n, size, dtype, index_dtype):
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(size, generator=g, dtype=torch.float64).to(dtype),  # a nonzero start: added to, not replaced
            torch.randint(0, size, (n,), generator=g).to(index_dtype),
            (
                torch.randn(n, generator=g, dtype=torch.float64) * torch.rand(n, generator=g, dtype=torch.float64) * 1e3
            ).to(dtype),
        )
        for _ in range(jobs)
    ]


def _in_rows(acc, index, source):
    """The documented order, written out with index_add_'s serial loop: each full row into zeros, the rows
    added in order, then the rest."""
    acc = acc.clone()
    length = index.numel() // ROWS
    if index.dtype != torch.int64 or length < MIN_ROW or acc.numel() * ROWS > index.numel():
        return acc.index_add_(0, index, source)
    for row in range(ROWS):
        part = slice(row * length, (row + 1) * length)
        acc += torch.zeros_like(acc).index_add_(0, index[part], source[part])
    return acc.index_add_(0, index[ROWS * length :], source[ROWS * length :])


@given(
    seed=st.integers(0, 10_000),
    jobs=st.integers(1, 3),
    n=st.sampled_from(SIZES),
    size=st.sampled_from([1, 3, 128, 300, 5000]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
)
def test_the_sums_follow_the_documented_order_with_any_thread_count(seed, jobs, n, size, dtype, index_dtype):
    want = [_in_rows(*job) for job in _jobs(seed, jobs, n, size, dtype, index_dtype)]
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            work = _jobs(seed, jobs, n, size, dtype, index_dtype)
            index_add_all(work)
            for (acc, _, _), expected in zip(work, want, strict=True):
                assert torch.equal(acc, expected), threads
    finally:
        torch.set_num_threads(before)


@given(seed=st.integers(0, 10_000), n=st.sampled_from(SIZES[4:]), size=st.sampled_from([1, 128, 300]))
def test_the_sums_are_index_adds_within_float64_rounding(seed, n, size):
    ((acc, index, source),) = _jobs(seed, 1, n, size, torch.float64, torch.int64)
    want = acc.clone().index_add_(0, index, source)
    bound = torch.zeros_like(acc).index_add_(0, index, source.abs()) + acc.abs()
    index_add_all([(acc, index, source)])
    assert bool(((acc - want).abs() <= 4 * n * torch.finfo(torch.float64).eps * bound).all())


def test_a_long_job_is_summed_in_rows():
    """The split runs where the docstring says (the sorting 1-D path is not taken for a long int64 job)."""
    ((acc, index, source),) = _jobs(0, 1, ROWS * MIN_ROW, 128, torch.float64, torch.int64)
    calls = []
    original = torch.Tensor.scatter_add_

    def spy(self, dim, *args):
        calls.append((self.dim(), dim))
        return original(self, dim, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "scatter_add_", spy)
        _index_add.index_add_all([(acc, index, source)])
    assert calls == [(2, 1)]


def test_a_bad_index_raises():
    with pytest.raises((IndexError, RuntimeError)):  # index_add_: IndexError; scatter_add_: RuntimeError
        index_add_all([(torch.zeros(4), torch.tensor([9]), torch.ones(1))])


@given(
    seed=st.integers(0, 10_000),
    rows=st.integers(1, 300),
    n=st.integers(0, 20_000),
    size=st.sampled_from([1, 3, 128, 300]),
)
def test_the_accelerator_split_sums_as_index_add_within_float64_rounding(seed, rows, n, size):
    """sum_in_rows as an accelerator runs it (partial sums added by sum(0), the rest by one scatter), here on
    the CPU: the same sums as index_add_, whatever rows and leftover."""
    ((acc, index, source),) = _jobs(seed, 1, n, size, torch.float64, torch.int64)
    want = acc.clone().index_add_(0, index, source)
    bound = torch.zeros_like(acc).index_add_(0, index, source.abs()) + acc.abs()
    if n // rows == 0:
        rows = max(n, 1)
    sum_in_rows(acc, index, source, rows, in_order=False)
    assert bool(((acc - want).abs() <= 4 * max(n, 1) * torch.finfo(torch.float64).eps * bound).all())


def test_the_row_counts_follow_the_documented_limits():
    assert row_count("cpu", 128, ROWS * MIN_ROW) == ROWS
    assert row_count("cpu", 128, ROWS * MIN_ROW - 1) == 0
    assert row_count("cpu", ROWS * MIN_ROW + 1, ROWS * MIN_ROW) == 0  # more entries than sources per row
    assert row_count("cuda", 128, 1 << 20) == DEVICE_ROWS
    assert row_count("cuda", 128, 5 * DEVICE_MIN_ROW + 3) == 5
    assert row_count("cuda", 128, 2 * DEVICE_MIN_ROW - 1) == 0  # one row: index_add_ itself
    assert row_count("cuda", DEVICE_MAX_ENTRIES, 1 << 24) == DEVICE_ROWS
    assert row_count("cuda", DEVICE_MAX_ENTRIES + 1, 1 << 24) == 0  # many entries: index_add_ itself
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert row_count("cuda", 128, 1 << 20) == 0  # torch's deterministic index_add_
        assert row_count("cpu", 128, ROWS * MIN_ROW) == ROWS  # deterministic already
    finally:
        torch.use_deterministic_algorithms(before)
