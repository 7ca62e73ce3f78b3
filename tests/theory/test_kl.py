"""KL machinery: quadrature against closed forms, the mpmath fallback, and the spike-and-slab identity."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqs_theory.kl import (
    GaussianMixture,
    kl_bernoulli,
    kl_gaussian,
    kl_gaussian_prior_variant,
    kl_mixture,
    kl_mixture_mp,
    kl_spike_slab,
    kl_spike_slab_smoothed,
)
from sqs_theory.likelihood import SpikeGMMPosterior

from .strategies import gaussian_mixtures, means, prior_variances, probabilities, variances


@given(m1=means, v1=variances, m0=means, v0=variances)
def test_quadrature_matches_closed_form_for_single_gaussians(m1, v1, m0, v0):
    quad = kl_mixture(GaussianMixture.single(m1, v1), GaussianMixture.single(m0, v0))
    exact = float(kl_gaussian(m1, v1, m0, v0))
    assert abs(quad - exact) <= 1e-9 * max(1.0, exact)


@given(
    m1=st.floats(-1e300, 1e300),
    m0=st.floats(-1e300, 1e300),
    v1=st.floats(1e-300, 1e300),
    v0=st.floats(1e-300, 1e300),
)
def test_gaussian_kl_is_never_nan_over_the_whole_float_range(m1, v1, m0, v0):
    """log(var0 / var1) underflowed to −inf beside an overflowing var1 / var0: NaN instead of inf."""
    value = float(kl_gaussian(m1, v1, m0, v0))
    assert value >= -1e-12
    with np.errstate(all="ignore"):  # the formula as it was, where its every part is a normal number
        m1_, v1_, m0_, v0_ = (np.float64(t) for t in (m1, v1, m0, v0))
        ratio, spread = v1_ / v0_, (m1_ - m0_) ** 2 / v0_
        if np.isfinite(ratio) and np.isfinite(spread) and 0 < v0_ / v1_ < np.inf:
            literal = 0.5 * (np.log(v0_ / v1_) + ratio + spread - 1.0)
            assert value == pytest.approx(float(literal), rel=1e-12, abs=1e-12)


def test_gaussian_kl_of_far_apart_variances_is_inf_not_nan():
    assert float(kl_gaussian(0.0, 1e300, 1e10, 1e-30)) == math.inf
    assert float(kl_gaussian(0.0, 1e-300, 0.0, 1e30)) == pytest.approx(0.5 * (330 * math.log(10) - 1), rel=1e-12)


@settings(max_examples=6)
@given(p=gaussian_mixtures(k_max=2), q=gaussian_mixtures(k_max=2))
def test_quadrature_matches_mpmath_fallback_for_mixtures(p, q):
    quad, ref = kl_mixture(p, q), kl_mixture_mp(p, q, dps=20)
    assert abs(quad - ref) <= 1e-9 * max(1.0, ref)


@given(p=gaussian_mixtures(), q=gaussian_mixtures())
def test_mixture_kl_is_nonnegative_and_zero_on_the_diagonal(p, q):
    assert kl_mixture(p, q) >= 0.0
    assert kl_mixture(p, p) <= 1e-10


def test_mixture_kl_is_invariant_to_component_order_and_splitting():
    p = GaussianMixture(weights=np.array([0.3, 0.7]), means=np.array([-1.0, 2.0]), variances=np.array([0.2, 0.5]))
    split = GaussianMixture(
        weights=np.array([0.7, 0.1, 0.2]),
        means=np.array([2.0, -1.0, -1.0]),
        variances=np.array([0.5, 0.2, 0.2]),
    )
    q = GaussianMixture.single(0.0, 1.0)
    assert kl_mixture(p, q) == pytest.approx(kl_mixture(split, q), abs=1e-11)


@given(a=st.floats(0.0, 1.0), b=probabilities)
def test_bernoulli_kl_matches_definition(a, b):
    direct = sum(x * math.log(x / y) for x, y in ((a, b), (1 - a, 1 - b)) if x > 0)
    assert float(kl_bernoulli(a, b)) == pytest.approx(direct, abs=1e-12)
    assert float(kl_bernoulli(b, b)) == pytest.approx(0.0, abs=1e-15)


@settings(max_examples=10)
@given(lt=probabilities, lam=probabilities, slab=gaussian_mixtures(k_max=3), s0=prior_variances)
def test_spike_slab_kl_is_the_limit_of_smoothed_spikes(lt, lam, slab, s0):
    """Atom and density are singular: the decomposition is exact, so the smoothed KL converges to it."""
    exact = kl_spike_slab(lt, slab, lam, s0)
    errs = [abs(kl_spike_slab_smoothed(lt, slab, lam, s0, spike_sd=e) - exact) for e in (1e-5, 1e-7)]
    assert errs[1] <= 0.05 * errs[0] or errs[1] < 1e-9  # O(eps sqrt(log 1/eps)) decay
    assert errs[1] <= 1e-3


@given(slab=gaussian_mixtures(), lam=probabilities, s0=prior_variances)
def test_spike_slab_limiting_gates(slab, lam, s0):
    """Gate lt -> 0 is the pure spike; lt -> 1 is the slab."""
    assert kl_spike_slab(0.0, slab, lam, s0) == pytest.approx(-math.log(1 - lam), rel=1e-12)
    slab_kl = kl_mixture(slab, GaussianMixture.single(0.0, s0))
    assert kl_spike_slab(1.0, slab, lam, s0) == pytest.approx(-math.log(lam) + slab_kl, rel=1e-12)


@given(lt=st.floats(0.0, 1.0), slab=gaussian_mixtures(k_max=3), s0=prior_variances)
def test_gaussian_prior_variant_limits_and_convexity(lt, slab, s0):
    value = kl_gaussian_prior_variant(lt, slab, s0)
    full = kl_mixture(slab, GaussianMixture.single(0.0, s0))
    assert -1e-12 <= value <= lt * full + 1e-9
    if lt == 0.0:
        assert value == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"weights": np.array([0.5, 0.6]), "means": np.zeros(2), "variances": np.ones(2)},
        {"weights": np.array([1.0]), "means": np.zeros(1), "variances": np.array([0.0])},
        {"weights": np.array([0.5, 0.5]), "means": np.zeros(3), "variances": np.ones(2)},
    ],
)
def test_invalid_mixture_is_rejected(kwargs):
    with pytest.raises(ValueError):
        GaussianMixture(**kwargs)


def test_float32_mixing_weights_are_taken_and_renormalised():
    """Softmax weights in float32 (sqs-core's mixing weights) sum to 1 within ~2e-7: they were refused (the
    tolerance was 1e-12); 1e-6 takes them and still refuses weights that do not sum to 1."""
    import torch

    logits = torch.randn(200, 64, generator=torch.Generator().manual_seed(0))
    rows = torch.softmax(logits, dim=-1).double().numpy()
    assert np.abs(rows.sum(axis=1) - 1).max() > 1e-12  # the case itself
    for w in rows:
        mix = GaussianMixture(weights=w, means=np.zeros(64), variances=np.ones(64))
        assert abs(mix.weights.sum() - 1) <= 1e-15
    post = SpikeGMMPosterior(lam_tilde=np.full(200, 0.5), phi=rows, mu=np.linspace(-1, 1, 64), var=np.zeros(64))
    assert np.abs(post.phi.sum(axis=1) - 1).max() <= 1e-15
    with pytest.raises(ValueError, match="sum to 1"):
        GaussianMixture(weights=np.array([0.5, 0.5 + 1e-5]), means=np.zeros(2), variances=np.ones(2))
    with pytest.raises(ValueError, match="phi"):
        SpikeGMMPosterior(lam_tilde=np.ones(1), phi=[[0.5, 0.5 + 1e-5]], mu=np.zeros(2), var=np.zeros(2))


def test_spike_slab_rejects_bad_probabilities():
    with pytest.raises(ValueError, match="lam"):
        kl_spike_slab(0.5, GaussianMixture.single(0.0, 1.0), 1.0, 1.0)


@settings(max_examples=40)
@given(
    mean=st.floats(-5.0, 5.0).filter(lambda m: abs(m) > 1e-3),
    log10_var=st.floats(-34.0, -12.0),
    q_mean=st.floats(-2.0, 2.0),
    q_var=st.floats(0.1, 10.0),
)
def test_kl_mixture_of_very_narrow_components_matches_the_closed_forms(mean, log10_var, q_mean, q_var):
    """Components far narrower than their |mean| (the proof's σ_n² is 3.4e-25 at L = 4, N = 32): integrated over x,
    they were a few rounding steps wide and KL(N(1, 1e-32) || N(0, 1)) came out 48.39 against 36.84 (session 63).
    A single Gaussian against its closed form; two disjoint narrow components against Σ w_k [log w_k + KL_k]."""
    var = 10.0**log10_var
    q = GaussianMixture.single(q_mean, q_var)
    exact = kl_gaussian(mean, var, q_mean, q_var)
    assert kl_mixture(GaussianMixture.single(mean, var), q) == pytest.approx(exact, rel=1e-9, abs=1e-9)
    p = GaussianMixture(weights=np.array([0.3, 0.7]), means=np.array([-mean, mean]), variances=np.array([var, var]))
    disjoint = sum(w * (math.log(w) + kl_gaussian(m, var, q_mean, q_var)) for w, m in ((0.3, -mean), (0.7, mean)))
    assert kl_mixture(p, q) == pytest.approx(disjoint, rel=1e-9, abs=1e-9)
