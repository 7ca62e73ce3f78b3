"""Appendix A / B checks: their bounds are the paper's (replacement bound written out) and each check says NO on a
violating instance. Every loosening below passed the theory tests that cover these modules (all instances hold)."""

import math

import numpy as np
import pytest
from sqs_theory import appendix_a as A
from sqs_theory import appendix_b_rates as R
from sqs_theory.checks import random_posterior
from sqs_theory.kl import GaussianMixture
from sqs_theory.rates import GridPoint


def _kl_n(mu, var, var0):  # KL(N(mu, var) || N(0, var0)) written out
    return 0.5 * (math.log(var0 / var) + var / var0 + mu * mu / var0 - 1)


def test_replacement_bound_is_phi_star_kl_star_plus_rest():
    slab = GaussianMixture(
        weights=np.array([0.5, 0.3, 0.2]), means=np.array([0.4, -1.5, 2.0]), variances=np.array([0.3, 0.05, 0.6])
    )
    s0 = 1.7
    kls = [_kl_n(m, v, s0) for m, v in zip(slab.means, slab.variances, strict=True)]
    expected = 0.5 * kls[0] + 0.5 * max(kls[1], kls[2])
    err_bound = 0.5 * max(abs(k - kls[0]) for k in kls)
    v = A.check_replacement_bound(slab, s0)
    assert v.details["bound"] == pytest.approx(expected, rel=1e-12)
    assert v.details["error_bound"] == pytest.approx(err_bound, rel=1e-12)
    assert v.details["part2_error"] == pytest.approx(abs(float(np.dot(slab.weights, kls)) - kls[0]), rel=1e-12)


def test_plugin_linear_fails_when_the_plugin_exceeds_the_expectation(monkeypatch):
    rng = np.random.default_rng(0)
    post = random_posterior(rng, 4, 2, level_var=0.0)
    X, y = rng.normal(size=(5, 4)), rng.normal(size=5)
    assert A.check_plugin_linear(post, X, y, 0.5).holds
    closed = A.linear_expected_nll(post, X, y, 0.5)
    monkeypatch.setattr(A, "plugin_nll", lambda *a: closed + 0.5)  # plug-in above E_q NLL: the bound is violated
    assert not A.check_plugin_linear(post, X, y, 0.5).holds


def test_lambda_condition_fails_on_a_flat_line():
    # M_max does not grow between two points of one line at the same n: not a diverging sequence
    g = GridPoint(n=1e4, L=2, N=8, s=10, p=10)
    assert not R.check_lambda_condition(1.5, [g, g]).holds
    assert R.check_lambda_condition(1.5, [g, GridPoint(n=1e6, L=2, N=8, s=10, p=10)]).holds


def test_footnote_fails_when_sigma_n_exceeds_the_condition(monkeypatch):
    grid = [GridPoint(n=1e4, L=2, N=8, s=10, p=10)]
    assert R.check_footnote_sigma_n(grid).holds
    monkeypatch.setattr(R, "cond_bound_sigma_sq", lambda *a: 0.01)
    monkeypatch.setattr(R, "log_sigma_n_sq", lambda *a, **k: math.log(0.01) + 0.5)  # sigma_n^2 = 1.65 x bound
    assert not R.check_footnote_sigma_n(grid).holds


def test_plugin_linear_fails_when_the_closed_form_disagrees_with_the_reference(monkeypatch):
    rng = np.random.default_rng(1)
    post = random_posterior(rng, 4, 2, level_var=0.05)  # stratified reference, se > 0
    X, y = rng.normal(size=(5, 4)), rng.normal(size=5)
    v = A.check_plugin_linear(post, X, y, 0.5)
    assert v.holds and v.details["reference_se"] > 0
    closed, se = v.details["expected_closed_form"], v.details["reference_se"]
    monkeypatch.setattr(A, "linear_expected_nll", lambda *a: closed + 20 * se)  # 20 standard errors off
    assert not A.check_plugin_linear(post, X, y, 0.5).holds


def test_condition_implies_lemma_fails_when_the_condition_is_looser(monkeypatch):
    g = GridPoint(n=1e6, L=2, N=8, s=10, p=10)
    assert R.check_condition_implies_lemma_bound(1.5, [g]).holds
    eps2 = R.eps_n(g.n, g.L, g.N, g.s, g.p, 1.5) ** 2
    # a condition 1.5x the Lemma's 1/(2 log(T/eps_n^2)) does not imply it
    monkeypatch.setattr(R, "cond_bound_sigma_sq", lambda *a: 0.75 / math.log(g.T / eps2))
    assert not R.check_condition_implies_lemma_bound(1.5, [g]).holds


def test_r_n_lower_reports_the_papers_ratio():
    g = GridPoint(n=1e4, L=2, N=8, s=10, p=10)
    rn = ((g.L + 1) * g.s / g.n) * math.log(g.N) + (g.s / g.n) * math.log(g.p * math.sqrt(g.n / g.s))
    assert R.check_r_n_lower([g]).details["max_ratio"] == pytest.approx(g.s / (2 * g.n) / rn, rel=1e-10)


def test_bound_elbo_algebra_reports_display_over_final():
    N, p = 2, 1
    worst = 0.0
    for B in (2.5, 4.0):
        c = p + 1 + 1 / (B * N - 1)
        bracket = c * c + 1 / ((2 * B * N) ** 2 - 1) + 2 / (2 * B * N - 1) ** 2
        worst = max(worst, (2 * c * c + 2) / (2 * (2 * B * N) ** 2 * bracket))  # L = 1: display = 2c^2 + 2
    v = R.check_bound_elbo_algebra(Ls=(1,), Ns=(N,), ps=(p,))
    assert v.details["max_ratio_lhs_over_rhs"] == pytest.approx(worst, rel=1e-12)


def test_chernoff_tail_reports_tail_over_half_exp():
    from scipy.stats import norm

    s = 0.5
    expected = norm.sf(1 / s) / (0.5 * math.exp(-1 / (2 * s * s)))
    v = R.check_chernoff_tail(sigmas=(s,))
    assert v.details["max_ratio_tail_over_bound"] == pytest.approx(expected, rel=1e-9)
