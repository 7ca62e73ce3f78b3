"""runner._score: the drop is fp32 accuracy minus compressed accuracy (points, positive = worse) and its interval
is the paired bootstrap of the run's own seed and resample count.

Gaps: the drop's sign flipped (acc − fp32) and the bootstrap seed fixed at 0 both passed the bench tests (the
smoke CLI test's models score the same on its 30 images, so drop = 0 either way)."""

from types import SimpleNamespace

import pytest
import torch
from sqs_bench.runner import _score
from sqs_bench.stats import accuracy, paired_bootstrap_drop_ci


def _case():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 10, (200,), generator=g)
    ref = labels.clone()
    ref[:20] = (labels[:20] + 1) % 10  # fp32: 90 %
    comp = labels.clone()
    comp[:50] = (labels[:50] + 1) % 10  # compressed: 75 %
    data = SimpleNamespace(test_y=labels, val_y=labels[:0])
    fp32 = {"test": ref, "acc": accuracy(ref, labels)}
    ev = {"name": "hard", "inference": "hard", "samples": None, "test_preds": comp, "val_preds": comp[:0]}
    return data, fp32, ev


def test_drop_is_fp32_minus_compressed_accuracy():
    data, fp32, ev = _case()
    (row,) = _score([ev], fp32, data, {"seed": 0, "bootstrap_resamples": 500})
    assert row["acc"] == pytest.approx(75.0) and row["drop"] == pytest.approx(15.0)
    lo, hi = row["drop_ci"]
    assert 0 < lo <= row["drop"] <= hi


@pytest.mark.parametrize("seed", [0, 7])
def test_interval_uses_the_runs_seed_and_resamples(seed):
    data, fp32, ev = _case()
    (row,) = _score([ev], fp32, data, {"seed": seed, "bootstrap_resamples": 300})
    expected = paired_bootstrap_drop_ci(data.test_y, fp32["test"], ev["test_preds"], resamples=300, seed=seed)
    assert row["drop_ci"] == list(expected)
    if seed:
        other = paired_bootstrap_drop_ci(data.test_y, fp32["test"], ev["test_preds"], resamples=300, seed=0)
        assert list(other) != row["drop_ci"]  # the seed matters here, so the check above has teeth
