"""gaussian_nll = −Σ_n log N(y_n | f_n, σ²) against scipy's normal log-density.

Gap: the normalising constant charged once instead of n times (n/2 log 2πσ² → 1/2 log 2πσ²) passed the suite
(it cancels in every plug-in vs expectation comparison, but the reported NLLs are wrong)."""

import numpy as np
import pytest
from scipy import stats
from sqs_theory.likelihood import gaussian_nll


@pytest.mark.parametrize("noise_var", [0.1, 0.5, 3.0])
def test_gaussian_nll_is_the_negative_log_likelihood(noise_var):
    rng = np.random.default_rng(0)
    y, pred = rng.normal(size=7), rng.normal(size=(3, 7))
    ref = -stats.norm.logpdf(y[None, :], pred, np.sqrt(noise_var)).sum(axis=1)
    np.testing.assert_allclose(gaussian_nll(y, pred, noise_var), ref, rtol=1e-12)
