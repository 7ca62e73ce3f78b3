"""The SQS runner against sqs-core's public API (docs/api-contract.md)."""

from __future__ import annotations

import pytest
import sqs_core
from sqs_bench.train import Budget


@pytest.fixture
def sqs_api():
    """sqs-core's public API (docs/api-contract.md); a missing name fails the test, never skips it."""
    return sqs_core


def test_build_config_maps_priors_and_defaults(sqs_api):
    from sqs_bench.sqs_method import build_config

    config = build_config({"windows": "none", "prior": {"kind": "spike_slab"}}, bits=3, nonzero=0.3)
    assert config.num_components == 8 and config.windows == "none"
    assert isinstance(config.prior, sqs_api.SpikeSlabPrior) and config.prior.keep_prob == 0.3
    gaussian = build_config(
        {"prior": {"kind": "gaussian", "slab_std": 2.0}, "exclude": ["linear"]}, bits=2, nonzero=0.5
    )
    assert isinstance(gaussian.prior, sqs_api.GaussianPrior) and gaussian.exclude == ("linear",)
    with pytest.raises(ValueError, match="prior kind"):
        build_config({"prior": {"kind": "laplace"}}, bits=2, nonzero=0.5)


def test_runner_trains_and_evaluates_greedy_and_bayes(sqs_api, tiny_model, tiny_splits, tmp_path):
    from sqs_bench.sqs_method import run_sqs

    budget = Budget(epochs=1, batch_size=16, max_batches=2, bn_images=0)
    record, evaluations = run_sqs(
        tiny_model, tiny_splits, budget, bits=2, nonzero=0.5, artifact=tmp_path / "m.sqs", samples=[2, 1]
    )
    assert [e["name"] for e in evaluations] == ["greedy", "bayes_M2", "bayes_M1"]
    assert record["primary"] == "bayes_M2" and record["bits"] == 2 and record["train"]["steps"] == 2
    for ev in evaluations:
        assert ev["test_preds"].shape == tiny_splits.test_y.shape
    assert (tmp_path / "m.sqs").is_file() and record["artifact_bytes"] > 0
    assert record["nonzero"] == pytest.approx(0.5, abs=1e-3) and record["target_nonzero"] == 0.5
    assert (
        record["compression_rate_file"] < record["compression_rate_paper_plus_mask"] < record["compression_rate_paper"]
    )
    # the input model is untouched: still only torch and sqs_bench modules
    assert all(type(m).__module__.startswith(("torch.", "sqs_bench.")) for m in tiny_model.modules())
