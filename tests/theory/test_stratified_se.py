"""expected_nll_stratified's standard error against the spread of its estimate over independent seeds.

A stratified mean sum_a p_a mean_a has variance sum_a p_a^2 s_a^2 / m; the estimator's reported se must match the
standard deviation of the estimates over 300 seeds (ratio 1 +- 0.2; the sampling error of that SD is ~4%).
Gaps: the MC se divided by m instead of sqrt(m); p_a in place of p_a^2 (se ~2x too large here, loosening
check_plugin_linear's 6 se agreement) passed."""

import numpy as np
import pytest
from sqs_theory.likelihood import SpikeGMMPosterior, expected_nll_mc, expected_nll_stratified, linear_predict


@pytest.mark.parametrize(
    ("estimator", "sizes", "seed"),
    [(expected_nll_stratified, {"n_per_atom": 50}, 0), (expected_nll_mc, {"n_samples": 100}, 1)],
    ids=["stratified", "monte-carlo"],
)
def test_reported_se_matches_the_spread_over_seeds(estimator, sizes, seed):
    post = SpikeGMMPosterior(
        lam_tilde=np.array([0.6, 0.5]),
        phi=np.array([[0.5, 0.5], [0.3, 0.7]]),
        mu=np.array([-1.0, 1.5]),
        var=np.array([0.3, 0.2]),
    )
    rng = np.random.default_rng(seed)
    X, y = rng.normal(size=(3, 2)), rng.normal(size=3)
    runs = [estimator(post, linear_predict, X, y, 0.5, **sizes, seed=s) for s in range(300)]
    est, se = np.array([r[0] for r in runs]), np.array([r[1] for r in runs])
    ratio = float(np.mean(se)) / float(np.std(est, ddof=1))
    assert 0.8 < ratio < 1.2, ratio
