"""Gradient accumulation: ``(objective(nll_b) / B).backward()`` over B equal micro-batches gives the gradients of
``objective(nll)`` on their union (the NLL is a batch mean, and B halves of KL / num_data add up to one), so the
KL is not counted B times and nothing cached by one forward leaks into the next (docs/api-contract.md)."""

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from torch import nn


def _model(train_weight: bool, responsibility: str) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 16, 5)).double()
    config = sqs.SQSConfig(
        num_components=4, train_weight=train_weight, responsibility=responsibility, temperature=1e-2, kl_weight=1.0
    )
    return sqs.prepare_(model, config)


def _gradients(model: nn.Module, micro_batches: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 3, 6, 6, generator=gen, dtype=torch.float64), torch.randint(0, 5, (8,), generator=gen)
    objective = sqs.Objective(model, num_data=40)
    model.zero_grad()
    for xb, yb in zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True):
        (objective(F.cross_entropy(model(xb), yb)) / micro_batches).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("train_weight", [False, True])
@pytest.mark.parametrize("responsibility", ["paper", "standard"])
@pytest.mark.parametrize("micro_batches", [2, 4])
def test_accumulated_micro_batches_give_the_whole_batch_gradients(train_weight, responsibility, micro_batches):
    model = _model(train_weight, responsibility)
    whole = _gradients(model, 1)
    accumulated = _gradients(model, micro_batches)
    assert whole.keys() == accumulated.keys() and len(whole) >= 8
    for name, grad in whole.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(accumulated[name], grad, rtol=1e-9, atol=1e-12 * float(grad.abs().max()), msg=name)


def test_a_kl_counted_once_per_micro_batch_would_show():
    """The check above can fail: the KL's share of the gradients (β/num_data · ∂KL) is far above its tolerance for
    every posterior parameter, so a KL added B times instead of once would not pass."""
    model = _model(False, "paper")
    whole = _gradients(model, 1)
    objective = sqs.Objective(model, num_data=40)
    model.zero_grad()
    (objective.kl() * objective.kl_weight / objective.num_data).backward()
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert (p.grad.abs() > 1e-6 * whole[name].abs() + 1e-12).any(), name
