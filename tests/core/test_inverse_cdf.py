"""discrete.inverse_cdf against a float64 brute force: the first k with cdf_k > u · Σ probs, on rows that are not
normalised (the artifact's float16 φ with entries below the floor zeroed), and u = 0 (torch.rand can return it)
never picks a level of probability 0."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sqs_core.discrete import inverse_cdf


def _brute(probs, u):
    out = []
    for row, x in zip(probs.double().tolist(), u.double().tolist(), strict=True):
        total, c = sum(row), 0.0
        pick = len(row) - 1
        for k, v in enumerate(row):
            c += v
            if c > x * total:
                pick = k
                break
        out.append(pick)
    return torch.tensor(out)


def test_u_zero_skips_leading_zero_probabilities():
    probs = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.5], [0.3, 0.0, 0.7]])
    assert inverse_cdf(probs, torch.zeros(3)).tolist() == [2, 1, 0]


@settings(max_examples=60)
@given(
    rows=st.lists(
        st.lists(st.sampled_from([0.0, 0.125, 0.25, 0.375, 0.5, 0.75]), min_size=2, max_size=5).filter(
            lambda r: sum(r) > 0
        ),
        min_size=1,
        max_size=8,
    ),
    us=st.lists(st.sampled_from([0.0, 0.0625, 0.25, 0.4375, 0.5, 0.8125, 0.96875]), min_size=8, max_size=8),
)
def test_inverse_cdf_matches_brute_force_on_unnormalised_rows(rows, us):
    width = max(len(r) for r in rows)
    probs = torch.tensor([r + [0.0] * (width - len(r)) for r in rows])
    u = torch.tensor(us[: len(rows)])
    assert inverse_cdf(probs, u).tolist() == _brute(probs, u).tolist()
