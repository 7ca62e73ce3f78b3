"""The moment-matched likelihood in float16 (sqs_core._noise): finite gradients once weights are pruned, and no
overflow of x² for activations above 256.

Before sqs_core._noise, a float16 layer or float16 autocast trained with ``likelihood="moment_matched"`` took NaN
gradients in every posterior parameter as soon as the pruning schedule removed a weight (sqrt(max(v, 1e-12)) with a
floor that rounds to 0 in float16: sqrt's gradient at 0 is inf), and an input above 256 made x² inf.
"""

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from sqs_core._noise import noise_std, output_std, weight_noise_std
from torch import nn


def _linear(module, x, weight, *_):
    return F.linear(x, weight)


def _pruned_model(kind, dtype):
    """A prepared model with half of its weights pruned by the schedule (their variance 0), and a batch with a
    row of zeros."""
    torch.manual_seed(0)
    if kind == "attention":  # not linear in its weight: the weight itself is drawn
        model = nn.ModuleDict({"att": nn.MultiheadAttention(8, 2, batch_first=True), "head": nn.Linear(8, 5)})
        x = torch.randn(6, 4, 8)
    else:
        model, x = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5)), torch.randn(6, 12)
    model.to(dtype)
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, likelihood="moment_matched", compile_kernels=False))
    sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=2).step(2)
    assert sum(int((p.mask == 0).sum()) for p in sqs.posteriors(model).values()) > 0
    x[0] = 0  # a zero row (a padding token, say): Var[out] = 0 there, pruned or not
    return model, x.to(dtype)


def _forward(model, x):
    if isinstance(model, nn.ModuleDict):
        return model["head"](model["att"](x, x, x)[0].mean(1))
    return model(x)


@pytest.mark.parametrize("kind", ["linear", "attention"])
@pytest.mark.parametrize("where", ["float16 layer", "float16 autocast", "bfloat16 autocast", "float32"])
def test_pruned_weights_leave_every_gradient_finite(kind, where):
    model, x = _pruned_model(kind, torch.float16 if where == "float16 layer" else torch.float32)
    y = torch.randint(0, 5, (6,), generator=torch.Generator().manual_seed(1))
    autocast = {"float16 autocast": torch.float16, "bfloat16 autocast": torch.bfloat16}.get(where)
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        out = _forward(model, x)
    loss = sqs.Objective(model, num_data=10)(F.cross_entropy(out.float(), y))
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if ".posterior." in name}
    assert grads and all(g is not None for g in grads.values())
    assert all(bool(torch.isfinite(g).all()) for g in grads.values()), [
        n for n, g in grads.items() if not torch.isfinite(g).all()
    ]
    assert any(bool(g.abs().sum() > 0) for name, g in grads.items() if name.endswith("means"))


def _reference_std(x, var):
    """sqrt(max(Σ_i x_i² Var_i, 1e-12)) in float64."""
    return F.linear(x.double() ** 2, var.double()).clamp_min(1e-12).sqrt()


@settings(max_examples=60, deadline=None)
@given(log2_scale=st.integers(-12, 15), fan_in=st.integers(1, 64), seed=st.integers(0, 2**16))
def test_float16_output_std_is_the_float64_value_at_any_input_scale(log2_scale, fan_in, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(5, fan_in, generator=gen) * 2.0**log2_scale).half().clamp(-60000, 60000)
    var = torch.rand(3, fan_in, generator=gen) * 1e-3  # the posterior's Var_q: float32
    std = output_std(_linear, None, x, var, torch.float16, True)
    assert std.dtype == torch.float32  # the layer rounds it to its output's dtype
    assert torch.allclose(std.double(), _reference_std(x, var), rtol=1e-5)


def test_float16_input_above_256_no_longer_overflows():
    x = torch.full((2, 8), 1000.0).half()  # x² = 10^6 > float16's 65504
    var = torch.full((3, 8), 1e-4)
    assert not torch.isfinite(F.linear(x * x, var.half())).all()  # what the variance path computed before
    std = output_std(_linear, None, x, var, torch.float16, True)
    assert torch.allclose(std.double(), _reference_std(x, var), rtol=1e-6)


@pytest.mark.parametrize("autocast", [False, True], ids=["float16 layer", "float16 autocast"])
def test_large_inputs_and_small_variances_leave_the_gradients_finite(autocast):
    """∂/∂Var_q = x²/(2 sqrt(Var[out])) per unit of the output's gradient: 10^6/10^-3 here, far past float16."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 3))
    with torch.no_grad():
        model[0].weight.mul_(1e-3)
    model.to(torch.float32 if autocast else torch.float16)
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, likelihood="moment_matched", compile_kernels=False))
    x = torch.full((2, 8), 1000.0)
    with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
        out = model(x if autocast else x.half())
    assert out.dtype == torch.float16
    loss = sqs.Objective(model, num_data=10)(out.float().square().mean())
    loss.backward()
    for name, p in model.named_parameters():
        if ".posterior." in name:
            assert torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_other_dtypes_compute_as_before(dtype):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, generator=gen).to(dtype)
    var = torch.rand(2, 6, generator=gen).to(torch.float64 if dtype == torch.float64 else torch.float32)
    var[0] = 0
    out_var = F.linear(x * x, var.to(dtype))
    if dtype == torch.bfloat16:  # the square root taken in float32, then rounded
        before = torch.sqrt(out_var.float().clamp_min(1e-12)).to(dtype)
    else:
        before = torch.sqrt(out_var.clamp_min(1e-12))
    assert torch.equal(output_std(_linear, None, x, var, dtype, True), before)


def test_noise_std_gradient_is_finite_where_the_variance_is_zero():
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        var = torch.tensor([0.0, 1e-7, 0.25], dtype=dtype, requires_grad=True)
        std = noise_std(var)
        assert std[2].item() == 0.5 and std[0].item() == pytest.approx(1e-6, rel=5e-2)  # a float16 subnormal
        std.sum().backward()
        assert torch.isfinite(var.grad).all() and var.grad[0] == 0, dtype
        assert var.grad[2].item() == pytest.approx(1.0, rel=1e-2)
    var = torch.tensor([0.0, 0.25], requires_grad=True)
    std = weight_noise_std(var, torch.float16)
    assert std.dtype == torch.float16 and std.tolist() == [0.0, 0.5]
    std.sum().backward()
    assert var.grad.tolist() == [0.0, 1.0]


def test_empty_and_lookup_inputs():
    var = torch.rand(3, 4)
    assert output_std(_linear, None, torch.empty(0, 4).half(), var, torch.float16, True).shape == (0, 3)
    table = torch.rand(5, 2)
    lookup = lambda m, idx, w, *_: F.embedding(idx, w)  # noqa: E731
    std = output_std(lookup, None, torch.tensor([0, 4]), table, torch.float16, False)
    assert torch.allclose(std, table[[0, 4]].sqrt())
