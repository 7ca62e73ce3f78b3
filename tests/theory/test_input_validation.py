"""Input validation of the public sqs_theory functions and of the CLI: a bad value fails with a ValueError
naming the parameter (never NaN, a complex number or a wrong value returned silently), and the CLI prints
one line ``error: ...`` and exits 1, having checked its output paths before computing anything."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import sqs_theory as st_api
from hypothesis import given
from hypothesis import strategies as st
from sqs_theory import appendix_a, appendix_b, appendix_b_rates, hellinger, likelihood, rates
from sqs_theory.__main__ import main
from sqs_theory.kl import GaussianMixture

from .strategies import grid_points, hspace_params, small_vectors

non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
outside_unit = st.one_of(st.floats(max_value=-1e-9, min_value=-1e6), st.floats(min_value=1 + 1e-9, max_value=1e6))
non_positive = st.floats(min_value=-1e6, max_value=0.0)

X = np.array([0.5, -1.2, 0.3, 2.0])
SLAB = GaussianMixture.single(0.0, 1.0)
_POST = likelihood.SpikeGMMPosterior(
    lam_tilde=np.array([0.5, 1.0]), phi=np.array([[0.5, 0.5], [1.0, 0.0]]), mu=np.array([-1.0, 1.0]), var=np.zeros(2)
)


# --- the API: each bad argument is named -------------------------------------------------------------
BAD_CALLS = {
    "in_h s=nan": (lambda: st_api.in_h(X, s=math.nan, K=2, B=3), "s"),
    "in_h s=inf": (lambda: st_api.in_h(X, s=math.inf, K=2, B=3), "s"),
    "in_h theta nan": (lambda: st_api.in_h([math.nan, 0.0], s=1, K=1, B=1), "theta"),
    "index_space_size T<0": (lambda: st_api.index_space_size(-3, 2, 2), "T"),
    "index_space_size T=2.5": (lambda: st_api.index_space_size(2.5, 2, 2), "T"),
    "log_index_space_size T<0": (lambda: st_api.log_index_space_size(-3, 2, 2), "T"),
    "log_index_space_size K=0": (lambda: st_api.log_index_space_size(3, 2, 0), "K"),
    "log_index_space_size s=nan": (lambda: st_api.log_index_space_size(3, math.nan, 2), "s"),
    "project_exact B=inf": (lambda: st_api.project_exact(X, s=2, K=2, B=math.inf), "B"),
    "project_exact complex": (lambda: st_api.project_exact(X + 1j, s=2, K=2, B=3), "x"),
    "project_heuristic max_iter=0": (lambda: st_api.project_heuristic(X, s=2, K=2, B=3, max_iter=0), "max_iter"),
    "project_heuristic max_iter=-1": (lambda: st_api.project_heuristic(X, s=2, K=2, B=3, max_iter=-1), "max_iter"),
    "kl_gaussian var1<0": (lambda: st_api.kl_gaussian(0, -1, 0, 1), "var1"),
    "kl_gaussian var0=0": (lambda: st_api.kl_gaussian(0, 1, 0, 0), "var0"),
    "kl_bernoulli a>1": (lambda: st_api.kl_bernoulli(1.5, 0.5), "a"),
    "kl_bernoulli b<0": (lambda: st_api.kl_bernoulli(0.5, -0.1), "b"),
    "kl_spike_slab sigma0_sq=inf": (lambda: st_api.kl_spike_slab(0.5, SLAB, 0.5, math.inf), "sigma0_sq"),
    "kl_gaussian_prior_variant lam_tilde>1": (lambda: st_api.kl_gaussian_prior_variant(1.5, SLAB, 1.0), "lam_tilde"),
    "n_params L=nan": (lambda: st_api.n_params(math.nan, 4, 2), "L"),
    "r_n n=inf": (lambda: st_api.r_n(math.inf, 2, 4, 3, 2), "n"),
    "r_n N=0": (lambda: st_api.r_n(100, 2, 0, 3, 2), "N"),
    "r_n L<0": (lambda: st_api.r_n(100, -5, 4, 3, 2), "L"),
    "r_n p=nan": (lambda: st_api.r_n(100, 2, 4, 3, math.nan), "p"),
    "eps_n L<0": (lambda: st_api.eps_n(100, -5, 4, 3, 2, 1.5), "L"),
    "s_n n<1": (lambda: st_api.s_n(3, 0.5, 1.25), "n"),
    "s_n n=-1": (lambda: st_api.s_n(3, -1, 1.5), "n"),
    "s_n s<0": (lambda: st_api.s_n(-3, 100, 1.5), "s"),
    "neg_log_lambda n<0": (lambda: st_api.neg_log_lambda(-4, 2, 4, 2, 1.5), "n"),
    "neg_log_lambda T=0": (lambda: st_api.neg_log_lambda(100, 2, 4, 2, 1.5, T=0), "T"),
    "lambda_condition_max_m n<1": (lambda: st_api.lambda_condition_max_m(0.5, 2, 4, 3, 2, 1.25), "n"),
    "all_verdicts n_random=0": (lambda: st_api.all_verdicts(n_random=0), "n_random"),
    # Appendix B's Gaussian moments: sigma = 0 divided by zero, sigma < 0 gave a wrong value, NaN a NaN
    "log_abs_mgf sigma=0": (lambda: appendix_b.log_abs_mgf(1.0, 0.0), "sigma"),
    "log_abs_mgf sigma<0": (lambda: appendix_b.log_abs_mgf(1.0, -1.0), "sigma"),
    "log_abs_mgf t=nan": (lambda: appendix_b.log_abs_mgf(math.nan, 1.0), "t"),
    "abs_mgf d=inf": (lambda: appendix_b.abs_mgf(1.0, 1.0, math.inf), "d"),
    "abs_mgf_quad sigma=0": (lambda: appendix_b.abs_mgf_quad(1.0, 0.0), "sigma"),
    "sq_mgf_quad t >= 1/(2 sigma^2)": (lambda: appendix_b.sq_mgf_quad(1.0, 1.0), "t"),
    "sq_mgf_quad sigma=nan": (lambda: appendix_b.sq_mgf_quad(0.1, math.nan), "sigma"),
    "SpikeGMMPosterior mu=inf": (
        lambda: st_api.SpikeGMMPosterior(lam_tilde=[1.0], phi=[[1.0]], mu=[math.inf], var=[0.0]),
        "mu",
    ),
    "fit_slope ns=0": (lambda: hellinger.fit_slope([0, 1, 2], [1, 2, 3]), "ns"),
    # Appendix B's checks (each argument: ZeroDivisionError, a math domain error, NaN details or a wrong value)
    "check_log_slip N=0": (lambda: appendix_b.check_log_slip(N=0), "N"),
    "check_sup_bound_mc sigma=nan": (lambda: appendix_b.check_sup_bound_mc(sigma=math.nan), "sigma"),
    "check_tau_condition sigma=0": (lambda: appendix_b.check_tau_condition(sigma=0.0), "sigma"),
    "check_tau_condition phi_o=2": (lambda: appendix_b.check_tau_condition(phi_o=2.0), "phi_o"),
    "check_tau_condition_squared N=2.5": (lambda: appendix_b.check_tau_condition_squared(N=2.5), "N"),
    "check_squared_mgf t >= 1/(2 sigma^2)": (lambda: appendix_b.check_squared_mgf(t=2.0, sigma=1.0), "t"),
    "check_mu_separation B=inf": (lambda: appendix_b.check_mu_separation(B=math.inf), "B"),
    "check_sigma_n_algebra n=0": (lambda: appendix_b_rates.check_sigma_n_algebra(n=0), "n"),
    "check_sigma_n_algebra B·N=1": (lambda: appendix_b_rates.check_sigma_n_algebra(N=8, B=0.125), "B·N"),
    "bound_elbo_pre_algebra B·N<1": (lambda: appendix_b_rates.bound_elbo_pre_algebra(2, 2, 3, 0.25), "B·N"),
    "bound_elbo_pre_algebra L=0": (lambda: appendix_b_rates.bound_elbo_pre_algebra(0, 2, 3, 3.0), "L"),
    "check_chernoff_tail sigma=0": (lambda: appendix_b_rates.check_chernoff_tail(sigmas=(0.1, 0.0)), "sigmas"),
    "check_lower_tail_typo sigma<0": (lambda: appendix_b_rates.check_lower_tail_typo(sigma=-0.3), "sigma"),
    "check_plugin_relu noise_var=0": (lambda: appendix_a.check_plugin_relu(noise_var=0.0), "noise_var"),  # NaN
    "check_spike_slab_identity tol=nan": (
        lambda: appendix_a.check_spike_slab_identity(0.5, SLAB, 0.5, 1.0, tol=math.nan),
        "tol",
    ),
    "check_part2_chain sigma0_sq<0": (lambda: appendix_a.check_part2_chain(SLAB, -1.0), "sigma0_sq"),
    "check_prior_variance_typo nan": (
        lambda: appendix_b_rates.check_prior_variance_typo(sigma0_sq=math.nan),
        "sigma0_sq",
    ),
    # session 63: these returned NaN, a fractional parameter count, or divided by zero
    "gaussian_nll noise_var<0": (lambda: likelihood.gaussian_nll(np.zeros(3), np.zeros(3), -1.0), "noise_var"),
    "gaussian_nll noise_var=0": (lambda: likelihood.gaussian_nll(np.zeros(3), np.zeros(3), 0.0), "noise_var"),
    "gaussian_nll y nan": (lambda: likelihood.gaussian_nll(np.array([math.nan, 0.0]), np.zeros(2), 1.0), "y"),
    "expected_nll_mc n_samples=1": (
        lambda: likelihood.expected_nll_mc(
            _POST, likelihood.linear_predict, np.ones((3, 2)), np.zeros(3), 1.0, n_samples=1
        ),
        "n_samples",
    ),
    "ReluNet d_in=2.5": (lambda: likelihood.ReluNet(d_in=2.5, width=1), "d_in"),
    "cond_bound_sigma_sq n=1": (lambda: rates.cond_bound_sigma_sq(10, 1.0, 0.1), "n"),
    "cond_bound_sigma_sq T=nan": (lambda: rates.cond_bound_sigma_sq(math.nan, 10.0, 0.1), "T"),
    "cond_bound_sigma_sq rn=inf": (lambda: rates.cond_bound_sigma_sq(10, 10.0, math.inf), "rn"),
}


def test_the_abs_mgf_beyond_float_range_is_inf():
    """E exp(t|d + sigma Z|) above 1.8e308 is +inf (its log is finite), not an OverflowError from math.exp."""
    assert appendix_b.abs_mgf(100.0, 10.0) == math.inf
    assert appendix_b.log_abs_mgf(100.0, 10.0) == pytest.approx(5e5 + math.log(2), rel=1e-12)
    for reference in (lambda: appendix_b.abs_mgf_quad(100.0, 10.0), lambda: appendix_b.sq_mgf_quad(0.1, 0.5, 1e10)):
        with pytest.raises(ValueError, match="float range"):  # the quadratures: an OverflowError from math.exp
            reference()


def test_appendix_b_checks_at_the_edges_of_their_domain():
    """phi_o = 0 and 1 are probabilities (math.log gave a domain error); a tail that underflows the quadrature is
    taken in log space (0/0 at sigma = 0.01); terms beyond float64 are a ValueError naming the call."""
    for phi_o in (0.0, 1.0):
        verdict = appendix_b.check_tau_condition(phi_o=phi_o)
        assert math.isfinite(verdict.details["log_moment"])
    chernoff = appendix_b_rates.check_chernoff_tail(sigmas=(0.01, 0.05))
    assert chernoff.holds and 0 < chernoff.details["max_ratio_tail_over_bound"] < 1
    assert appendix_b.check_sup_bound_mc(N=4.0).details == appendix_b.check_sup_bound_mc(N=4).details  # an int
    with pytest.raises(ValueError, match=r"check_gaussian_abs_mgf\(t=0.5, sigma=100.0\) leaves float64's range"):
        appendix_b.check_gaussian_abs_mgf(0.5, 100.0)


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_argument_raises_a_value_error_naming_it(case):
    call, name = BAD_CALLS[case]
    with pytest.raises(ValueError, match=rf"^{name} must "):
        call()


@given(x=small_vectors(), data=st.data(), bad=non_finite)
def test_projections_refuse_non_finite_entries(x, data, bad):
    s, K, B = data.draw(hspace_params(x.size))
    x = x.copy()
    x[data.draw(st.integers(0, x.size - 1))] = bad
    for call, name in (
        (lambda: st_api.project_exact(x, s=s, K=K, B=B), "x"),
        (lambda: st_api.project_heuristic(x, s=s, K=K, B=B), "x"),
        (lambda: st_api.quantize_exact(x, K=K, B=B), "values"),
        (lambda: st_api.in_h(x, s=s, K=K, B=B), "theta"),
    ):
        with pytest.raises(ValueError, match=rf"^{name} must be finite"):
            call()


@given(T=st.integers(0, 12), s=st.integers(0, 12), K=st.integers(1, 5))
def test_index_space_size_of_integral_floats_is_the_exact_int(T, s, K):
    exact = st_api.index_space_size(T, s, K)
    for args in ((float(T), s, K), (T, float(s), K), (T, s, float(K))):
        got = st_api.index_space_size(*args)
        assert type(got) is int and got == exact


@given(p=st.floats(0.0, 1.0), bad=st.one_of(outside_unit, non_finite), first=st.booleans())
def test_kl_bernoulli_refuses_non_probabilities(p, bad, first):
    a, b = (bad, p) if first else (p, bad)
    with pytest.raises(ValueError, match=rf"^{'a' if first else 'b'} must be"):
        st_api.kl_bernoulli(a, b)


@given(var=st.floats(1e-3, 4.0), bad=st.one_of(non_positive, non_finite), which=st.sampled_from(["var1", "var0"]))
def test_kl_gaussian_refuses_non_positive_variances(var, bad, which):
    var1, var0 = (bad, var) if which == "var1" else (var, bad)
    with pytest.raises(ValueError, match=rf"^{which} must be"):
        st_api.kl_gaussian(0.0, var1, 0.0, var0)


@given(g=grid_points(), bad=st.one_of(non_finite, non_positive))
def test_rates_refuse_a_bad_delta(g, bad):
    for call in (
        lambda: st_api.eps_n(g.n, g.L, g.N, g.s, g.p, bad),
        lambda: st_api.s_n(g.s, g.n, bad),
        lambda: st_api.neg_log_lambda(g.n, g.L, g.N, g.p, bad),
        lambda: st_api.lambda_condition_max_m(g.n, g.L, g.N, g.s, g.p, bad),
    ):
        with pytest.raises(ValueError, match=r"^delta must be"):
            call()


@given(g=grid_points(), n=st.floats(-1e3, 1.0), delta=st.floats(0.1, 3.0))
def test_log_powers_of_n_need_n_above_one(g, n, delta):
    """``log^a(n)`` with n <= 1 would be complex, zero-divided or NaN: refused, never returned."""
    for call in (
        lambda: st_api.s_n(g.s, n, delta),
        lambda: st_api.eps_n(n, g.L, g.N, g.s, g.p, delta),
        lambda: st_api.lambda_condition_max_m(n, g.L, g.N, g.s, g.p, delta),
    ):
        with pytest.raises(ValueError, match=r"^n must be > 1"):
            call()


# --- the CLI: one line `error: ...`, rc 1, before any compute --------------------------------------------
def _fails(capsys, argv: list[str], *needles: str) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    for needle in needles:
        assert needle in err


@pytest.mark.parametrize("n_random", ["0", "-3"])
def test_cli_checks_refuses_n_random_below_one(capsys, no_compute, n_random):
    _fails(capsys, ["checks", "--n-random", n_random], "--n-random", n_random)


def test_cli_refuses_directories_and_files_as_outputs(capsys, tmp_path, no_compute):
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    _fails(capsys, ["checks", "--n-random", "1", "--json", str(tmp_path)], "--json", str(tmp_path))
    _fails(capsys, ["errata", "--out", str(tmp_path)], "--out", str(tmp_path))
    _fails(capsys, ["errata", "--out", str(a_file / "x.json")], "--out", str(a_file))
    _fails(capsys, ["convergence", "--tier", "tiny", "--out", str(a_file)], "--out", str(a_file))
    assert a_file.read_text() == "x"


@pytest.mark.parametrize("threads", ["0", "-1"])
def test_cli_convergence_refuses_bad_threads(capsys, tmp_path, no_compute, threads):
    _fails(capsys, ["convergence", "--tier", "tiny", "--threads", threads, "--out", str(tmp_path)], "--threads")


def test_cli_docs_names_unreadable_inputs(capsys, tmp_path, no_compute):
    missing, garbage = tmp_path / "missing.md", tmp_path / "garbage.json"
    garbage.write_text("not json")
    _fails(capsys, ["docs", "--path", str(missing), "--check"], "--path", str(missing))
    _fails(capsys, ["docs", "--path", str(garbage), "--convergence", str(garbage), "--check"], "--convergence")


def test_cli_json_write_is_atomic(capsys, tmp_path, monkeypatch):
    """A write that fails midway leaves the previous file whole and no temporary file behind."""
    target = tmp_path / "v.json"
    target.write_text("previous\n")

    def disk_full(_fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    _fails(capsys, ["checks", "--n-random", "1", "--json", str(target)], "No space left")
    assert target.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.json"]
