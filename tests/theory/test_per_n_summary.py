"""summary.per_n_summary and bootstrap_interval against numbers computed by hand.

Gap: the local slope between consecutive medians computed with log10 in the denominator passed the suite."""

import math

import pytest
from sqs_theory.summary import MIN_BOOTSTRAP_FITS, bootstrap_interval, per_n_summary


def _pt(n, h, **kw):
    return {
        "n": n,
        "hellinger_sq": h,
        "hellinger_sq_fp": h / 2,
        "level_accuracy": kw.get("acc", 1.0),
        "support_exact": kw.get("exact", True),
        "false_positive": kw.get("fp", 0),
    }


def test_quartiles_median_and_local_slope():
    pts = [_pt(100, h) for h in (0.1, 0.2, 0.3, 0.4, 0.5)] + [_pt(1000, h) for h in (0.01, 0.02, 0.04, 0.05, 0.06)]
    a, b = per_n_summary(pts)
    assert (a["median"], a["q25"], a["q75"]) == pytest.approx((0.3, 0.2, 0.4))
    assert a["n_times_median"] == pytest.approx(30.0) and a["median_fp"] == pytest.approx(0.15)
    assert b["median"] == pytest.approx(0.04) and b["n_times_median"] == pytest.approx(40.0)
    assert b["local_slope"] == pytest.approx(math.log(0.04 / 0.3) / math.log(10.0))  # = log10(0.04 / 0.3)
    assert "local_slope" not in a


def test_bootstrap_needs_min_fits_at_every_n():
    at = lambda k: [_pt(n, 0.1 / n + 1e-3 * i) for n in (100, 1000) for i in range(k)]  # noqa: E731
    assert bootstrap_interval(at(MIN_BOOTSTRAP_FITS - 1)) is None
    assert bootstrap_interval(at(MIN_BOOTSTRAP_FITS)) is not None
