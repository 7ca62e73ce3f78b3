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


class GatedExperts(nn.Module):
    """A fused MoE-style block: ``gate_up`` (E, 2H, D) and ``down`` (E, D, H), read by its own forward."""

    def __init__(self, features: int, hidden: int, experts: int = 2) -> None:
        super().__init__()
        self.gate_up = nn.Parameter(torch.randn(experts, 2 * hidden, features) * 0.3)
        self.down = nn.Parameter(torch.randn(experts, features, hidden) * 0.3)
        self.router = nn.Linear(features, experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = torch.einsum("bd,ehd->beh", x, self.gate_up).chunk(2, dim=-1)
        expert_out = torch.einsum("beh,edh->bed", F.silu(gate) * up, self.down)
        return (self.router(x).softmax(-1).unsqueeze(-1) * expert_out).sum(1)


def _expert_weights(module: nn.Module) -> tuple[str, ...]:
    return ("gate_up", "down")


def test_a_module_with_several_parameters_runs_its_own_forward(tmp_path):
    sqs.register_layer_type(GatedExperts, sqs.LayerAdapter(None, None, weight_names=_expert_weights))
    try:
        torch.manual_seed(0)
        plain = nn.Sequential(GatedExperts(6, 4), nn.Linear(6, 3))
        model = sqs.prepare_(copy.deepcopy(plain), sqs.SQSConfig(num_components=4))
        assert len(sqs.posteriors(model)) == 4  # gate_up, down, the router and the head
        experts = model[0]
        with torch.no_grad():
            for name in ("gate_up", "down"):
                getattr(plain[0], name).copy_(getattr(experts, name))
            plain[0].router.weight.copy_(experts.router.weight)
            plain[1].weight.copy_(model[1].weight)
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
        assert torch.allclose(model(x), plain(x), atol=1e-6)
        model(x).square().mean().backward()
        assert all(p.means.grad.abs().sum() > 0 for p in sqs.posteriors(model).values())
        sqs.greedy_(model, nonzero=0.5)
        path = tmp_path / "moe.sqs"
        sqs.save(model, path, nonzero=0.5)
        skeleton = sqs.load(path, nn.Sequential(GatedExperts(6, 4), nn.Linear(6, 3)))
        with torch.no_grad():
            assert torch.equal(skeleton(x), model(x))
    finally:
        layers._REGISTRY.pop(GatedExperts)


def test_weight_names_must_be_distinct_identifiers():
    for names in (("gate_up", "gate_up"), ("gate_up", "down.x")):
        sqs.register_layer_type(GatedExperts, sqs.LayerAdapter(None, None, weight_names=lambda m, n=names: n))
        try:
            model = nn.Sequential(GatedExperts(6, 4), nn.Linear(6, 3))
            with pytest.raises(ValueError, match="distinct parameter names expected"):
                sqs.prepare_(model)
            assert isinstance(model[0].gate_up, nn.Parameter)  # nothing changed
        finally:
            layers._REGISTRY.pop(GatedExperts)


class Misnamed(nn.Module):
    """Its parameter is ``w``; its adapter (a typo, or a type changed since) names ``kernel``."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6))
        self.register_buffer("frozen", torch.randn(4, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w)


@pytest.mark.parametrize(("weight_name", "message"), [("kernel", "no attribute 'kernel'"), ("frozen", "buffer")])
def test_an_adapter_naming_no_parameter_of_the_module_is_an_error_naming_both(weight_name, message):
    """It was skipped with an INFO line (the model compressed without it) or, as a buffer, called computed."""
    sqs.register_layer_type(Misnamed, sqs.LayerAdapter(_mixed, None, weight_name=weight_name))
    try:
        model = nn.Sequential(Misnamed(), nn.Linear(4, 3))
        before = copy.deepcopy(model.state_dict())
        with pytest.raises(ValueError, match=message) as err:
            sqs.prepare_(model, sqs.SQSConfig(num_components=4))
        assert "layer '0" in str(err.value) and "Misnamed" in str(err.value)
        assert not sqs.is_prepared(model) and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    finally:
        layers._REGISTRY.pop(Misnamed)
