"""GaussianMixture.logpdf / mean / second_moment against scipy's normal density and quadrature.

Gap: GaussianMixture.logpdf (public) is used by no test; dropping the 2 of log(2*pi*var) survived the suite."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats
from scipy.special import logsumexp
from sqs_theory.kl import GaussianMixture

from .strategies import gaussian_mixtures


@settings(max_examples=40)
@given(gaussian_mixtures(), st.lists(st.floats(-6, 6), min_size=1, max_size=5))
def test_logpdf_is_the_log_of_the_weighted_normal_densities(mix, xs):
    x = np.array(xs)
    terms = [
        np.log(w) + stats.norm.logpdf(x, m, np.sqrt(v))
        for w, m, v in zip(mix.weights, mix.means, mix.variances, strict=True)
    ]
    np.testing.assert_allclose(mix.logpdf(x), logsumexp(terms, axis=0), rtol=1e-10, atol=1e-12)


def test_density_moments_by_quadrature():
    mix = GaussianMixture(weights=np.array([0.3, 0.7]), means=np.array([-1.0, 2.0]), variances=np.array([0.5, 2.0]))
    f = lambda x: float(np.exp(mix.logpdf(x)))  # noqa: E731
    mass = integrate.quad(f, -np.inf, np.inf)[0]
    m1 = integrate.quad(lambda x: x * f(x), -np.inf, np.inf)[0]
    m2 = integrate.quad(lambda x: x * x * f(x), -np.inf, np.inf)[0]
    assert abs(mass - 1) < 1e-9
    assert abs(mix.mean() - m1) < 1e-8 and abs(mix.mean() - (0.3 * -1 + 0.7 * 2)) < 1e-12
    assert abs(mix.second_moment() - m2) < 1e-8
