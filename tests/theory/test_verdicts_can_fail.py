"""Every verdict helper and aggregate can say NO: a violated instance must fail the check.

Gaps (each survived the theory tests covering the module): upper_bound / ratio_at_most_one loosened, the aggregate
taking any() for all(), the projection verdict's 1e-9 loosened to 1e-3, the H-distinct-values verdict flipped,
and the spike-slab identity accepting a gap that does not vanish with the smoothing width."""

import numpy as np
import pytest
from sqs_theory import appendix_a as A
from sqs_theory import checks
from sqs_theory.kl import GaussianMixture
from sqs_theory.verdict import Verdict, ratio_at_most_one, upper_bound

KW = {"name": "x", "location": "here", "claim": "c"}


@pytest.mark.parametrize(
    "value, bound, tol, holds",
    [
        (1.0, 1.0, 0.0, True),
        (1.5, 1.0, 0.0, False),
        (1.0 + 1e-9, 1.0, 0.0, False),
        (1.0 + 1e-9, 1.0, 1e-8, True),
        (0.1, -1.0, 0.0, False),
        (3.0, 2.0, 0.0, False),
    ],
)
def test_upper_bound_holds_iff_value_at_most_bound_plus_tol(value, bound, tol, holds):
    v = upper_bound(**KW, value=value, bound=bound, value_key="v", tol=tol)
    assert v.holds is holds and v.details["slack"] == pytest.approx(bound - value)


@pytest.mark.parametrize("ratio, holds", [(1.0, True), (0.3, True), (1.0 + 1e-9, False), (1.5, False), (2.5, False)])
def test_ratio_at_most_one(ratio, holds):
    assert ratio_at_most_one(**KW, ratio=ratio, key="r").holds is holds


def test_aggregate_fails_when_one_instance_fails():
    vs = [
        Verdict(name="b", location="l", kind="bound", claim="c", holds=h, details={"slack": s})
        for h, s in ((True, 0.5), (False, -0.1), (True, 0.2))
    ]
    agg = checks._aggregate(vs, "slack")
    assert agg.holds is False and agg.details == {"instances": 3, "worst_slack": -0.1, "failures": 1}


def test_hspace_verdicts_refute_the_distinct_values_claim_and_catch_a_suboptimal_dp(monkeypatch):
    by_name = {v.name: v for v in checks.hspace_verdicts()}
    # theta = [0, 1, 2] is in H(3, 2, 2) yet has 3 distinct entries (0 counts): the claim is false
    assert by_name["H-distinct-values"].holds is False and by_name["H-distinct-values"].details["in_H"] is True
    assert by_name["projection-exact-dp"].holds is True
    exact = checks.project_exact

    def off(x, **kw):  # a DP 1e-6 worse than the optimum must fail the identity
        p = exact(x, **kw)
        return type(p)(theta=p.theta, cost=p.cost + 1e-6, method=p.method)

    monkeypatch.setattr(checks, "project_exact", off)
    assert {v.name: v for v in checks.hspace_verdicts()}["projection-exact-dp"].holds is False


def test_spike_slab_identity_rejects_a_gap_that_does_not_vanish(monkeypatch):
    slab = GaussianMixture(weights=np.array([0.6, 0.4]), means=np.array([1.0, -0.5]), variances=np.array([0.2, 0.1]))
    assert A.check_spike_slab_identity(0.7, slab, 0.3, 1.0).holds
    true = A.kl_spike_slab
    monkeypatch.setattr(A, "kl_spike_slab", lambda *a: true(*a) + 1e-4)  # a strict '<' with a fixed gap
    assert not A.check_spike_slab_identity(0.7, slab, 0.3, 1.0).holds
