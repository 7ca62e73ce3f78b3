"""A user's own module whose compressed parameter is not called ``weight`` (``LayerAdapter.weight_name``): it is
prepared, trains, reads back through the layer, and its artifact loads into the plain model."""

from __future__ import annotations

import copy

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from sqs_core import layers
from sqs_core._artifact_file import read_artifact
from torch import nn


class Experts(nn.Module):
    """Two experts in one (2, out, in) parameter, the way fused MoE layers hold theirs; a fixed 0.3/0.7 mix."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.kernel = nn.Parameter(torch.randn(2, features, features) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _mixed(self, x, self.kernel)


def _mixed(base, x, kernel):
    return 0.3 * F.linear(x, kernel[0]) + 0.7 * F.linear(x, kernel[1])


def _mixed_variance(base, x_squared, variance):  # Var of a sum of independent weights' terms: weights squared
    return 0.09 * F.linear(x_squared, variance[0]) + 0.49 * F.linear(x_squared, variance[1])


@pytest.fixture
def registered():
    sqs.register_layer_type(Experts, sqs.LayerAdapter(_mixed, _mixed_variance, weight_name="kernel"))
    yield
    layers._REGISTRY.pop(Experts)


@pytest.mark.parametrize("likelihood", ["plugin", "moment_matched"])
def test_a_module_whose_parameter_is_not_weight(registered, likelihood, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(Experts(6), nn.ReLU(), nn.Linear(6, 3))
    skeleton = copy.deepcopy(model)
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, likelihood=likelihood))
    layer = sqs.sqs_layers(model)["0"]
    assert layer.kernel.shape == (2, 6, 6) and model[0].base_layer.kernel is None
    x = torch.randn(16, 6, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(2))
    objective = sqs.Objective(model, num_data=16)
    opt = torch.optim.AdamW(sqs.param_groups(model, gate_lr=1e-3))
    for _ in range(3):
        loss = objective(F.cross_entropy(model(x), y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert sqs.posteriors(model)["0"].means.grad.abs().sum() > 0
    model.eval()
    sqs.greedy_(model, nonzero=0.5)
    assert torch.equal(layer.kernel, layer.fixed_weight)
    path = tmp_path / "experts.sqs"
    sqs.save(model, path, nonzero=0.5)
    assert read_artifact(path).records[0]["parameters"] == ["kernel"]
    sqs.load(path, skeleton)
    assert torch.equal(skeleton[0].kernel, layer.fixed_weight)
    with torch.no_grad():
        assert torch.equal(skeleton(x), model(x))
