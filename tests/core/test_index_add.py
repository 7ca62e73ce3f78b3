"""sqs_core._index_add: side-by-side sums (index_add_, or scatter_add_ for int64 indices on the CPU) give the
same bits as index_add_ one after another."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqs_core._index_add import index_add_all


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the worker runs only with more than one torch thread
    yield
    torch.set_num_threads(before)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # the fixture holds
@given(
    seed=st.integers(0, 10_000),
    jobs=st.integers(1, 4),
    n=st.sampled_from([0, 1, 7, 5000, 70_000]),
    size=st.integers(1, 300),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
)
def test_matches_index_add_in_turn(two_threads, seed, jobs, n, size, dtype, index_dtype):
    g = torch.Generator().manual_seed(seed)
    work = [
        (
            torch.zeros(size, dtype=dtype),
            torch.randint(0, size, (n,), generator=g).to(index_dtype),
            (
                torch.randn(n, generator=g, dtype=torch.float64) * torch.rand(n, generator=g, dtype=torch.float64) * 1e3
            ).to(dtype),
        )
        for _ in range(jobs)
    ]
    want = [acc.clone().index_add_(0, index, source) for acc, index, source in work]
    index_add_all(work)
    for (acc, _, _), expected in zip(work, want, strict=True):
        assert torch.equal(acc, expected)


def test_a_failing_job_raises_after_the_others_finish(two_threads):
    good = torch.zeros(4)
    jobs = [(torch.zeros(4), torch.tensor([9]), torch.ones(1)), (good, torch.tensor([1]), torch.ones(1))]
    with pytest.raises((IndexError, RuntimeError)):  # index_add_: IndexError; scatter_add_: RuntimeError
        index_add_all(jobs)
    assert good[1] == 1  # the worker's job ran to the end before the error surfaced
