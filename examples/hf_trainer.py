"""SQS inside Hugging Face's ``Trainer``: the objective in ``compute_loss``, the learning rates of
``sqs.param_groups`` in ``create_optimizer``, the pruning schedule in a callback.

Copy ``SQSTrainer`` and ``PruningCallback`` into your project (they need transformers and accelerate; sqs-core does
not depend on either). ``main`` is an offline smoke run: a small GPT-2 built from a config, random tokens, a
checkpoint, a resume, then the compressed file. Put your model and dataset in their place; for a pretrained model,
keep this trainer's gate learning rate of 1e-4 (the README example's; the library's default, the appendix's
0.012, random-walks a pretrained network's gates: docs/method.md, "Schedules").
tests/integration/test_hf_checkpoints.py runs this file.

Usage: python examples/hf_trainer.py [--out DIR] [--steps N]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import sqs_core as sqs
import torch
import transformers


class SQSTrainer(transformers.Trainer):
    """``Trainer`` whose loss is Ω_apx (the task loss the model returns, + β·KL / ``num_data``) and whose optimizer
    is AdamW on ``sqs.param_groups`` (its quantization / gate / other learning rates).

    ``objective(nll)`` is a micro-batch's mean NLL + β·KL/n, so ``loss_is_scaled_for_ga = False``: the Trainer
    divides it by the gradient-accumulation steps (the KL counted once a step). At transformers' default a model
    that takes loss kwargs (GPT-2, Llama) has the returned loss taken as scaled already, and under accumulation each
    micro-batch's loss, the KL in it, would count in full."""

    loss_is_scaled_for_ga = False

    def __init__(self, *args, num_data: int, gate_lr: float = 1e-4, quant_lr: float = 5e-5, **kwargs):
        super().__init__(*args, **kwargs)
        self.sqs_objective = sqs.Objective(self.model, num_data=num_data)
        self.sqs_rates = {"gate_lr": gate_lr, "quant_lr": quant_lr, "other_lr": self.args.learning_rate}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        loss = self.sqs_objective(outputs.loss)
        return (loss, outputs) if return_outputs else loss

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(sqs.param_groups(self.model, **self.sqs_rates))
        return self.optimizer


class PruningCallback(transformers.TrainerCallback):
    """Runs the cubic pruning schedule (Algorithm 1) at the start of each optimizer step."""

    def __init__(self, schedule: sqs.PruningSchedule):
        self.schedule = schedule

    def on_step_begin(self, args, state, control, **kwargs):
        self.schedule.step(state.global_step)


def small_gpt2(seed: int = 0) -> transformers.GPT2LMHeadModel:
    """A 2-layer GPT-2 from a config (its head tied to the token embedding), dropout off."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=101, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    return transformers.GPT2LMHeadModel(config)


def trainer_for(model, out: Path, steps: int, **arguments) -> SQSTrainer:
    """An SQSTrainer on random tokens for ``model`` (prepared), with the pruning schedule to 50% non-zero."""
    tokens = torch.randint(0, model.config.vocab_size, (16, 12), generator=torch.Generator().manual_seed(2))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    defaults = {"per_device_train_batch_size": 4, "save_steps": steps // 2, "report_to": [], "use_cpu": True}
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=steps, seed=3, disable_tqdm=True, **(defaults | arguments)
    )
    pruning = PruningCallback(sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=steps))
    return SQSTrainer(model=model, args=args, train_dataset=data, callbacks=[pruning], num_data=len(data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a temporary one)")
    parser.add_argument("--steps", type=int, default=8, help="training steps (even, at least 2)")
    options = parser.parse_args()
    if options.steps < 2 or options.steps % 2:
        parser.error(f"--steps must be an even number of at least 2, got {options.steps}")
    out = options.out or Path(tempfile.mkdtemp(prefix="sqs-trainer-"))
    model = sqs.prepare_(small_gpt2(), sqs.SQSConfig(num_components=4))  # 2 bits
    trainer_for(model, out, options.steps).train()
    resumed = sqs.prepare_(small_gpt2(seed=1), sqs.SQSConfig(num_components=4))
    trainer_for(resumed, out, options.steps).train(resume_from_checkpoint=str(out / f"checkpoint-{options.steps // 2}"))
    same = all(torch.equal(resumed.state_dict()[k], v) for k, v in model.state_dict().items())
    sqs.greedy_(model, nonzero=0.5)
    sqs.save(model, out / "model.sqs", nonzero=0.5)
    print(f"resumed run ends where the uninterrupted one ends: {same}")
    print(sqs.compression_report(out / "model.sqs"))


if __name__ == "__main__":
    main()
