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
