"""The rates of Appendix B against the paper's formulas written out term by term (moderate ranges, plain floats).

s_n = s* log^(2δ-1) n (Sec. 3.2, line 403); r_n = ((L+1) s/n) log N + (s/n) log(p sqrt(n/s)) (def_sstar);
σ_n² = s*/(32n) · log(3N)^-1 · (2BN)^(-2L) · {(p+1+1/(BN-1)) + 1/((2BN)²-1) + 2/(2BN-1)²}^-1 (line 1002);
T = (p+1)N + (L-1)(N+1)N + (N+1)."""

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqs_theory.rates import eps_n, log_sigma_n_sq, n_params, r_n, s_n, sigma_n_bracket

ns = st.floats(1e2, 1e12)
Ls, Ns, ps = st.integers(1, 8), st.integers(2, 128), st.integers(1, 100)
ss = st.integers(1, 1000)
deltas = st.floats(0.3, 3.0)
Bs = st.floats(1.0, 6.0)


@given(s=ss, n=ns, delta=deltas)
def test_s_n(s, n, delta):
    assert s_n(s, n, delta) == pytest.approx(s * math.log(n) ** (2 * delta - 1), rel=1e-12)


@given(n=ns, L=Ls, N=Ns, s=ss, p=ps, delta=deltas)
def test_r_n_and_eps_n(n, L, N, s, p, delta):
    rn = ((L + 1) * s / n) * math.log(N) + (s / n) * math.log(p * math.sqrt(n / s))
    assert r_n(n, L, N, s, p) == pytest.approx(rn, rel=1e-10)
    assert eps_n(n, L, N, s, p, delta) == pytest.approx(math.sqrt(rn) * math.log(n) ** delta, rel=1e-10)


@given(p=ps, N=Ns, B=Bs, squared=st.booleans())
def test_sigma_n_bracket(p, N, B, squared):
    first = p + 1 + 1 / (B * N - 1)
    expected = (first**2 if squared else first) + 1 / ((2 * B * N) ** 2 - 1) + 2 / (2 * B * N - 1) ** 2
    assert sigma_n_bracket(p, B, N, squared) == pytest.approx(expected, rel=1e-12)


@given(n=ns, s=ss, L=st.integers(1, 4), N=st.integers(2, 16), p=ps, B=Bs)
def test_log_sigma_n_sq(n, s, L, N, p, B):
    bracket = (p + 1 + 1 / (B * N - 1)) + 1 / ((2 * B * N) ** 2 - 1) + 2 / (2 * B * N - 1) ** 2
    sigma_sq = s / (32 * n) / math.log(3 * N) * (2 * B * N) ** (-2 * L) / bracket
    assert log_sigma_n_sq(n, s, L, N, p, B) == pytest.approx(math.log(sigma_sq), rel=1e-10)


@given(L=Ls, N=Ns, p=ps)
def test_n_params_counts_every_weight_and_bias(L, N, p):
    sizes = [p] + [N] * L + [1]
    assert n_params(L, N, p) == sum((a + 1) * b for a, b in itertools.pairwise(sizes))
