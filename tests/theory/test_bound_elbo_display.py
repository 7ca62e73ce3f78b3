"""bound_elbo_pre_algebra against the paper's display after 'Combined with Equation (20)' (sec. B, line 1112),
divided by 8 sigma_n^2 log(3N), summed by hand for L = 1 and 2 (c = p + 1 + 1/(BN - 1)):
L = 1: 2c^2 + 2;   L = 2: 2N^2 c^2 (4B^2 + B^2 + 2*2B^2) + 2(4B^2N^2 + 1 + 2*2BN) = 18 B^2 N^2 c^2 + 2 (2BN + 1)^2.

Gap: the factor 2 of either cross sum dropped passed the suite (the check only asks the display to be <= the
final expression, which a smaller display still is)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqs_theory.appendix_b_rates import bound_elbo_pre_algebra


@given(N=st.integers(1, 64), p=st.integers(1, 50), B=st.floats(1.5, 6.0))
def test_display_for_one_and_two_layers(N, p, B):
    c = p + 1 + 1 / (B * N - 1)
    assert bound_elbo_pre_algebra(1, N, p, B) == pytest.approx(2 * c * c + 2, rel=1e-12)
    two = 18 * B * B * N * N * c * c + 2 * (2 * B * N + 1) ** 2
    assert bound_elbo_pre_algebra(2, N, p, B) == pytest.approx(two, rel=1e-12)
