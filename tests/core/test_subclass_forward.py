"""A subclass of a supported layer type with its own forward (BART's and Gemma's scaled embeddings, timm's
weight-standardised StdConv2d) runs that forward with the compressed weight substituted, in training and in the
fixed modes, and the file loads into the plain subclass with the same outputs. (They were refused before
session 56, so BART, mBART, Pegasus and Gemma needed their embeddings excluded.) A forward patched onto an
instance stays refused (tests/core/test_errors.py)."""

import copy

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from torch import nn


class ScaledEmbedding(nn.Embedding):
    """As transformers' BartScaledWordEmbedding: the lookup times a scale."""

    def __init__(self, num, dim, padding_idx, scale):
        super().__init__(num, dim, padding_idx=padding_idx)
        self.scale = scale

    def forward(self, ids):
        return super().forward(ids) * self.scale


class StdConv2d(nn.Conv2d):
    """As timm's StdConv2d: the weight standardised per output channel before the convolution."""

    def forward(self, x):
        w = self.weight
        mean, var = w.mean((1, 2, 3), keepdim=True), w.var((1, 2, 3), unbiased=False, keepdim=True)
        return F.conv2d(x, (w - mean) / torch.sqrt(var + 1e-6), self.bias, self.stride, self.padding)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = ScaledEmbedding(30, 12, padding_idx=0, scale=3.0)
        self.conv = StdConv2d(1, 4, 3, padding=1)
        self.head = nn.Linear(12 * 4, 5)

    def forward(self, ids):
        h = self.embed(ids)  # (B, 12, 12): a one-channel image per sequence
        return self.head(F.relu(self.conv(h[:, None])).mean(-1).flatten(1))


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 30, (6, 12), generator=g), torch.randint(0, 5, (6,), generator=g)


@pytest.mark.parametrize("likelihood", ["plugin", "moment_matched"])
def test_subclass_forward_runs_with_the_compressed_weight_and_round_trips(tmp_path, likelihood):
    torch.manual_seed(0)
    model = sqs.prepare_(Net(), sqs.SQSConfig(num_components=4, likelihood=likelihood))
    assert sorted(sqs.sqs_layers(model)) == ["conv", "embed", "head"]
    ids, y = _batch()
    reference = Net()  # the subclasses' own forwards, given θ^avg as their weights
    model.eval()  # the moment-matched likelihood draws weights in training mode
    with torch.no_grad():
        reference.embed.weight.copy_(model.embed.weight)
        reference.conv.weight.copy_(model.conv.weight)
        reference.conv.bias.copy_(model.conv.bias)
        torch.testing.assert_close(model.embed(ids), reference.embed(ids), rtol=0, atol=0)
        assert float(model.embed(ids)[ids == 0].abs().max()) == 0.0  # the padding row stays zero
        h = torch.randn(2, 1, 12, 12)
        torch.testing.assert_close(model.conv(h), reference.conv(h), rtol=1e-6, atol=1e-6)
    model.train()
    objective = sqs.Objective(model, num_data=100)
    optimizer = torch.optim.AdamW(sqs.param_groups(model, gate_lr=1e-4))
    for _ in range(2):
        loss = objective(F.cross_entropy(model(ids), y))
        optimizer.zero_grad()
        loss.backward()
        for name in ("embed", "conv"):
            assert float(model.get_submodule(name).posterior.means.grad.abs().sum()) > 0, name
        optimizer.step()
    sqs.greedy_(model, nonzero=0.5)
    sqs.save(model, tmp_path / "m.sqs", nonzero=0.5)
    plain = sqs.load(tmp_path / "m.sqs", Net())
    copied = copy.deepcopy(model)  # the adapter pickles
    with torch.no_grad():
        assert torch.equal(plain(ids), model(ids)) and torch.equal(copied(ids), model(ids))
        g = torch.Generator().manual_seed(3)
        averaged = sqs.BayesianAverage(model, samples=2, nonzero=0.5, generator=g)(ids)
        from_file = sqs.load_bayesian_average(
            tmp_path / "m.sqs", Net(), samples=2, generator=torch.Generator().manual_seed(3)
        )(ids)
        assert torch.isfinite(averaged).all() and torch.equal(from_file, averaged)


class PositionalEmbedding(nn.Embedding):
    """As transformers' ProphetNetPositionalEmbeddings: a method beside forward that model code calls on the
    layer (``self.position_embeddings._forward(ids)``), a property reading the weight, a static method."""

    def forward(self, length):
        return self._forward(torch.arange(length))

    def _forward(self, ids):
        return super().forward(ids) * 2.0

    @property
    def row_norms(self):
        return self.weight.norm(dim=-1)

    @staticmethod
    def offset(ids):
        return ids + 1


def test_a_method_the_subclass_defines_runs_with_the_compressed_weight():
    """ProphetNet's decoder calls its positional embedding's ``_forward``: before session 57 the SQS layer had
    no such attribute, as it passes on no method of the module it wraps."""
    torch.manual_seed(0)
    model = sqs.prepare_(nn.Sequential(PositionalEmbedding(8, 4), nn.Linear(4, 2)), sqs.SQSConfig(num_components=4))
    layer, ids = model[0], torch.tensor([1, 3, 5])
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(layer._forward(ids), layer.weight[ids] * 2.0, rtol=0, atol=0)
        torch.testing.assert_close(layer.row_norms, layer.weight.norm(dim=-1), rtol=0, atol=0)
    assert torch.equal(layer.offset(ids), ids + 1)
    model.train()
    layer._forward(ids).sum().backward()  # the gradient reaches the posterior through the method
    assert float(layer.posterior.means.grad.abs().sum()) > 0
    sqs.greedy_(model)
    with torch.no_grad():
        assert torch.equal(layer._forward(ids), layer.fixed_weight[ids] * 2.0)
        assert torch.equal(layer(3), layer.fixed_weight[:3] * 2.0)
    with pytest.raises(AttributeError, match="reset_parameters"):  # nn.Embedding's own methods stay unreachable
        _ = layer.reset_parameters
