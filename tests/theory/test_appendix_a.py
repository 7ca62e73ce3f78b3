"""Appendix A: Lemma mix, the spike-and-slab step, Part 2 and the dominant-component approximation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from sqs_theory.appendix_a import (
    check_dominant_approximation,
    check_dominant_component,
    check_gaussian_prior_variant,
    check_lemma_mix,
    check_part2_chain,
    check_replacement_bound,
    check_spike_slab_identity,
    component_kls,
    dominant_counterexamples,
    spike_slab_full_counterexample,
)
from sqs_theory.kl import GaussianMixture

from .strategies import gaussian_mixtures, mixture_pairs, prior_variances, probabilities


@given(pair=mixture_pairs())
def test_lemma_mix_bound_holds(pair):
    verdict = check_lemma_mix(*pair)
    assert verdict.kind == "bound"
    assert verdict.holds, verdict.details


def test_lemma_mix_is_tight_for_identical_component_pairs():
    """g_k = g~_k for all k and w = w~: both sides are 0; w != w~ with disjoint g: the bound is ~tight."""
    p = GaussianMixture(weights=np.array([0.3, 0.7]), means=np.array([-5.0, 5.0]), variances=np.array([0.1, 0.1]))
    q = GaussianMixture(weights=np.array([0.6, 0.4]), means=np.array([-5.0, 5.0]), variances=np.array([0.1, 0.1]))
    verdict = check_lemma_mix(p, q)
    assert verdict.holds
    assert verdict.details["slack"] == pytest.approx(0.0, abs=1e-9)


def test_lemma_mix_rejects_unequal_component_counts():
    with pytest.raises(ValueError, match="equal K"):
        check_lemma_mix(
            GaussianMixture.single(0, 1),
            GaussianMixture(weights=np.ones(2) / 2, means=np.zeros(2), variances=np.ones(2)),
        )


@settings(max_examples=8)
@given(lt=probabilities, lam=probabilities, slab=gaussian_mixtures(k_max=3), s0=prior_variances)
def test_spike_slab_step_is_an_identity(lt, lam, slab, s0):
    verdict = check_spike_slab_identity(lt, slab, lam, s0)
    assert verdict.kind == "identity"
    assert verdict.holds, verdict.details


@given(lt=probabilities, slab=gaussian_mixtures(k_max=3), s0=prior_variances)
def test_gaussian_prior_variant_bound_holds(lt, slab, s0):
    verdict = check_gaussian_prior_variant(lt, slab, s0)
    assert verdict.holds, verdict.details


def test_gaussian_prior_variant_bound_is_strict_unlike_the_spike():
    """The same Lemma-mix step is strict when the second components are not singular."""
    slab = dominant_counterexamples()["under"]
    assert check_gaussian_prior_variant(0.5, slab, 1.0).details["slack"] > 0.1


@given(slab=gaussian_mixtures(), s0=prior_variances)
def test_part2_chain_bound_holds(slab, s0):
    verdict = check_part2_chain(slab, s0)
    assert verdict.holds, verdict.details


@given(slab=gaussian_mixtures(), s0=prior_variances)
def test_replacement_bound_holds(slab, s0):
    verdict = check_replacement_bound(slab, s0)
    assert verdict.holds, verdict.details


def test_dominant_component_counterexamples_go_both_ways():
    cases = dominant_counterexamples()
    under = check_dominant_component(cases["under"], 1.0)
    over = check_dominant_component(cases["over"], 1.0)
    assert under["kl_dominant"] < under["kl_true"] - 0.5  # the surrogate is not an upper bound
    assert over["kl_dominant"] > over["kl_true"] + 0.5  # ... nor a lower bound
    for slab in cases.values():  # k* really is the first component
        assert int(np.argmax(slab.weights)) == 0
    assert not check_dominant_approximation().holds


def test_full_kl_term_of_the_approximate_objective_is_not_an_upper_bound():
    values = spike_slab_full_counterexample()
    assert values["kl_approx_elbo"] < values["kl_exact"] - 0.5


@given(slab=gaussian_mixtures(k_min=2), s0=prior_variances)
def test_dominant_error_vanishes_as_the_dominant_weight_tends_to_one(slab, s0):
    """|Part 2 - KL_k*| <= (1 - phi*) max|KL_k - KL*|: sharpening phi to a one-hot kills the error."""
    k_star = int(np.argmax(slab.weights))
    sharp = np.full(slab.weights.size, 1e-6)
    sharp[k_star] = 1 - 1e-6 * (slab.weights.size - 1)
    sharpened = GaussianMixture(weights=sharp, means=slab.means, variances=slab.variances)
    d = check_dominant_component(sharpened, s0)
    spread = float(np.abs(component_kls(slab, s0) - d["kl_dominant"]).max())
    assert abs(d["part2"] - d["kl_dominant"]) <= 1e-6 * slab.weights.size * spread + 1e-12
