"""sqs_core._index_add: side-by-side index_add_ gives the same bits as one after another."""

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
@given(seed=st.integers(0, 10_000), jobs=st.integers(1, 4), n=st.integers(0, 5000), size=st.integers(1, 64))
def test_matches_index_add_in_turn(two_threads, seed, jobs, n, size):
    g = torch.Generator().manual_seed(seed)
    work = [
        (
            torch.zeros(size, dtype=torch.float64),
            torch.randint(0, size, (n,), generator=g),
            torch.randn(n, generator=g, dtype=torch.float64) * 1e3,
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
    with pytest.raises(IndexError):
        index_add_all(jobs)
    assert good[1] == 1  # the worker's job ran to the end before the error surfaced
