"""Transposed convolutions (nn.ConvTranspose1d/2d/3d, the upsampling layers of decoders and U-Nets) are compressed
like the other layers: a prepared one computes what the module computes with θ^avg as its weight, passes its
``output_size`` argument on, takes the moment-matched path, and comes back from an artifact."""

import copy

import pytest
import sqs_core as sqs
import torch
from torch import nn

CASES = {
    1: (nn.ConvTranspose1d, (2, 4, 5)),
    2: (nn.ConvTranspose2d, (2, 4, 5, 3)),
    3: (nn.ConvTranspose3d, (2, 4, 3, 2, 3)),
}


def _layer(dims: int) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(dims)
    kind, shape = CASES[dims]
    module = kind(4, 6, 3, stride=2, padding=1, groups=2, dilation=1, bias=True)
    return module, torch.randn(*shape, generator=torch.Generator().manual_seed(10 + dims))


@pytest.mark.parametrize("dims", sorted(CASES))
def test_prepared_transposed_convolution_is_the_module_at_theta_avg(dims):
    plain, x = _layer(dims)
    model = sqs.prepare_(nn.Sequential(copy.deepcopy(plain)), sqs.SQSConfig(num_components=4))
    layer = model[0]
    assert isinstance(layer, sqs.SQSLayer) and layer.weight.shape == plain.weight.shape
    with torch.no_grad():
        plain.weight.copy_(layer.weight)
    spatial = x.shape[2:]
    larger = [2 * n for n in spatial]  # stride 2, padding 1, kernel 3: 2n − 1 without output padding, 2n with
    for kwargs in ({}, {"output_size": larger}):
        out = layer(x, **kwargs)
        assert torch.allclose(out, plain(x, **kwargs), atol=1e-6)
    assert list(layer(x, output_size=larger).shape[2:]) == larger
    assert list(layer(x).shape[2:]) == [2 * n - 1 for n in spatial]


@pytest.mark.parametrize("dims", sorted(CASES))
def test_transposed_convolution_trains_moment_matched_and_round_trips(dims, tmp_path):
    plain, x = _layer(dims)
    model = sqs.prepare_(nn.Sequential(plain), sqs.SQSConfig(num_components=4, likelihood="moment_matched"))
    objective = sqs.Objective(model, num_data=8)
    opt = torch.optim.AdamW(sqs.param_groups(model, gate_lr=1e-3))
    target = torch.randn_like(model(x))
    model.train()
    torch.manual_seed(0)
    first, second = model(x), model(x)
    assert not torch.equal(first, second)  # the moment-matched output is sampled in training
    for _ in range(3):
        loss = objective((model(x) - target).square().mean())
        opt.zero_grad()
        loss.backward()
        opt.step()
    posterior = sqs.posteriors(model)["0"]
    assert posterior.gate_logits.grad is not None and posterior.means.grad.abs().sum() > 0
    model.eval()
    path = tmp_path / "deconv.sqs"
    sqs.save(model, path, nonzero=0.5)
    sqs.greedy_(model, nonzero=0.5)
    skeleton = nn.Sequential(_layer(dims)[0])
    sqs.load(path, skeleton)
    with torch.no_grad():
        assert torch.equal(skeleton(x), model(x))
    assert int((skeleton[0].weight != 0).sum()) <= round(0.5 * skeleton[0].weight.numel())


def test_padding_mode_other_than_zeros_is_refused_as_torch_refuses_it():
    module = nn.ConvTranspose2d(2, 2, 3)
    module.padding_mode = "reflect"  # the constructor refuses it; set afterwards, the forward does
    model = sqs.prepare_(nn.Sequential(module), sqs.SQSConfig(num_components=4))
    with pytest.raises(ValueError, match="Only `zeros` padding mode is supported for ConvTranspose2d"):
        model(torch.randn(1, 2, 4, 4))
