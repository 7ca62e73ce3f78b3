"""The baselines on a tiny ResNet: exact non-zero rates, codebook sizes, DGMS limits, BN re-estimation."""

from __future__ import annotations

import pytest
import torch
from sqs_bench import baselines
from sqs_bench.compression import compressible_layers
from sqs_bench.data import normalize
from sqs_bench.dgms import GMMQuantizer
from sqs_bench.train import Budget
from torch import nn

BUDGET = Budget(epochs=1, batch_size=16, max_batches=2, bn_images=32)


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: m.weight.detach() for n, m in compressible_layers(model).items()}


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("bits, nonzero", [(2, 0.5), (3, 0.3)])
def test_magnitude_kmeans_exact_rate_and_levels(tiny_model, tiny_splits, bits, nonzero):
    before = _state(tiny_model)
    compressed, record = baselines.magnitude_kmeans(tiny_model, tiny_splits, BUDGET, bits=bits, nonzero=nonzero)
    total = sum(w.numel() for w in _weights(tiny_model).values())
    nnz = sum((w != 0).sum().item() for w in _weights(compressed).values())
    assert nnz == round(nonzero * total) and record["nonzero"] == nnz / total
    for layer in record["layers"]:
        assert layer["distinct_levels"] == min(2**bits, layer["nnz"])
    assert all(torch.equal(v, before[k]) for k, v in tiny_model.state_dict().items())  # input untouched
    assert record["train"]["steps"] == 2 and not compressed.training
    assert not any(isinstance(m, nn.Module) and hasattr(m, "parametrizations") for m in compressed.modules())


def test_magnitude_kmeans_trains_only_the_codebook(tiny_model, tiny_splits):
    trained, _ = baselines.magnitude_kmeans(tiny_model, tiny_splits, BUDGET, bits=2, nonzero=0.5, lr=1e-2)
    untrained, _ = baselines.magnitude_kmeans(
        tiny_model, tiny_splits, Budget(epochs=0, bn_images=0), bits=2, nonzero=0.5
    )
    pruned, _ = baselines.uniform(tiny_model, tiny_splits, BUDGET, bits=8, nonzero=0.5)
    for name, w in _weights(trained).items():
        w0 = _weights(untrained)[name]
        assert torch.equal(w != 0, _weights(pruned)[name] != 0)  # the same global magnitude mask
        for level in torch.unique(w0[w0 != 0]):
            assert torch.unique(w[w0 == level]).numel() == 1  # assignments fixed, only levels move
        assert not torch.equal(w, w0)
    assert torch.equal(trained.bn1.weight, tiny_model.bn1.weight)  # nothing else is trained


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_uniform_exact_rate_and_grid(tiny_model, tiny_splits, bits):
    _, record = baselines.uniform(tiny_model, tiny_splits, BUDGET, bits=bits, nonzero=0.4)
    total = sum(w.numel() for w in _weights(tiny_model).values())
    assert record["nonzero"] == round(0.4 * total) / total
    for layer in record["layers"]:
        assert layer["distinct_levels"] <= 2**bits
    assert record["compression_rate_file"] is None and record["bits"] == bits


def test_dgms_reports_its_own_sparsity(tiny_model, tiny_splits):
    compressed, record = baselines.dgms(tiny_model, tiny_splits, BUDGET, bits=2, temperature=0.1)
    weights = _weights(compressed)
    total = sum(w.numel() for w in weights.values())
    assert record["nonzero"] == sum((w != 0).sum().item() for w in weights.values()) / total
    assert 0.0 < record["nonzero"] < 1.0 and record["target_nonzero"] is None
    for layer in record["layers"]:
        assert layer["distinct_levels"] <= 3  # K = 4 components, one of them pinned at 0


def test_gmm_quantizer_limits():
    torch.manual_seed(0)
    w = torch.randn(400) * 0.1
    quantizer = GMMQuantizer(w, 4, temperature=1e-4)
    hard_levels = quantizer.means()[quantizer.assignments(w)]
    assert quantizer.means()[0] == 0 and len(list(quantizer.parameters())) == 3
    torch.testing.assert_close(quantizer(w), hard_levels, atol=1e-4, rtol=0)  # τ → 0: soft = hard
    quantizer.hard = True
    assert torch.equal(quantizer(w), hard_levels)
    soft = GMMQuantizer(w, 4, temperature=1e4)
    torch.testing.assert_close(soft(w), soft.means().mean().expand(400), atol=1e-3, rtol=0)  # τ → ∞: mean of μ
    with pytest.raises(ValueError, match="K >= 2"):
        GMMQuantizer(w, 1, temperature=0.1)


def test_bn_recalibrate_sets_the_plain_average_and_restores_momentum():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=0.3)).eval()
    images = torch.randint(0, 256, (20, 3, 32, 32), dtype=torch.uint8)
    baselines.bn_recalibrate(model, images, batch_size=20)
    with torch.no_grad():
        out = model[0](normalize(images))
    torch.testing.assert_close(model[1].running_mean, out.mean(dim=(0, 2, 3)))
    torch.testing.assert_close(model[1].running_var, out.transpose(0, 1).reshape(4, -1).var(1), rtol=1e-4, atol=0)
    assert model[1].momentum == 0.3 and not model.training
