"""Appendix B, proof of Lemma bound_elbo: Gaussian moments, tau conditions, sup bounds, Lemma bound."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy.stats import norm
from sqs_theory.appendix_b import (
    abs_mgf,
    abs_mgf_quad,
    check_gaussian_abs_mgf,
    check_log_slip,
    check_mu_separation,
    check_shifted_abs_mgf,
    check_squared_mgf,
    check_sup_bound_mc,
    check_tau_condition,
    check_tau_condition_squared,
    log_abs_mgf,
)
from sqs_theory.appendix_b_rates import check_chernoff_tail, check_lower_tail_typo, check_prior_variance_typo

ts = st.floats(0.01, 5.0)
sigmas = st.floats(0.05, 0.8)  # t sigma <= 4: the factor Phi(t sigma) is visible
gaps = st.floats(-4.0, 4.0)
widths = st.integers(2, 64)


@given(t=ts, sigma=sigmas, d=gaps)
def test_abs_mgf_closed_form_matches_quadrature(t, sigma, d):
    assert abs_mgf(t, sigma, d) == pytest.approx(abs_mgf_quad(t, sigma, d), rel=1e-9)


@given(t=ts, sigma=sigmas)
def test_paper_abs_mgf_is_off_by_the_factor_phi(t, sigma):
    verdict = check_gaussian_abs_mgf(t, sigma)
    assert not verdict.holds
    ratio = verdict.details["paper"] / verdict.details["quadrature"]
    assert ratio == pytest.approx(1 / norm.cdf(t * sigma), rel=1e-9)
    assert ratio > 1  # as an inequality the paper's value is still a valid upper bound


@given(t=ts, sigma=sigmas, d=st.floats(-4.0, -0.05))
def test_paper_shifted_abs_mgf_is_too_small_for_negative_shift(t, sigma, d):
    """Jensen: true >= exp(t|d|) > 2 exp(-t|d| + t^2 s^2/2) = paper once 2t|d| > log 2 + t^2 s^2/2."""
    assume(2 * t * abs(d) > math.log(2) + t * t * sigma * sigma / 2 + 1e-6)
    verdict = check_shifted_abs_mgf(t, sigma, d)
    assert not verdict.holds
    assert verdict.details["paper"] < verdict.details["quadrature"]


@given(t=ts, sigma=sigmas, d=gaps)
def test_shifted_abs_mgf_valid_bound(t, sigma, d):
    assert log_abs_mgf(t, sigma, d) <= math.log(2) + t * abs(d) + t * t * sigma * sigma / 2 + 1e-12


@given(B=st.floats(2.01, 10.0))
def test_separation_four_fails_for_every_bound_above_two(B):
    verdict = check_mu_separation(B)
    assert not verdict.holds
    assert verdict.details["max_separation"] > 4


@given(t=st.floats(0.01, 1.0), sigma=st.floats(0.05, 0.6), d=gaps)
def test_squared_mgf_closed_form_matches_quadrature(t, sigma, d):
    if 2 * t * sigma * sigma >= 0.9:
        t = 0.45 / (sigma * sigma)
    assert check_squared_mgf(t, sigma, d).holds


@given(N=widths, sigma=st.floats(0.01, 1.0))
def test_log_slip(N, sigma):
    details = check_log_slip(N, sigma).details
    assert details["corrected_lhs"] == pytest.approx(details["claimed_value"], rel=1e-12)
    assert details["paper_lhs"] > details["claimed_value"]
    assert details["claimed_value"] <= details["final"]


@given(N=widths, sigma=st.floats(0.01, 0.2), gap=st.floats(0.5, 4.0))
def test_paper_tau_condition_is_insufficient(N, sigma, gap):
    assert not check_tau_condition(N, sigma, gap, phi_o=0.5).holds


@given(N=widths, sigma=st.floats(0.01, 1.0), gap=st.floats(0.0, 4.0))
def test_corrected_tau_condition_suffices(N, sigma, gap):
    t = math.sqrt(2 * math.log(3 * N * N)) / sigma
    phi_o = 0.5 * math.exp(-4 * t)
    if phi_o > 0:  # below float range the corrected condition is phi_o = 0, covered by the MC test
        assert check_tau_condition(N, sigma, gap, phi_o=phi_o).holds


@settings(max_examples=10)
@given(N=st.integers(2, 8), sigma=st.floats(0.01, 1.0))
def test_sup_bounds_hold_without_off_components(N, sigma):
    verdict = check_sup_bound_mc(N, sigma, 1.0, phi_o=0.0)
    assert verdict.holds, verdict.details


def test_sup_bounds_fail_under_the_papers_tau_condition():
    verdict = check_sup_bound_mc(4, 0.05, 1.0, phi_o=0.5)
    assert not verdict.holds
    assert verdict.details["sup_abs"] > 3 * verdict.details["bound_abs"]


@given(N=st.integers(2, 16), sigma=st.floats(0.01, 1.0), gap=st.floats(0.5, 4.0))
def test_squared_tau_condition_is_vacuous(N, sigma, gap):
    verdict = check_tau_condition_squared(N, sigma, gap)
    assert verdict.details["log_condition_rhs"] > 0  # RHS exp(...) > 1 >= any probability
    assert not verdict.holds


def test_chernoff_step_of_lemma_bound_holds():
    assert check_chernoff_tail().holds


@given(B=st.floats(2.01, 6.0), sigma=st.floats(0.1, 1.0))
def test_lower_tail_uses_the_wrong_centre(B, sigma):
    verdict = check_lower_tail_typo(B, sigma)
    assert not verdict.holds
    quad = integrate.quad(
        lambda t: math.exp(-((t + B) ** 2) / (2 * sigma**2)) / math.sqrt(2 * math.pi * sigma**2),
        -(B + 1) - 40 * sigma,
        -(B + 1),
        epsabs=0,
        epsrel=1e-12,
        limit=200,
    )[0]
    assert verdict.details["q_mass_mu=-B"] == pytest.approx(quad, rel=1e-9)


def test_prior_variance_typo_changes_the_value():
    verdict = check_prior_variance_typo()
    assert not verdict.holds
    assert verdict.details["kl_to_N(0,sigma_n^2)"] > 10 * verdict.details["kl_to_N(0,sigma_0^2)"]
