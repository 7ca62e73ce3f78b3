"""A prepared Hugging Face model in transformers' own checkpointing: ``save_pretrained`` and ``Trainer``.

A tied head shares its embedding's posterior, so the prepared model's state holds that posterior's tensors under
two names; safetensors refuses aliased tensors unless the model declares them (``_tied_weights_keys``), which
``prepare_`` does for every aliased entry (sqs_core._ties). These tests run transformers' real saving code on six
architectures, and ``Trainer`` through a checkpoint and a resume with examples/hf_trainer.py, the recipe the README
points to (SQS's objective in ``compute_loss``, the pruning schedule in a callback).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest
import sqs_core as sqs
import torch

transformers = pytest.importorskip("transformers", reason="the integration environment installs transformers")
from safetensors.torch import load_file  # noqa: E402
from short_training import assert_tying_again_changes_nothing  # noqa: E402
from short_training import train_with_schedule as _train  # noqa: E402

STEPS = 6


def _llama():
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _gemma():  # its embedding scales the lookup by √d (a subclass with its own forward); the head is tied to it
    config = transformers.GemmaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    return transformers.GemmaForCausalLM(config)


def _bart():  # scaled embeddings, tied three ways: shared, encoder's, decoder's (and the head)
    config = transformers.BartConfig(
        vocab_size=97, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.BartForConditionalGeneration(config)


def _bert_mlm():  # the decoder's weight tied to the word embedding, its bias to the prediction head's `bias`
    config = transformers.BertConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64,
    )  # fmt: skip
    return transformers.BertForMaskedLM(config)


def _t5():  # shared, encoder and decoder token embeddings tied, the head too
    config = transformers.T5Config(
        vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0,
        tie_word_embeddings=True,
    )  # fmt: skip
    return transformers.T5ForConditionalGeneration(config)


ARCHITECTURES = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=101, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    ),
    "llama": _llama,
    "gemma": _gemma,
    "bart": _bart,
    "bert": _bert_mlm,
    "t5": _t5,
}


def _prepared(make, seed: int):
    torch.manual_seed(seed)
    model = make().eval()
    return sqs.prepare_(model, sqs.SQSConfig(num_components=4))


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_save_pretrained_of_a_prepared_tied_model_loads_back_whole(tmp_path, name):
    """save_pretrained failed for each (GPT-2, Llama, Gemma, BART, T5: "contained shared tensors"; BERT: its tied
    decoder bias; Gemma and BART were refused by prepare_ before, for their scaled embeddings)."""
    make = ARCHITECTURES[name]
    model = _prepared(make, 0)
    batch = {"input_ids": torch.randint(3, 97, (2, 10), generator=torch.Generator().manual_seed(1))}
    batch["labels"] = batch["input_ids"].clone()
    _train(model, 2, lambda m: m(**batch).loss, num_data=1_000)
    model.save_pretrained(tmp_path)

    fresh = _prepared(make, 1)  # other weights: everything must come from the file
    result = fresh.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=False)
    assert result.missing_keys and not result.unexpected_keys
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    with torch.no_grad():
        assert torch.equal(fresh(**batch).logits, model(**batch).logits)
    sqs.greedy_(model, nonzero=0.5)
    sqs.save(model, tmp_path / "m.sqs", nonzero=0.5)
    plain = sqs.load(tmp_path / "m.sqs", make().eval())
    with torch.no_grad():
        assert torch.equal(plain(**batch).logits, model(**batch).logits)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_tie_weights_after_prepare_keeps_the_shared_posteriors(tmp_path, name):
    """transformers' ``tie_weights()`` (a user's, ``init_weights``', a library's after loading) failed after prepare_
    on every tied model ("``transformer.wte.weight`` is neither a parameter, buffer, nor extra state"): prepare_ now
    retires the declarations of the ties its shared posteriors hold, so tying again changes nothing."""
    make = ARCHITECTURES[name]
    model = _prepared(make, 0)
    batch = {"input_ids": torch.randint(3, 97, (2, 10), generator=torch.Generator().manual_seed(1))}
    batch["labels"] = batch["input_ids"].clone()
    with torch.no_grad():
        logits = model(**batch).logits
    assert_tying_again_changes_nothing(model)
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, logits)
    model.save_pretrained(tmp_path)
    fresh = _prepared(make, 1)
    fresh.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=False)
    with torch.no_grad():
        assert torch.equal(fresh(**batch).logits, logits)


def test_tie_weights_after_prepare_of_a_model_holding_a_tied_submodel():
    """EncoderDecoderModel declares no tie of its own but gathers its decoder's (BERT's head) in
    ``all_tied_weights_keys``, which ``init_weights``' ``tie_weights(recompute_mapping=False)`` re-ties from."""
    bert = {"vocab_size": 97, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(
        transformers.BertConfig(**bert, intermediate_size=37),
        transformers.BertConfig(**bert, intermediate_size=37, is_decoder=True, add_cross_attention=True),
    )
    torch.manual_seed(0)
    model = sqs.prepare_(transformers.EncoderDecoderModel(config=config).eval(), sqs.SQSConfig(num_components=4))
    assert_tying_again_changes_nothing(model)


def test_a_tie_left_dense_keeps_its_declaration():
    """Only ties that a posterior holds are retired: with both tied layers excluded, ``tie_weights()`` still ties
    GPT-2's head to its embedding as transformers declares it."""
    torch.manual_seed(0)
    model = ARCHITECTURES["gpt2"]().eval()
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, exclude=(r"lm_head", r"transformer\.wte")))
    assert "_tied_weights_keys" not in model.__dict__
    assert model.all_tied_weights_keys == {"lm_head.weight": "transformer.wte.weight"}
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untie by hand
    model.tie_weights()
    assert model.lm_head.weight is model.transformer.wte.weight


def test_sharded_save_pretrained_loads_back_whole(tmp_path):
    """Shards of a few kilobytes (posteriors split across files): transformers' own sharded loader restores all."""
    from transformers.trainer_utils import load_sharded_checkpoint

    model = _prepared(_llama, 0)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 5
    fresh = _prepared(_llama, 1)
    load_sharded_checkpoint(fresh, tmp_path, strict=False)
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def _example():
    """examples/hf_trainer.py, the Trainer recipe the README points to, as a module."""
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (noxfile installs it)")
    path = Path(__file__).resolve().parents[2] / "examples" / "hf_trainer.py"
    spec = importlib.util.spec_from_file_location("hf_trainer_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_trainer_example_checkpoints_resumes_and_saves(tmp_path, monkeypatch, capsys):
    """A prepared tied GPT-2 through Trainer: the checkpoint (safetensors) holds everything, the resumed run ends
    where the uninterrupted one ends, the pruning schedule reaches its target and the compressed file is written."""
    monkeypatch.setattr(sys, "argv", ["hf_trainer.py", "--out", str(tmp_path), "--steps", "6"])
    _example().main()
    assert "where the uninterrupted one ends: True" in capsys.readouterr().out
    assert (tmp_path / "checkpoint-3" / "model.safetensors").is_file()
    assert sqs.compression_report(tmp_path / "model.sqs").nonzero_rate == pytest.approx(0.5, abs=0.01)


def test_trainer_gradient_accumulation_matches_the_whole_batch(tmp_path):
    """Under SGD (its step follows the loss's scale, which Adam's does not; no clipping, which would hide it too)."""
    example = _example()
    runs = {}
    for name, arguments in {
        "whole": {},
        "split": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2},
    }.items():
        model = sqs.prepare_(example.small_gpt2(), sqs.SQSConfig(num_components=4))
        trainer = example.trainer_for(model, tmp_path / name, STEPS, max_grad_norm=0.0, **arguments)
        trainer.optimizer = torch.optim.SGD(sqs.param_groups(model, quant_lr=1e-4, gate_lr=1e-4, other_lr=1e-4))
        start = {key: value.clone() for key, value in model.state_dict().items()}
        trainer.train()
        runs[name] = model
    moved = 0
    for key, value in runs["whole"].state_dict().items():  # the same samples a step, summed in two halves
        got = runs["split"].state_dict()[key]
        if not value.is_floating_point():  # masks
            assert torch.equal(got, value), key
            continue
        step = (value - start[key]).abs().max()
        # without loss_is_scaled_for_ga = False each step's loss counts twice: off by about the whole step
        assert (got - value).abs().max() <= 1e-3 * step + 1e-12, key
        moved += int(step > 0)
    assert moved > 20
