"""transformers' fused mixture-of-experts modules (MixtralExperts, GptOssExperts, ...), recognised by their contract
(sqs_core._experts): each stacked 3-D expert weight gets a posterior, the per-expert biases stay dense, and the
module's own forward runs with the compressed tensors; the file loads into the plain model with the same outputs.
Before, prepare_ compressed such a model's attention only (a quarter of Mixtral's weights), without a word. The
real transformers classes run in tests/integration/test_transformers_moe.py."""

import copy
import logging

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from torch import nn
from toy_models import FusedExperts

E, H, N = 4, 8, 6  # experts, hidden, intermediate


class MoE(nn.Module):
    def __init__(self, bias=False, flags=True):
        super().__init__()
        torch.manual_seed(0)
        self.router = nn.Linear(H, E)
        self.experts = FusedExperts(H, N, E, with_bias=bias, flags=flags)
        self.head = nn.Linear(H, 3)

    def forward(self, x):
        return self.head(x + self.experts(x, self.router(x).argmax(-1)))


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, H, generator=g), torch.randint(0, 3, (32,), generator=g)


@pytest.mark.parametrize("bias", [False, True])
def test_fused_experts_are_compressed_trained_and_round_trip(tmp_path, bias, caplog):
    with caplog.at_level(logging.INFO, logger="sqs_core"):
        model = sqs.prepare_(MoE(bias), sqs.SQSConfig(num_components=4))
    assert "stay dense" not in caplog.text
    assert sorted(sqs.posteriors(model, by_tensor=True)) == [
        "experts.down_proj",
        "experts.gate_up_proj",
        "head.weight",
        "router.weight",
    ]
    assert model.experts.gate_up_proj.shape == (E, 2 * N, H)  # the layer answers with what it computes with
    if bias:
        assert isinstance(model.experts.gate_up_proj_bias, nn.Parameter)  # dense, trained as it was
    x, y = _batch()
    objective = sqs.Objective(model, num_data=100)
    optimizer = torch.optim.AdamW(sqs.param_groups(model, gate_lr=1e-4))
    pruning = sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=3)
    for step in range(3):
        pruning.step(step)
        loss = objective(F.cross_entropy(model(x), y))
        optimizer.zero_grad()
        loss.backward()
        for name in ("gate_up_proj", "down_proj"):
            layer = next(m for m in sqs.sqs_layers(model).values() if m.adapter.weight_name == name)
            assert float(layer.posterior.means.grad.abs().sum()) > 0, name
        optimizer.step()
    model.eval()
    sqs.greedy_(model, nonzero=0.5)
    sqs.save(model, tmp_path / "m.sqs", nonzero=0.5)
    plain = sqs.load(tmp_path / "m.sqs", MoE(bias).eval())
    copied = copy.deepcopy(model)  # the adapter pickles
    with torch.no_grad():
        assert torch.equal(plain(x), model(x)) and torch.equal(copied(x), model(x))
        assert float((plain.experts.down_proj == 0).float().mean()) > 0.2  # pruned experts' weights are zeros
    average = sqs.BayesianAverage(model, samples=2, nonzero=0.5, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(average(x)).all()


def test_experts_without_the_contract_stay_dense_with_a_warning_naming_them(caplog):
    with caplog.at_level(logging.INFO, logger="sqs_core"):
        model = sqs.prepare_(MoE(flags=False), sqs.SQSConfig(num_components=4))
    assert sorted(sqs.posteriors(model)) == ["head", "router"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "stay dense" in r.getMessage()]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    dense = E * 2 * N * H + E * H * N
    total = dense + H * E + H * 3
    assert f"({dense} of {total}," in message and "FusedExperts (gate_up_proj, down_proj:" in message
    assert "register_layer_type" in message


def test_expert_parallel_experts_are_refused_and_nothing_changes():
    model = MoE()
    model.experts._is_expert_parallel = True
    with pytest.raises(ValueError, match=r"layer 'experts' \(FusedExperts\) is expert-parallel"):
        sqs.prepare_(model)
    assert not sqs.is_prepared(model) and isinstance(model.experts.down_proj, nn.Parameter)


class UnmarkedExperts(FusedExperts):
    """Experts without transformers' decorator flags (Llama-4's, JetMoE's): registered by the user."""

    def __init__(self):
        super().__init__(H, N, E, flags=False)


class UnmarkedMoE(MoE):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.experts = UnmarkedExperts()


def test_unmarked_experts_register_with_the_public_expert_weights(tmp_path):
    sqs.register_layer_type(UnmarkedExperts, sqs.LayerAdapter(None, None, weight_names=sqs.expert_weights))
    model = sqs.prepare_(UnmarkedMoE(), sqs.SQSConfig(num_components=4))
    assert {"experts.gate_up_proj", "experts.down_proj"} <= set(sqs.posteriors(model, by_tensor=True))
    x, _ = _batch()
    model.eval()
    sqs.greedy_(model)
    sqs.save(model, tmp_path / "m.sqs")
    plain = sqs.load(tmp_path / "m.sqs", UnmarkedMoE().eval())
    with torch.no_grad():
        assert torch.equal(plain(x), model(x)) and torch.equal(copy.deepcopy(model)(x), model(x))
