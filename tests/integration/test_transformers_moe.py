"""transformers' mixture-of-experts models, ProphetNet and gradient checkpointing, from small configs, offline
(session 57).

Since transformers 5 a MoE block keeps its experts in one module of stacked 3-D parameters (``MixtralExperts``,
``GptOssExperts``, ...), with no ``nn.Linear``: prepare_ compressed only their attention (a quarter of the
weights) until sqs_core._experts recognised the experts by the contract of transformers' experts decorator.
ProphetNet's decoder calls its positional embedding's ``_forward`` (a method of that nn.Embedding subclass), which
an SQS layer did not answer (sqs_core._subclass_forward)."""

from __future__ import annotations

import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach a model hub
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest
import sqs_core as sqs
import torch

transformers = pytest.importorskip("transformers", reason="the integration environment installs transformers")
from short_training import train_with_schedule as _train  # noqa: E402
from test_transformers import assert_checkpointing_keeps_the_gradients  # noqa: E402

SMALL = dict(
    vocab_size=101,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
MOE = {  # model type -> (config class, model class, extra config)
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=24),
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(num_local_experts=4, num_experts_per_tok=2, layer_types=["full_attention"] * 2),
    ),
}


def _moe(kind: str, seed: int = 0):
    config_class, model_class, extra = MOE[kind]
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**SMALL, **extra)
    return getattr(transformers, model_class)(config).eval()


@pytest.mark.parametrize("kind", sorted(MOE))
def test_moe_experts_are_compressed_and_round_trip(tmp_path, kind, caplog):
    model = _moe(kind)
    experts = [n for n, m in model.named_modules() if type(m).__name__.endswith("Experts")]
    assert len(experts) == 2
    with caplog.at_level(logging.WARNING, logger="sqs_core"):
        sqs.prepare_(model, sqs.SQSConfig(num_components=4))
    assert "stay dense" not in caplog.text  # at most the routers' small matrices, below the warning's share
    compressed = sqs.posteriors(model, by_tensor=True)
    for name in experts:
        assert {f"{name}.gate_up_proj", f"{name}.down_proj"} <= set(compressed)
    if kind == "gpt_oss":  # its per-expert biases stay dense, as every bias does
        assert isinstance(model.get_submodule(experts[0]).gate_up_proj_bias, torch.nn.Parameter)
    tokens = torch.randint(3, 101, (2, 12), generator=torch.Generator().manual_seed(1))
    model.train()
    losses = _train(model, 2, lambda m: m(tokens, labels=tokens).loss, num_data=1_000, nonzero=0.5)
    assert all(torch.isfinite(torch.tensor(losses)))
    model.eval()
    sqs.greedy_(model, nonzero=0.5)
    sqs.save(model, tmp_path / "m.sqs", nonzero=0.5)
    plain = sqs.load(tmp_path / "m.sqs", _moe(kind, seed=3))  # other initial weights: all must come from the file
    with torch.no_grad():
        assert torch.equal(plain(tokens).logits, model(tokens).logits)
    report = sqs.compression_report(tmp_path / "m.sqs")
    assert report.nonzero_rate == pytest.approx(0.5, abs=0.01)


def test_prophetnet_runs_its_positional_embeddings_method_after_prepare(tmp_path):
    def prophetnet(seed):
        torch.manual_seed(seed)
        config = transformers.ProphetNetConfig(
            vocab_size=101,
            hidden_size=32,
            encoder_ffn_dim=48,
            decoder_ffn_dim=48,
            num_encoder_layers=1,
            num_decoder_layers=1,
            num_encoder_attention_heads=4,
            num_decoder_attention_heads=4,
            ngram=2,
            max_position_embeddings=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
        )
        return transformers.ProphetNetForConditionalGeneration(config).eval()

    model = sqs.prepare_(prophetnet(0), sqs.SQSConfig(num_components=4))
    g = torch.Generator().manual_seed(1)
    batch = dict(
        input_ids=torch.randint(3, 101, (2, 10), generator=g),
        decoder_input_ids=torch.randint(3, 101, (2, 6), generator=g),
    )
    model.train()
    loss = sqs.Objective(model, num_data=1_000)(model(**batch, labels=batch["decoder_input_ids"]).loss)
    loss.backward()
    positions = model.prophetnet.decoder.position_embeddings
    assert float(positions.posterior.means.grad.abs().sum()) > 0
    model.eval()
    sqs.greedy_(model)
    sqs.save(model, tmp_path / "m.sqs")
    plain = sqs.load(tmp_path / "m.sqs", prophetnet(3))
    with torch.no_grad():
        assert torch.equal(plain(**batch).logits, model(**batch).logits)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_mixtral_with_gradient_checkpointing_gets_the_gradients_without_it(use_reentrant):
    """As GPT-2's test in test_transformers.py: the experts' substituted forward recomputed in the backward (float32:
    the experts' grouped matmul takes no float64)."""
    model = sqs.prepare_(_moe("mixtral"), sqs.SQSConfig(num_components=4))
    ids = torch.randint(3, 101, (2, 12), generator=torch.Generator().manual_seed(1))
    assert_checkpointing_keeps_the_gradients(model, ids, use_reentrant, rtol=1e-5, atol=1e-7)
