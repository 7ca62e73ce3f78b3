"""Rates r_n, eps_n, s_n, the prior lambda, sigma_n^2 and Condition cond:bound."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqs_theory.appendix_b_rates import (
    bound_elbo_pre_algebra,
    check_bound_elbo_algebra,
    check_condition_implies_lemma_bound,
    check_footnote_sigma_n,
    check_lambda_condition,
    check_r_n_lower,
    check_sigma_n_algebra,
)
from sqs_theory.likelihood import ReluNet
from sqs_theory.rates import (
    cond_bound_sigma_sq,
    eps_n,
    lambda_condition_max_m,
    log_sigma_n_sq,
    n_params,
    neg_log_lambda,
    r_n,
    s_n,
    sigma_n_bracket,
)

from .strategies import grid_points


@given(N=st.integers(1, 50), p=st.integers(1, 50))
def test_parameter_count_matches_the_one_layer_net(N, p):
    assert n_params(1, N, p) == ReluNet(d_in=p, width=N).n_params


@given(g=grid_points(), delta=st.floats(0.1, 3.0))
def test_lambda_margin_matches_its_closed_form(g, delta):
    """M_max = delta log^{2 delta - 1}(n) A_full / A_rate (numerator and denominator below)."""
    a_full = (g.L + 1) * math.log(g.N) + math.log(math.sqrt(g.n) * g.p)
    a_rate = (g.L + 1) * math.log(g.N) + math.log(g.p * math.sqrt(g.n / g.s))
    expected = delta * math.log(g.n) ** (2 * delta - 1) * a_full / a_rate
    assert lambda_condition_max_m(g.n, g.L, g.N, g.s, g.p, delta) == pytest.approx(expected, rel=1e-9)
    assert neg_log_lambda(g.n, g.L, g.N, g.p, delta) > math.log(g.T)


@given(g=grid_points(), delta=st.floats(1.01, 3.0))
def test_lambda_condition_holds_for_delta_above_one(g, delta):
    floor = delta * math.log(g.n) ** (2 * delta - 1)
    assert lambda_condition_max_m(g.n, g.L, g.N, g.s, g.p, delta) >= floor * (1 - 1e-12)
    assert floor >= 1


def test_lambda_condition_verdicts_on_the_grid():
    assert check_lambda_condition(1.5).holds
    assert not check_lambda_condition(0.5).holds
    low = check_lambda_condition(0.25)
    assert not low.holds and low.details["lines_failing"] == low.details["lines"]
    # lambda's delta apart from s_n's (> 1, as the paper defines it): any lambda delta > 0 meets the Lemma (B10)
    assert check_lambda_condition(0.25, delta_s=1.5).holds


def test_one_delta_just_above_one_half_holds_though_m_max_starts_below_one():
    """One constant: M_max = delta·log^(2 delta − 1)(n)·A'/A diverges iff delta > 1/2. At 0.6 it grows on every
    line but starts below 1 (0.81 at n = 100 on (1, 2, 1, 1)): the Lemma asks for no lower bound."""
    verdict = check_lambda_condition(0.6)
    assert verdict.holds and verdict.details["points_M_max_below_1"] > 0


@given(g=grid_points(), delta=st.floats(1.0, 3.0))
def test_rates_relations(g, delta):
    rn = r_n(g.n, g.L, g.N, g.s, g.p)
    assert rn > 0
    assert eps_n(g.n, g.L, g.N, g.s, g.p, delta) ** 2 == pytest.approx(rn * math.log(g.n) ** (2 * delta), rel=1e-12)
    assert s_n(g.s, g.n, delta) >= g.s
    assert g.s / (2 * g.n) <= rn


@given(
    n=st.floats(1e2, 1e12),
    s=st.integers(1, 1000),
    L=st.integers(1, 8),
    N=st.integers(2, 256),
    p=st.integers(1, 100),
)
def test_sigma_n_definition_needs_the_square(n, s, L, N, p):
    B = 3.0
    verdict = check_sigma_n_algebra(n, s, L, N, p, B)
    assert not verdict.holds
    assert verdict.details["lhs_squared_sigma"] == pytest.approx(s / (2 * n), rel=1e-9)
    ratio = sigma_n_bracket(p, B, N, True) / sigma_n_bracket(p, B, N, False)
    assert verdict.details["ratio"] == pytest.approx(ratio, rel=1e-9) and ratio > 1


@given(L=st.integers(1, 8), N=st.integers(2, 128), p=st.integers(1, 100), B=st.floats(2.01, 6.0))
def test_some_algebra_chain_is_an_upper_bound(L, N, p, B):
    final = 2 * (2 * B * N) ** (2 * L) * sigma_n_bracket(p, B, N, True)
    assert bound_elbo_pre_algebra(L, N, p, B) <= final * (1 + 1e-12)


def test_grid_verdicts():
    assert check_bound_elbo_algebra().holds
    assert check_r_n_lower().holds
    foot = check_footnote_sigma_n()
    assert foot.holds and foot.details["T"] != foot.details["NL"]
    assert check_condition_implies_lemma_bound(1.5).holds


@given(g=grid_points())
def test_sigma_n_is_tiny_and_satisfies_condition_bound(g):
    bound = cond_bound_sigma_sq(g.T, g.n, r_n(g.n, g.L, g.N, g.s, g.p))
    if not math.isnan(bound):
        assert log_sigma_n_sq(g.n, g.s, g.L, g.N, g.p, 3.0) <= math.log(bound)


@given(
    n=st.floats(1.0 + 1e-9, 1e300),
    s=st.floats(1e-300, 1e300),
    L=st.integers(1, 10**9),
    N=st.integers(1, 10**9),
    p=st.integers(1, 10**6),
    delta=st.floats(1e-6, 1e6),
)
def test_rates_are_never_nan_over_the_whole_float_range(n, s, L, N, p, delta):
    """r_n's literal form gave 0 * inf = NaN (n = 1e100, s = 1e-300) and M_max 0 / 0 (N = 1, s = n p^2); each
    is finite, ±inf or 0 now, or a ValueError naming r_n < 0, and equals the literal form where its parts fit."""
    rate, margin = r_n(n, L, N, s, p), lambda_condition_max_m(n, L, N, s, p, delta)
    assert not math.isnan(rate) and not math.isnan(margin) and margin >= 0
    assert not math.isnan(s_n(s, n, delta))
    if rate >= 0:
        assert not math.isnan(eps_n(n, L, N, s, p, delta))
    else:
        with pytest.raises(ValueError, match=r"r_n = .* < 0"):
            eps_n(n, L, N, s, p, delta)
    try:
        literal = (L + 1) * s / n * math.log(N) + s / n * math.log(p * math.sqrt(n / s))
    except (OverflowError, ValueError, ZeroDivisionError):
        return
    if math.isfinite(literal) and s / n > 1e-300:  # to rounding of its terms (they may cancel)
        scale = s / n * ((L + 1) * math.log(N) + math.log(p) + 0.5 * abs(math.log(n) - math.log(s)))
        assert rate == pytest.approx(literal, rel=1e-9, abs=1e-12 * scale)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((0, 1.5, 6), "p"),  # 1.28: a bracket of a network without inputs
        ((-3, 1.5, 6), "p"),  # -1.86, a negative bracket whose log is NaN
        ((2.5, 1.5, 6), "p"),
        ((2, math.inf, 6), "B"),  # 9.0, as if B·N were infinite
        ((2, 1.5, 0.5), "N"),  # named as B·N <= 1 before
    ],
)
def test_sigma_n_bracket_refuses_what_its_proof_does_not_define(args, name):
    with pytest.raises(ValueError, match=rf"^{name} must be .* \(in sigma_n_bracket\)$"):
        sigma_n_bracket(*args, True)


@given(g=grid_points(), delta=st.floats(0.01, 3.0))
def test_condition_bound_and_the_theorems_lambda_are_the_papers_formulas(g, delta):
    """Condition cond:bound (σ_k² ≤ 1 / (2 log(T / (r_n log² n)))) and the Theorem's −log λ = log T + δ[(L + 1) log N
    + log(√n p)], each written out term by term here: changing log² n to log n, or √n to n, passed the whole theory
    suite before (a mutation run, session 63)."""
    T, rn, log_n = g.T, r_n(g.n, g.L, g.N, g.s, g.p), math.log(g.n)
    log_arg = math.log(T) - math.log(rn) - 2 * math.log(log_n) if rn > 0 else -math.inf
    bound = cond_bound_sigma_sq(T, g.n, rn)
    if log_arg > 0:
        assert bound == pytest.approx(0.5 / log_arg, rel=1e-9)
    else:
        assert math.isnan(bound)
    lam = math.log(T) + delta * (g.L + 1) * math.log(g.N) + delta * (0.5 * log_n + math.log(g.p))
    assert neg_log_lambda(g.n, g.L, g.N, g.p, delta) == pytest.approx(lam, rel=1e-12)
