"""Accuracy and the paired bootstrap interval of the accuracy drop."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sqs_bench.stats import accuracy, paired_bootstrap_drop_ci


@st.composite
def paired_predictions(draw, max_size: int = 120):
    """(labels, reference, compressed) over 3 classes, same length."""
    n = draw(st.integers(1, max_size))
    triple = [draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)) for _ in range(3)]
    return tuple(torch.tensor(t) for t in triple)


@given(paired_predictions(), st.integers(0, 2**16))
def test_interval_contains_the_point_estimate(triple, seed):
    labels, ref, comp = triple
    lo, hi = paired_bootstrap_drop_ci(labels, ref, comp, resamples=300, seed=seed)
    drop = accuracy(ref, labels) - accuracy(comp, labels)
    assert -100 <= lo <= drop + 1e-9 and drop - 1e-9 <= hi <= 100


@given(paired_predictions())
def test_identical_predictions_give_a_zero_width_interval(triple):
    labels, ref, _ = triple
    assert paired_bootstrap_drop_ci(labels, ref, ref.clone(), resamples=100) == (0.0, 0.0)


@given(paired_predictions())
def test_swapping_the_models_negates_the_interval(triple):
    labels, ref, comp = triple
    lo, hi = paired_bootstrap_drop_ci(labels, ref, comp, resamples=200, seed=7)
    lo2, hi2 = paired_bootstrap_drop_ci(labels, comp, ref, resamples=200, seed=7)
    assert lo2 == pytest.approx(-hi) and hi2 == pytest.approx(-lo)


def test_seeded_reproducible_and_chunking_invariant():
    g = torch.Generator().manual_seed(0)
    labels, ref, comp = (torch.randint(0, 10, (500,), generator=g) for _ in range(3))
    a = paired_bootstrap_drop_ci(labels, ref, comp, resamples=2000, seed=1)
    assert a == paired_bootstrap_drop_ci(labels, ref, comp, resamples=2000, seed=1)
    assert a == paired_bootstrap_drop_ci(labels, ref, comp, resamples=2000, seed=1, chunk=2000)


def test_interval_narrows_with_more_images_and_is_paired():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 10, (4000,), generator=g)
    ref = torch.where(torch.rand(4000, generator=g) < 0.9, labels, (labels + 1) % 10)
    comp = ref.clone()
    comp[:40] = (labels[:40] + 2) % 10  # 40 images (1 point) flipped to wrong
    lo, hi = paired_bootstrap_drop_ci(labels, ref, comp)
    lo_small, hi_small = paired_bootstrap_drop_ci(labels[:1000], ref[:1000], comp[:1000])
    assert hi - lo < hi_small - lo_small
    # paired: the interval is much narrower than two independent binomial errors (~1.3 points at 4,000)
    assert lo > 0 and hi - lo < 1.0


def test_extremes_and_argument_checks():
    labels = torch.arange(10)
    assert accuracy(labels, labels) == 100.0
    assert paired_bootstrap_drop_ci(labels, labels, labels + 1, resamples=50) == (100.0, 100.0)
    with pytest.raises(ValueError, match="match"):
        accuracy(labels[:3], labels)
    with pytest.raises(ValueError, match="resamples"):
        paired_bootstrap_drop_ci(labels, labels, labels, resamples=0)
    with pytest.raises(ValueError, match="level"):
        paired_bootstrap_drop_ci(labels, labels, labels, level=1.0)
