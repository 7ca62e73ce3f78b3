"""nn.MultiheadAttention (nn.Transformer*, torchvision's ViT) is compressed: its ``in_proj_weight`` (a bare
parameter) by the attention layer's own posterior, its ``out_proj`` as a Linear. A prepared one computes what the
module computes with θ^avg in both weights (its masks, ``batch_first``, attention weights), nn.TransformerEncoder's
inference fast path reads the compressed weights, and an artifact loads into the plain model."""

from __future__ import annotations

import copy
import dataclasses
import logging

import pytest
import sqs_core as sqs
import torch
from crafted_files import resealed
from sqs_core._artifact_file import read_artifact
from torch import nn


def _encoder(seed: int = 0) -> nn.TransformerEncoder:
    torch.manual_seed(seed)
    block = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(block, 2, enable_nested_tensor=False)


def _tokens(shape=(3, 5, 16), seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_prepared_attention_is_the_module_at_theta_avg(batch_first, bias):
    torch.manual_seed(0)
    plain = nn.MultiheadAttention(16, 4, bias=bias, add_bias_kv=bias, batch_first=batch_first)
    model = sqs.prepare_(nn.ModuleDict({"attn": copy.deepcopy(plain)}), sqs.SQSConfig(num_components=4))
    layer = model["attn"]
    assert set(sqs.sqs_layers(model)) == {"attn", "attn.base_layer.out_proj"}
    assert layer.in_proj_weight.shape == (48, 16) and torch.equal(layer.in_proj_weight, layer.weight)
    with torch.no_grad():  # the plain module with the posterior's θ^avg as both weights
        plain.in_proj_weight.copy_(layer.weight)
        plain.out_proj.weight.copy_(layer.out_proj.weight)
    q, kv = _tokens((3, 5, 16)), _tokens((3, 7, 16), seed=2)  # batch 3, 5 queries, 7 keys
    if not batch_first:
        q, kv = q.transpose(0, 1), kv.transpose(0, 1)
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[0, -2:] = True
    mask = torch.rand(5, 7, generator=torch.Generator().manual_seed(3)) < 0.2
    for kwargs in ({}, {"key_padding_mask": padding, "attn_mask": mask, "average_attn_weights": False}):
        out, weights = layer(q, kv, kv, **kwargs)
        ref_out, ref_weights = plain(q, kv, kv, **kwargs)
        assert torch.allclose(out, ref_out, atol=1e-6) and torch.allclose(weights, ref_weights, atol=1e-6)
    out.sum().backward()
    assert sqs.posteriors(model)["attn"].means.grad.abs().sum() > 0
    model.eval()
    plain.eval()
    with torch.no_grad():  # self-attention without gradients: the module's own fast path where it applies
        assert torch.allclose(layer(q, q, q)[0], plain(q, q, q)[0], atol=1e-6)


def test_transformer_encoder_trains_and_round_trips_with_its_fast_path(tmp_path):
    model = _encoder()
    skeleton = copy.deepcopy(model)
    sqs.prepare_(model, sqs.SQSConfig(num_components=4))
    assert {n for n in sqs.sqs_layers(model) if n.startswith("layers.0.")} == {
        "layers.0.self_attn",
        "layers.0.self_attn.base_layer.out_proj",
        "layers.0.linear1",
        "layers.0.linear2",
    }
    x = _tokens()
    objective = sqs.Objective(model, num_data=8)
    opt = torch.optim.AdamW(sqs.param_groups(model, gate_lr=1e-3))
    before = sqs.posteriors(model)["layers.0.self_attn"].gate_logits.detach().clone()
    for _ in range(3):
        loss = objective(model(x).square().mean())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert not torch.equal(before, sqs.posteriors(model)["layers.0.self_attn"].gate_logits)
    model.eval()
    sqs.greedy_(model, nonzero=0.5)
    path = tmp_path / "encoder.sqs"
    sqs.save(model, path, nonzero=0.5)
    records = {r["layers"][0]: r for r in read_artifact(path).records}
    assert records["layers.0.self_attn"]["parameters"] == ["in_proj_weight"]
    assert "parameters" not in records["layers.0.self_attn.out_proj"]  # plain names, ``weight``: field left out
    report = sqs.compression_report(path)
    assert {r.name: r.parameter for r in report.layers}["layers.0.self_attn"] == "in_proj_weight"
    assert "layers.0.self_attn.in_proj_weight " in str(report) and "layers.0.self_attn.out_proj " in str(report)
    sqs.load(path, skeleton).eval()
    assert torch.equal(skeleton.layers[1].self_attn.in_proj_weight, model.layers[1].self_attn.fixed_weight)
    fast_calls = []
    real = torch._transformer_encoder_layer_fwd

    def spy(*args, **kwargs):
        fast_calls.append(1)
        return real(*args, **kwargs)

    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "_transformer_encoder_layer_fwd", spy)
        fast = model(x)
        assert len(fast_calls) == 2  # the fused kernel ran on the prepared model, reading layer.in_proj_weight
        assert torch.equal(fast, skeleton(x))
    model.train()  # the ordinary path (no dropout in these blocks)
    assert torch.allclose(model(x), fast, atol=1e-5)


def test_moment_matched_attention_draws_its_weight_in_training():
    model = sqs.prepare_(_encoder(), sqs.SQSConfig(num_components=4, likelihood="moment_matched"))
    x = _tokens()
    model.train()
    torch.manual_seed(0)
    first, second = model(x), model(x)
    assert not torch.equal(first, second)
    objective = sqs.Objective(model, num_data=8)
    objective(first.square().mean()).backward()
    grad = sqs.posteriors(model)["layers.0.self_attn"].means.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), model(x))  # eval: θ^avg, no draw


def test_the_drawn_attention_weight_keeps_pruned_weights_at_zero():
    model = sqs.prepare_(_encoder(), sqs.SQSConfig(num_components=4, likelihood="moment_matched"))
    layer = model.layers[0].self_attn
    keep = torch.rand(48, 16, generator=torch.Generator().manual_seed(0)) < 0.5
    layer.posterior.set_mask_(keep)
    drawn = []

    def spy(base, query, weight, *args, **kwargs):
        drawn.append(weight.detach())
        return layer_forward(base, query, weight, *args, **kwargs)

    layer_forward = layer.adapter.forward
    layer.adapter = dataclasses.replace(layer.adapter, forward=spy)
    model.train()
    model(_tokens())
    assert torch.equal(drawn[0][~keep], torch.zeros(int((~keep).sum())))  # no noise on a pruned weight
    assert not torch.equal(drawn[0][keep], layer.weight.detach()[keep])  # the kept ones are drawn


def test_separate_projection_weights_are_compressed_each_and_round_trip(tmp_path):
    """With kdim/vdim ≠ embed_dim the module holds q/k/v weights of their own: one posterior each, one SQS layer
    around the other, and the module's forward runs with all three substituted."""
    torch.manual_seed(0)
    plain = nn.MultiheadAttention(16, 4, kdim=8, vdim=12)
    model = sqs.prepare_(nn.ModuleDict({"attn": copy.deepcopy(plain)}), sqs.SQSConfig(num_components=4))
    layer = model["attn"]
    names = ("q_proj_weight", "k_proj_weight", "v_proj_weight")
    assert {getattr(layer, n).shape for n in names} == {(16, 16), (16, 8), (16, 12)}
    assert len(sqs.posteriors(model)) == 4  # q, k, v and out_proj
    with torch.no_grad():
        for n in names:
            getattr(plain, n).copy_(getattr(layer, n))
        plain.out_proj.weight.copy_(layer.out_proj.weight)
    q, k, v = _tokens((5, 3, 16)), _tokens((7, 3, 8), seed=2), _tokens((7, 3, 12), seed=3)
    assert torch.allclose(layer(q, k, v)[0], plain(q, k, v)[0], atol=1e-6)
    layer(q, k, v)[0].sum().backward()
    assert all(p.means.grad.abs().sum() > 0 for p in sqs.posteriors(model).values())
    sqs.greedy_(model, nonzero=0.5)
    path = tmp_path / "qkv.sqs"
    sqs.save(model, path, nonzero=0.5)
    assert sorted(r.parameter for r in sqs.compression_report(path).layers) == [
        "k_proj_weight",
        "q_proj_weight",
        "v_proj_weight",
        "weight",
    ]
    skeleton = nn.ModuleDict({"attn": nn.MultiheadAttention(16, 4, kdim=8, vdim=12)})
    sqs.load(path, skeleton)
    with torch.no_grad():
        assert torch.equal(skeleton["attn"](q, k, v)[0], layer(q, k, v)[0])


def test_the_compressed_weight_cannot_be_assigned():
    model = sqs.prepare_(nn.ModuleDict({"attn": nn.MultiheadAttention(16, 4)}))
    with pytest.raises(AttributeError, match="in_proj_weight is computed from the posterior"):
        model["attn"].in_proj_weight = nn.Parameter(torch.zeros(48, 16))
    assert model["attn"]._qkv_same_embed_dim  # passed on: nn.TransformerEncoderLayer's fast path reads it


def test_bad_parameter_names_in_a_file_are_refused(tmp_path):
    model = sqs.prepare_(nn.ModuleDict({"attn": nn.MultiheadAttention(16, 4)}), sqs.SQSConfig(num_components=4))
    path = tmp_path / "attn.sqs"
    sqs.save(model, path, nonzero=0.5)
    for bad in (["in_proj_weight", "weight"], ["in proj"], "in_proj_weight", [3]):

        def edit(records, _, bad=bad):
            records[[r["layers"][0] for r in records].index("attn")]["parameters"] = bad

        out = resealed(path, tmp_path / "bad.sqs", edit)
        with pytest.raises(ValueError, match="bad parameter names"):
            read_artifact(out)


def test_register_layer_type_checks_the_new_fields():
    class Odd(nn.Module):
        pass

    for kwargs, message in (
        ({"forward_no_bias": 3}, "forward_no_bias must be callable or None"),
        ({"weight_name": "in proj"}, "weight_name must name a parameter"),
        ({"passes": {"x"}}, "passes must be a frozenset"),
        ({"weight_names": ("a", "b")}, "weight_names must be callable"),
        ({"forward": None}, "with a callable forward"),
    ):
        adapter = sqs.LayerAdapter(**{"forward": lambda b, x, w: x, "forward_no_bias": None, **kwargs})
        with pytest.raises(ValueError, match=message):
            sqs.register_layer_type(Odd, adapter)


def test_torch_compile_of_a_prepared_encoder_matches_eager():
    model = sqs.prepare_(_encoder(), sqs.SQSConfig(num_components=4))
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="aot_eager")  # dynamo traces functional_call around the posterior
    x = _tokens()
    for _ in range(2):
        got, want = compiled(x), reference(x)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
        got.square().mean().backward()
        want.square().mean().backward()
        assert torch.allclose(
            model.layers[0].self_attn.posterior.means.grad,
            reference.layers[0].self_attn.posterior.means.grad,
            rtol=1e-5,
            atol=1e-8,
        )
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)


def test_a_bare_layer_as_the_model_is_named(caplog):
    with pytest.raises(ValueError, match=r"model is itself a Linear layer: .*nn.Sequential"):
        sqs.prepare_(nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"model is itself an Embedding layer: "):
        sqs.prepare_(nn.Embedding(5, 4))
    attn = nn.MultiheadAttention(16, 4)  # its out_proj can be swapped, its own in_proj_weight cannot
    with caplog.at_level(logging.WARNING, logger="sqs_core.prepare"):
        sqs.prepare_(attn)
    assert "itself a MultiheadAttention" in caplog.text
    assert set(sqs.sqs_layers(attn)) == {"out_proj"}


def test_encoder_decoder_transformer_round_trips(tmp_path):
    """nn.Transformer: the decoder's self- and cross-attention (key and value from the encoder's memory) too."""
    torch.manual_seed(0)
    kwargs = dict(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32, dropout=0.0)
    model = sqs.prepare_(nn.Transformer(**kwargs, batch_first=True), sqs.SQSConfig(num_components=4))
    attention = [n for n, layer in sqs.sqs_layers(model).items() if isinstance(layer.base_layer, nn.MultiheadAttention)]
    assert attention == ["encoder.layers.0.self_attn", "decoder.layers.0.self_attn", "decoder.layers.0.multihead_attn"]
    src, tgt = _tokens((2, 5, 16)), _tokens((2, 4, 16), seed=2)
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    model(src, tgt, tgt_mask=mask, tgt_is_causal=True).square().mean().backward()
    assert sqs.posteriors(model)["decoder.layers.0.multihead_attn"].means.grad.abs().sum() > 0
    model.eval()
    sqs.greedy_(model, nonzero=0.5)
    path = tmp_path / "transformer.sqs"
    sqs.save(model, path, nonzero=0.5)
    torch.manual_seed(1)
    plain = sqs.load(path, nn.Transformer(**kwargs, batch_first=True)).eval()
    layers = sqs.sqs_layers(model)
    for name, weight in plain.named_parameters():  # the artifact holds the greedy weights bit for bit
        owner, _, leaf = name.rpartition(".")
        if owner in layers and layers[owner].mode == "fixed" and leaf in ("weight", "in_proj_weight"):
            assert torch.equal(weight, layers[owner].fixed_weight), name
    with torch.no_grad():
        expected = model(src, tgt, tgt_mask=mask)
        torch.testing.assert_close(plain(src, tgt, tgt_mask=mask), expected, rtol=1e-6, atol=1e-6)
        # Bit for bit once the plain weights no longer require grad, as the fixed weights do not: for a 3-D
        # transposed input with a bias (attention's projections), ATen's linear adds the bias inside the GEMM
        # (addmm) for a weight that requires grad and after it (matmul + add) otherwise, and some CPUs round the two
        # differently (AMD EPYC, torch 2.13.0: 2e-7).
        assert torch.equal(plain.requires_grad_(False)(src, tgt, tgt_mask=mask), expected)


def test_upgrade_keeps_the_parameter_names(tmp_path):
    model = sqs.prepare_(nn.ModuleDict({"attn": nn.MultiheadAttention(16, 4)}), sqs.SQSConfig(num_components=4))
    sqs.save(model, tmp_path / "a.sqs", nonzero=0.5)
    sqs.upgrade(tmp_path / "a.sqs", tmp_path / "b.sqs")
    records = {r["layers"][0]: r for r in read_artifact(tmp_path / "b.sqs").records}
    assert records["attn"]["parameters"] == ["in_proj_weight"] and "parameters" not in records["attn.out_proj"]
    from_old = sqs.load(tmp_path / "a.sqs", nn.ModuleDict({"attn": nn.MultiheadAttention(16, 4)}))
    from_new = sqs.load(tmp_path / "b.sqs", nn.ModuleDict({"attn": nn.MultiheadAttention(16, 4)}))
    assert torch.equal(from_new["attn"].in_proj_weight, from_old["attn"].in_proj_weight)
