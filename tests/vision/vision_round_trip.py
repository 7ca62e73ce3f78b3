"""The check every architecture of tests/vision goes through."""

from __future__ import annotations

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from short_training import train_with_schedule


def train_and_round_trip(tmp_path, make, side: int, config: sqs.SQSConfig) -> None:
    """prepare → two AdamW steps with the pruning schedule → greedy → save → load into ``make()`` → average."""
    model = sqs.prepare_(make(), config)
    x, y = torch.randn(4, 3, side, side), torch.randint(0, 10, (4,))
    model.train()
    train_with_schedule(model, 2, lambda m: F.cross_entropy(m(x), y), num_data=1_000, nonzero=0.5)
    model.eval()
    sqs.greedy_(model, nonzero=0.5)
    sqs.save(model, tmp_path / "m.sqs", nonzero=0.5)
    plain = sqs.load(tmp_path / "m.sqs", make().eval())
    average = sqs.BayesianAverage(model, samples=2, nonzero=0.5, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(plain(x), model(x))
        assert torch.isfinite(average(x)).all()
    assert sqs.compression_report(tmp_path / "m.sqs").nonzero_rate == pytest.approx(0.5, abs=0.01)
