"""A prepared Hugging Face model in transformers' own checkpointing: ``save_pretrained`` and ``Trainer``.

A tied head shares its embedding's posterior, so the prepared model's state holds that posterior's tensors under
two names; safetensors refuses aliased tensors unless the model declares them (``_tied_weights_keys``), which
``prepare_`` does for each later layer of a tie (sqs_core._ties). These tests run transformers' real saving code
and ``Trainer`` (with SQS's objective in ``compute_loss`` and the pruning schedule in a callback, the recipe of
the README) through a checkpoint and a resume.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest
import sqs_core as sqs
import torch

transformers = pytest.importorskip("transformers", reason="the integration environment installs transformers")
from safetensors.torch import load_file  # noqa: E402
from test_transformers import _gpt2, _train  # noqa: E402

STEPS = 6


def _prepared_gpt2(seed: int):
    model, config = _gpt2(seed)
    for module in model.modules():  # Trainer trains in train mode: no dropout, so that runs can be compared
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return sqs.prepare_(model, sqs.SQSConfig(num_components=4)), config


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
    "gpt2": lambda: _gpt2()[0],
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


class _SQSTrainer(transformers.Trainer):
    """Trainer with Ω_apx as the loss (compute_loss) and sqs.param_groups' learning rates (create_optimizer).

    ``objective(nll)`` is a micro-batch's mean NLL + β·KL/n: ``loss_is_scaled_for_ga = False`` has the Trainer
    divide it by the gradient-accumulation steps (the KL then counted once a step). Left at transformers' default,
    a model that takes loss kwargs (GPT-2 does) has its loss taken as scaled already: the loss of every step
    would count ``gradient_accumulation_steps`` times."""

    loss_is_scaled_for_ga = False

    def __init__(self, *args, num_data: int, sgd: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.sqs_objective = sqs.Objective(self.model, num_data=num_data)
        self.sgd = sgd

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        loss = self.sqs_objective(outputs.loss)
        return (loss, outputs) if return_outputs else loss

    def create_optimizer(self, model=None):
        if self.optimizer is None and self.sgd:  # plain SGD: its step follows the loss's scale, which Adam's does not
            self.optimizer = torch.optim.SGD(sqs.param_groups(self.model, quant_lr=1e-4, gate_lr=1e-4, other_lr=1e-4))
        elif self.optimizer is None:
            self.optimizer = torch.optim.AdamW(sqs.param_groups(self.model, gate_lr=1e-4))
        return self.optimizer


class _Pruning(transformers.TrainerCallback):
    def __init__(self, schedule: sqs.PruningSchedule):
        self.schedule = schedule

    def on_step_begin(self, args, state, control, **kwargs):
        self.schedule.step(state.global_step)


def _trainer(out, seed: int, batch: int = 4, accumulate: int = 1, sgd: bool = False):
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (noxfile installs it)")
    model, config = _prepared_gpt2(seed)
    g = torch.Generator().manual_seed(2)
    data = [{"input_ids": t, "labels": t} for t in torch.randint(0, config.vocab_size, (16, 12), generator=g)]
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=batch, save_steps=STEPS // 2,
        gradient_accumulation_steps=accumulate, max_grad_norm=0.0 if sgd else 1.0,
        report_to=[], use_cpu=True, seed=3, disable_tqdm=True,
    )  # fmt: skip
    pruning = _Pruning(sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=STEPS))
    return _SQSTrainer(
        model=model, args=args, train_dataset=data, callbacks=[pruning], num_data=len(data), sgd=sgd
    ), model


def test_trainer_checkpoints_and_resumes_a_prepared_tied_gpt2(tmp_path):
    trainer, model = _trainer(tmp_path, seed=0)
    trainer.train()
    checkpoint = tmp_path / f"checkpoint-{STEPS // 2}"
    assert (checkpoint / "model.safetensors").is_file()

    resumed_trainer, resumed = _trainer(tmp_path, seed=1)  # other initial weights: the checkpoint must hold all
    resumed_trainer.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.lm_head.posterior is resumed.transformer.wte.posterior
    for key, value in model.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key
    masks = [post.mask for post in sqs.posteriors(model).values()]
    kept = sum(int(mask.sum()) for mask in masks) / sum(mask.numel() for mask in masks)
    assert kept == pytest.approx(0.5, abs=0.01)  # the schedule ran to its target


def test_trainer_gradient_accumulation_matches_the_whole_batch(tmp_path):
    whole_trainer, whole = _trainer(tmp_path / "whole", seed=0, sgd=True)
    start = {key: value.clone() for key, value in whole.state_dict().items()}
    whole_trainer.train()
    split_trainer, split = _trainer(tmp_path / "split", seed=0, batch=2, accumulate=2, sgd=True)
    split_trainer.train()
    moved = 0
    for key, value in whole.state_dict().items():  # the same samples a step, summed in two halves: rounding only
        got = split.state_dict()[key]
        if not value.is_floating_point():  # masks
            assert torch.equal(got, value), key
            continue
        step = (value - start[key]).abs().max()
        # without loss_is_scaled_for_ga = False each step's loss counts twice: off by about the whole step
        assert (got - value).abs().max() <= 1e-3 * step + 1e-12, key
        moved += int(step > 0)
    assert moved > 20
