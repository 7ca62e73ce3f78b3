"""paired_bootstrap_drop_ci against the exact bootstrap distribution.

With diff = +1 on a of n images and 0 elsewhere, a bootstrap resample's drop is 100·Binomial(n, a/n)/n, so the
percentile interval's ends are binomial quantiles (n = 26, a = 12: every end is >= 0.01 in probability away from
a jump of the CDF, ~9 standard errors at 20,000 resamples). Gaps: the quantile level (a 90% interval labelled
95%), an image never drawn (off-by-one in randint), and more resamples drawn than asked."""

import pytest
import torch
from exact_bootstrap import binomial_quantile
from sqs_bench.stats import paired_bootstrap_drop_ci


def _pair(n: int, lost: list[int]):
    labels = torch.zeros(n, dtype=torch.long)
    ref = labels.clone()
    comp = labels.clone()
    comp[lost] = 1
    return labels, ref, comp


@pytest.mark.parametrize("level", [0.95, 0.90])
def test_interval_ends_are_the_exact_bootstrap_quantiles(level):
    n, a = 26, 12
    labels, ref, comp = _pair(n, list(range(a)))
    lo, hi = paired_bootstrap_drop_ci(labels, ref, comp, resamples=20_000, level=level, seed=3)
    tail = (1 - level) / 2
    assert lo == pytest.approx(100 * binomial_quantile(n, a / n, tail) / n)
    assert hi == pytest.approx(100 * binomial_quantile(n, a / n, 1 - tail) / n)


def test_every_image_can_be_drawn():
    # only the LAST of 5 images is lost: it is in a resample with probability 1 - (4/5)^5 = 0.67
    labels, ref, comp = _pair(5, [4])
    lo, hi = paired_bootstrap_drop_ci(labels, ref, comp, resamples=2000, seed=0)
    assert lo == 0.0 and hi > 0.0


def test_one_resample_is_one_drop():
    labels, ref, comp = _pair(26, list(range(12)))
    lo, hi = paired_bootstrap_drop_ci(labels, ref, comp, resamples=1, seed=0)
    assert lo == hi
