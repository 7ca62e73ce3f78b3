"""Prepared layers inside modules that read ``layer.weight`` themselves, and whole prepared models pickled.

nn.MultiheadAttention passes ``out_proj.weight`` / ``.bias`` to its functional form instead of calling
out_proj, so SQSLayer exposes ``weight`` (θ^avg or the fixed weight) and ``bias``; before, a prepared
nn.TransformerEncoderLayer failed with "'SQSLayer' object has no attribute 'weight'". (The attention's own
``in_proj_weight`` is excluded here; tests/core/test_multihead_attention.py compresses it.) The built-in adapters
are module-level functions, so ``torch.save(model)`` pickles a prepared model (lambdas did not).
"""

import copy
import io

import pytest
import sqs_core as sqs
import torch
from torch import nn


def _encoder():
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)


def _with_weights(plain, weights):
    """A copy of the plain module with the given {layer name: weight}."""
    out = copy.deepcopy(plain)
    with torch.no_grad():
        for name, weight in weights.items():
            out.get_submodule(name).weight.copy_(weight)
    return out


def test_transformer_encoder_layer_trains_through_out_proj_weight(tmp_path):
    plain, model = _encoder(), _encoder()
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, exclude=("self_attn$",)))  # the attention's in_proj dense
    layers = sqs.sqs_layers(model)
    assert set(layers) == {"self_attn.out_proj", "linear1", "linear2"}
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(1))
    means = {name: layer.weight.detach() for name, layer in layers.items()}
    out = model(x)
    assert torch.allclose(out, _with_weights(plain, means)(x), atol=1e-5)
    out.square().mean().backward()
    grads = {name: layer.posterior.gate_logits.grad for name, layer in layers.items()}
    assert all(g is not None and bool(g.abs().sum() > 0) for g in grads.values()), grads.keys()
    sqs.greedy_(model)
    fixed = {name: layer.fixed_weight for name, layer in layers.items()}
    assert all(torch.equal(layers[name].weight, w) for name, w in fixed.items())
    model.eval()
    plain.eval()
    with torch.no_grad():
        want = _with_weights(plain, fixed)(x)
        assert torch.allclose(model(x), want, atol=1e-5)
        sqs.save(model, tmp_path / "encoder.sqs")
        assert torch.allclose(sqs.load(tmp_path / "encoder.sqs", _encoder().eval())(x), want, atol=1e-5)


def test_a_prepared_model_pickles_whole():
    model = sqs.prepare_(nn.Sequential(nn.Conv1d(2, 4, 3), nn.Flatten(), nn.Linear(24, 3)), sqs.SQSConfig())
    again = torch.load(_pickled(model), weights_only=False)
    x = torch.randn(2, 2, 8)
    assert torch.equal(again(x), model(x))
    assert list(sqs.sqs_layers(again)) == list(sqs.sqs_layers(model))


def test_assigning_bias_sets_the_wrapped_modules_and_weight_is_refused():
    """``layer.bias = ...`` raised KeyError "attribute 'bias' already exists" (a Parameter) or "property 'bias'
    has no setter" (None); it now sets the wrapped module's bias, which the forward and the optimizer see."""
    model = sqs.prepare_(nn.Sequential(nn.Linear(6, 3)), sqs.SQSConfig())
    layer, x = model[0], torch.randn(2, 6)
    new_bias = nn.Parameter(torch.arange(3.0))
    layer.bias = new_bias
    assert layer.base_layer.bias is new_bias and layer.bias is new_bias
    assert any(p is new_bias for p in model.parameters())
    assert torch.allclose(model(x), nn.functional.linear(x, layer.weight, new_bias))
    layer.bias = None
    assert layer.base_layer.bias is None
    assert torch.allclose(model(x), nn.functional.linear(x, layer.weight))
    with pytest.raises(AttributeError, match="set_fixed_weight"):
        layer.weight = nn.Parameter(torch.zeros(3, 6))
    assert "weight" not in dict(layer.named_parameters(recurse=False))


class _SizedNet(nn.Module):
    """Model code that reads its layers' sizes, as many models do (reshapes, assertions, heads)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8, padding_idx=0)
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 3)

    def forward(self, tokens):
        h = self.emb(tokens).transpose(1, 2)
        assert h.shape[1] == self.conv.in_channels == self.emb.embedding_dim
        return self.fc(self.conv(h).mean(-1)).reshape(-1, self.fc.out_features)


def test_a_prepared_layer_passes_on_the_wrapped_modules_data_attributes():
    torch.manual_seed(0)
    model, tokens = _SizedNet(), torch.randint(0, 10, (2, 5))
    plain = {n: dict(vars(m)) for n, m in model.named_children()}
    sqs.prepare_(model, sqs.SQSConfig(num_components=4))
    assert model(tokens).shape == (2, 3)
    for name, attrs in plain.items():
        layer = getattr(model, name)
        for attr, value in attrs.items():
            if not attr.startswith("_") and attr != "training":
                assert getattr(layer, attr) == value, (name, attr)
    assert model.fc.in_features == 8 and model.emb.padding_idx == 0 and model.conv.kernel_size == (3,)
    model.conv.padding = 0  # sets the wrapped conv's, which the forward uses
    assert model.conv.base_layer.padding == 0 and "padding" not in vars(model.conv)
    assert model.conv(torch.randn(1, 8, 5)).shape == (1, 8, 3)
    model.eval()  # training is the layer's own, not passed on
    assert not model.fc.training and not model.fc.base_layer.training
    for missing in ("reset_parameters", "no_such_attribute", "_conv_forward"):  # methods and private names are not
        with pytest.raises(AttributeError, match=missing):
            getattr(model.conv, missing)
    copy.deepcopy(model)(tokens)
    torch.load(_pickled(model), weights_only=False)(tokens)


def _pickled(model):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("likelihood", ["plugin", "moment_matched"])
def test_an_embedding_with_max_norm_keeps_its_rows_within_it_in_training(likelihood):
    """nn.Embedding(max_norm=...) rescales each row it looks up, which is not linear in the weight: the
    moment-matched likelihood draws the weight for it, as for attention. Its variance path had looked up Var_q
    with max_norm too, so training rows reached 3.5× max_norm (session 63)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 16, max_norm=0.5))
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, likelihood=likelihood))
    tokens = torch.arange(20).reshape(4, 5)
    out = model(tokens)
    assert float(out.norm(dim=-1).max()) <= 0.5 * (1 + 1e-5)
    out.sum().backward()
    assert bool(sqs.posteriors(model)["0"].means.grad.isfinite().all())
