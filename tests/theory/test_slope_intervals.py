"""fit_slope and bootstrap_slope_ci against independent references.

fit_slope: OLS by the normal equations, its t-interval from scipy's t quantile and R² = 1 − SSE/SST.
bootstrap_slope_ci: with two n (one group constant), the OLS slope of a resample is (mean of group 2's log-values
resampled) / log(n2/n1); with log-values 1 on a = 12 of m = 26 fits and 0 on the rest, that mean is
Binomial(26, 12/26)/26, so the percentile interval's ends are binomial quantiles (>= 0.01 in probability from a
jump of the CDF at both levels; 20,000 resamples put them ~9 standard errors clear)."""

import math

import numpy as np
import pytest
from exact_bootstrap import binomial_quantile
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from sqs_theory.hellinger import bootstrap_slope_ci, fit_slope


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-2, 2), min_size=4, max_size=9), st.sampled_from([0.9, 0.95, 0.99]))
def test_fit_slope_is_ols_with_its_t_interval_and_r2(noise, level):
    ns = 2.0 ** np.arange(4, 4 + len(noise))
    values = 3.0 * ns**-0.8 * np.exp(np.array(noise))
    x, y = np.log(ns), np.log(values)
    X = np.column_stack([np.ones_like(x), x])
    (b0, b1), *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ [b0, b1]
    sse, sst = float(resid @ resid), float(((y - y.mean()) ** 2).sum())
    se = math.sqrt(sse / (x.size - 2) / ((x - x.mean()) ** 2).sum())
    half = stats.t.ppf(1 - (1 - level) / 2, x.size - 2) * se
    fit = fit_slope(ns, values, level=level)
    assert fit["slope"] == pytest.approx(b1, abs=1e-9) and fit["intercept"] == pytest.approx(b0, abs=1e-9)
    assert fit["stderr"] == pytest.approx(se, rel=1e-7, abs=1e-12)
    assert fit["slope_ci"] == pytest.approx([b1 - half, b1 + half], rel=1e-7, abs=1e-9)
    if sst > 1e-12:
        assert fit["r2"] == pytest.approx(1 - sse / sst, abs=1e-9)
    assert fit["num_points"] == x.size


@pytest.mark.parametrize("level", [0.95, 0.90])
def test_bootstrap_interval_ends_are_the_exact_bootstrap_quantiles(level):
    m, a, n1, n2 = 26, 12, 10.0, 1000.0
    ns = [n1] * 3 + [n2] * m
    values = [1.0] * 3 + [math.e] * a + [1.0] * (m - a)
    lo, hi = bootstrap_slope_ci(ns, values, level=level, resamples=20_000, seed=5)
    tail = (1 - level) / 2
    scale = math.log(n2 / n1)
    assert lo == pytest.approx(binomial_quantile(m, a / m, tail) / m / scale, abs=1e-9)
    assert hi == pytest.approx(binomial_quantile(m, a / m, 1 - tail) / m / scale, abs=1e-9)


def test_fit_slope_needs_three_points():
    with pytest.raises(ValueError):
        fit_slope([10.0, 100.0], [1.0, 0.1])
