"""Step 1 of Appendix A: the plug-in likelihood vs the expected likelihood."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sqs_theory.appendix_a import check_plugin_linear, check_plugin_relu, plugin_relu_counterexamples
from sqs_theory.likelihood import (
    ReluNet,
    SpikeGMMPosterior,
    expected_nll_exact,
    expected_nll_mc,
    expected_nll_stratified,
    gaussian_nll,
    linear_expected_nll,
    linear_predict,
    plugin_nll,
)

from .strategies import posteriors

data = st.integers(0, 2**32 - 1).map(lambda seed: np.random.default_rng(seed))


@given(post=posteriors(T=3, K=2))
def test_mean_and_variance_match_enumeration(post):
    values, probs = post.atoms()
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(probs @ values, post.mean(), atol=1e-12)
    np.testing.assert_allclose(probs @ values**2 - post.mean() ** 2, post.variance(), atol=1e-12)


@given(post=posteriors(T=4, K=2), rng=data, noise=st.floats(0.1, 2.0))
def test_linear_plugin_is_below_expectation_with_variance_gap(post, rng, noise):
    X, y = rng.normal(size=(5, 4)), rng.normal(size=5)
    exact = expected_nll_exact(post, linear_predict, X, y, noise)
    assert linear_expected_nll(post, X, y, noise) == pytest.approx(exact, rel=1e-10, abs=1e-10)
    gap = exact - plugin_nll(post, linear_predict, X, y, noise)
    assert gap == pytest.approx(float((X**2 @ post.variance()).sum() / (2 * noise)), rel=1e-9, abs=1e-10)
    assert gap >= -1e-12


@settings(max_examples=10)
@given(post=posteriors(T=3, K=2, level_var=0.05), rng=data)
def test_linear_closed_form_matches_monte_carlo_with_gaussian_levels(post, rng):
    verdict = check_plugin_linear(post, rng.normal(size=(4, 3)), rng.normal(size=4), 0.5)
    assert verdict.holds, verdict.details


def test_relu_counterexamples_go_both_ways_exactly():
    net = ReluNet(d_in=1, width=1)
    cases = plugin_relu_counterexamples()
    post, X, y = cases["above"]
    assert plugin_nll(post, net, X, y, 1.0) > expected_nll_exact(post, net, X, y, 1.0) + 0.2
    post, X, y = cases["below"]
    assert plugin_nll(post, net, X, y, 1.0) < expected_nll_exact(post, net, X, y, 1.0) - 0.2
    assert not check_plugin_relu().holds


def test_relu_counterexamples_survive_gaussian_levels():
    verdict = check_plugin_relu(level_var=0.01)
    assert not verdict.holds
    assert verdict.details["above_plugin"] > verdict.details["above_expected"]
    assert verdict.details["below_plugin"] < verdict.details["below_expected"]


def test_relu_net_forward_by_hand():
    net = ReluNet(d_in=2, width=2)
    theta = np.array([1.0, -1.0, 0.5, 0.5, 0.0, -1.0, 2.0, 3.0, 0.25])  # W (2x2), b, v, c
    X = np.array([[1.0, 2.0]])
    hidden = np.maximum(np.array([[1.0, -1.0], [0.5, 0.5]]) @ X[0] + np.array([0.0, -1.0]), 0.0)
    assert net(theta, X)[0, 0] == pytest.approx(np.array([2.0, 3.0]) @ hidden + 0.25)
    assert net.n_params == theta.size


_RARE_ATOM = SpikeGMMPosterior(
    lam_tilde=np.array([0.0, 0.125, 0.001953125, 0.0]),
    phi=np.full((4, 2), 0.5),
    mu=np.array([0.0, 1.0]),
    var=np.zeros(2),
)


@settings(max_examples=10)
@given(post=posteriors(T=4, K=2), rng=data)
@example(post=_RARE_ATOM, rng=np.random.default_rng(0))
def test_monte_carlo_agrees_with_enumeration_for_the_relu_net(post, rng):
    net = ReluNet(d_in=1, width=1)
    X, y = rng.normal(size=(3, 1)), rng.normal(size=3)
    exact = expected_nll_exact(post, net, X, y, 1.0)
    mc, _ = expected_nll_mc(post, net, X, y, 1.0, n_samples=20_000, seed=1)
    # the estimator's true standard error, by enumeration: the sample one is 0 when a rare atom (here a
    # product of small λ̃) is never drawn, which hypothesis found once (λ̃ = 0.125 and 0.002, |mc − exact| 1e-4)
    values, probs = post.atoms()
    nll = gaussian_nll(y, net(values, X), 1.0)
    se = float(np.sqrt(probs @ (nll - exact) ** 2 / 20_000))
    assert abs(mc - exact) <= 6 * se + 1e-9


def test_posterior_validation():
    with pytest.raises(ValueError, match="phi"):
        SpikeGMMPosterior(lam_tilde=np.ones(2), phi=np.full((2, 2), 0.3), mu=np.zeros(2), var=np.zeros(2))
    with pytest.raises(ValueError, match="var == 0"):
        SpikeGMMPosterior(lam_tilde=np.ones(1), phi=np.ones((1, 1)), mu=np.zeros(1), var=np.ones(1)).atoms()


@pytest.mark.parametrize("field", ["lam_tilde", "phi", "mu", "var"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_entry_is_refused_with_its_name(field, bad):
    parts = {"lam_tilde": np.full(2, 0.5), "phi": np.full((2, 2), 0.5), "mu": np.ones(2), "var": np.ones(2)}
    parts[field].flat[0] = bad
    with pytest.raises(ValueError, match=field):
        SpikeGMMPosterior(**parts)


@given(
    lam_tilde=st.one_of(st.just(1.0), st.floats(0.0, 1.0)),
    mu=st.floats(-1e6, 1e6),
    spread=st.sampled_from([1e-12, 1e-9, 1e-6, 1e-3]),
    var=st.sampled_from([0.0, 1e-9]),
    seed=st.integers(0, 2**32 - 1),
)
def test_variance_is_never_negative(lam_tilde, mu, spread, var, seed):
    """lt·Σφ(μ² + v) − (lt·Σφμ)² cancelled below 0 for levels close together far from 0 (sqrt then gave NaN)."""
    rng = np.random.default_rng(seed)
    mu_k = mu + rng.normal(size=3) * spread * abs(mu)
    phi = rng.dirichlet(np.ones(3), 4)
    post = SpikeGMMPosterior(lam_tilde=np.full(4, lam_tilde), phi=phi, mu=mu_k, var=np.full(3, var))
    assert np.all(post.variance() >= 0)


@settings(max_examples=10)
@given(post=posteriors(T=3, K=2), rng=data)
def test_stratified_estimator_is_exact_for_point_mass_levels(post, rng):
    net = ReluNet(d_in=1, width=1)
    X, y = rng.normal(size=(2, 1)), rng.normal(size=2)
    post4 = SpikeGMMPosterior(
        lam_tilde=np.concatenate([post.lam_tilde, [0.5]]),
        phi=np.vstack([post.phi, [[0.5, 0.5]]]),
        mu=post.mu,
        var=post.var,
    )
    value, se = expected_nll_stratified(post4, net, X, y, 1.0, n_per_atom=3)
    assert se <= 1e-12
    assert value == pytest.approx(expected_nll_exact(post4, net, X, y, 1.0), rel=1e-12, abs=1e-12)
