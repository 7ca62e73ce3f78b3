"""float16 / bfloat16 layers: the posterior is kept in float32 (θ upcast exactly), the layer runs in its own
dtype, and a posterior cast down after prepare_ is refused with a clear error.

Before the posterior was upcast, a half-precision layer crashed: eager with an overflow (float16) or an
index past the bin table (bfloat16), compiled by aborting the process (an index assert in a kernel).
"""

import copy

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from torch import nn

HALF = [torch.float16, torch.bfloat16]


def _pair(dtype, compiled):
    """(half model, the same weights in float32), both prepared with the same config."""
    torch.manual_seed(0)
    half = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 5)).to(dtype)
    full = copy.deepcopy(half).float()
    config = sqs.SQSConfig(num_components=8, windows="outlier", compile_kernels=compiled)
    return sqs.prepare_(half, config), sqs.prepare_(full, config)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_layer_keeps_a_float32_posterior_and_runs_in_its_dtype(dtype, compiled):
    half, full = _pair(dtype, compiled)
    for (name, p), q in zip(sqs.posteriors(half).items(), sqs.posteriors(full).values(), strict=True):
        assert p.weight_dtype == dtype and q.weight_dtype == torch.float32, name
        assert all(t.dtype == torch.float32 for t in (p.weight, p.means, p.log_stds, p.gate_logits)), name
        # θ upcast exactly, so the posterior is that of the float32 copy, bit for bit
        for a, b in zip(p.state_dict().values(), q.state_dict().values(), strict=True):
            assert torch.equal(a, b), name
        assert torch.equal(p.moments()[0], q.moments()[0]), name
    x = torch.randn(16, 48, generator=torch.Generator().manual_seed(1))
    out = half(x.to(dtype))
    assert out.dtype == dtype
    assert torch.allclose(out.float(), full(x), atol=0.02, rtol=0.02)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_layer_trains_and_its_inference_is_in_its_dtype(dtype, tmp_path):
    half, _ = _pair(dtype, False)
    x = torch.randn(16, 48, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 5, (16,), generator=torch.Generator().manual_seed(2))
    objective = sqs.Objective(half, num_data=16)
    posterior_params = [p for name, p in half.named_parameters() if ".posterior." in name]
    opt = torch.optim.AdamW(posterior_params, lr=1e-3)  # (AdamW on float16 biases is a float16 matter)
    before = [p.detach().clone() for p in posterior_params]
    for _ in range(3):
        loss = objective(F.cross_entropy(half(x.to(dtype)).float(), y))
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in posterior_params)
        opt.step()
    assert all(p.dtype == torch.float32 for p in posterior_params)
    assert any(not torch.equal(a, p) for a, p in zip(before, posterior_params, strict=True))
    # greedy weights are the float32 posterior's levels rounded to the layer's dtype
    reference = {name: d.weights() for name, d in sqs.discrete_posteriors(copy.deepcopy(half).float()).items()}
    sqs.greedy_(half)
    for name, layer in sqs.sqs_layers(half).items():
        assert layer.fixed_weight.dtype == dtype
        assert torch.equal(layer.fixed_weight.reshape(-1), reference[name].to(dtype).reshape(-1)), name
    assert half(x.to(dtype)).dtype == dtype
    # the artifact loads into a model of the original dtype
    path = tmp_path / "half.sqs"
    sqs.save(half, path)
    skeleton = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 5)).to(dtype)
    sqs.load(path, skeleton)
    assert torch.equal(skeleton(x.to(dtype)), half(x.to(dtype)))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_posterior_cast_down_after_prepare_is_refused(dtype):
    half, _ = _pair(dtype, False)
    half.to(dtype)  # casts the float32 posteriors down too
    p = sqs.posteriors(half)["0"]
    kept = {name: t.clone() for name, t in p.state_dict().items()}
    x = torch.randn(4, 48).to(dtype)
    with pytest.raises(ValueError, match=rf"half precision: weight \({str(dtype).removeprefix('torch.')}\)"):
        half(x)
    with pytest.raises(ValueError, match=r"model\.float\(\)"):
        sqs.greedy_(half)
    assert all(torch.equal(kept[name], t) for name, t in p.state_dict().items())
    half.float()
    assert half(x.float()).dtype == torch.float32


def test_prepare_logs_the_upcast(caplog):
    with caplog.at_level("INFO", logger="sqs_core"):
        _pair(torch.bfloat16, False)
    assert "posteriors of torch.bfloat16 layers in float32" in caplog.text
