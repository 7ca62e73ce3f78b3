"""The shared training and evaluation loop used by every method (same budget, same data order).

A :class:`Budget` fixes what all methods get: epochs, batch size, an optional cap on batches per epoch (the
smoke tier), the seed of the shuffling/augmentation generator, and how many training images re-estimate the
batch-norm statistics. :func:`fit` runs AdamW-style steps over augmented, shuffled training batches with a
tqdm bar (silent when stderr is not a terminal).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from sqs_bench.data import iterate_batches, normalize

__all__ = ["Budget", "fit", "predict", "progress"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Budget:
    """The training budget shared by all methods of one experiment."""

    epochs: int = 10
    batch_size: int = 128
    max_batches: int | None = None  # per epoch; the smoke tier caps it
    seed: int = 0
    bn_images: int = 512  # training images used to re-estimate batch-norm statistics
    distill_weight: float = 0.0  # α of knowledge distillation from the fp32 model (0: plain cross-entropy)
    distill_temperature: float = 4.0  # T of the softened teacher/student distributions

    def __post_init__(self) -> None:
        if self.epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_batches is not None and self.max_batches < 1:
            raise ValueError(f"max_batches must be >= 1 or None, got {self.max_batches}")
        if self.bn_images < 0:
            raise ValueError(f"bn_images must be >= 0, got {self.bn_images}")
        if not 0.0 <= self.distill_weight <= 1.0:
            raise ValueError(f"distill_weight must lie in [0, 1], got {self.distill_weight!r}")
        if not self.distill_temperature > 0:
            raise ValueError(f"distill_temperature must be > 0, got {self.distill_temperature!r}")

    def steps_per_epoch(self, num_train: int) -> int:
        """Optimizer steps in one epoch over ``num_train`` images (last partial batch dropped)."""
        steps = max(num_train // self.batch_size, 1)
        return min(steps, self.max_batches) if self.max_batches is not None else steps

    def total_steps(self, num_train: int) -> int:
        return self.epochs * self.steps_per_epoch(num_train)

    def to_dict(self) -> dict:
        return asdict(self)


def progress(iterable, **kwargs):
    """A tqdm bar on stderr, disabled when stderr is not a terminal."""
    return tqdm(iterable, disable=not sys.stderr.isatty(), leave=False, **kwargs)


Regularizer = Callable[[torch.Tensor], torch.Tensor]
StepHook = Callable[[int], None]


def data_loss(
    logits: torch.Tensor, labels: torch.Tensor, teacher_logits: torch.Tensor | None, budget: Budget
) -> torch.Tensor:
    """Cross-entropy, or (1 − α)·CE + α·T²·KL(softmax(t/T) ‖ softmax(s/T)) with a teacher (Hinton et al., 2015)."""
    ce = F.cross_entropy(logits, labels)
    if teacher_logits is None or budget.distill_weight == 0:
        return ce
    temp, alpha = budget.distill_temperature, budget.distill_weight
    student, target = F.log_softmax(logits / temp, 1), F.log_softmax(teacher_logits / temp, 1)
    soft = F.kl_div(student, target, log_target=True, reduction="batchmean")
    return (1 - alpha) * ce + alpha * temp**2 * soft


def fit(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    images: torch.Tensor,
    labels: torch.Tensor,
    budget: Budget,
    *,
    regularizer: Regularizer | None = None,
    before_step: StepHook | None = None,
    teacher: nn.Module | None = None,
    desc: str = "train",
) -> dict:
    """Train for ``budget.epochs`` epochs; returns steps, seconds and seconds per epoch.

    The loss is ``regularizer(data_loss)`` (default: the data loss itself, see :func:`data_loss`; with
    ``budget.distill_weight > 0`` the fp32 ``teacher`` is required and distilled from); ``before_step(step)``
    runs before each step (schedules). The data order and augmentation come from a generator seeded with
    ``budget.seed``.
    """
    if budget.distill_weight > 0 and teacher is None:
        raise ValueError("budget.distill_weight > 0 needs the fp32 teacher model")
    teacher = teacher if budget.distill_weight > 0 else None
    if teacher is not None:
        teacher.eval()
    generator = torch.Generator().manual_seed(budget.seed)
    per_epoch = budget.steps_per_epoch(images.shape[0])
    bs = min(budget.batch_size, images.shape[0])
    model.train()
    step, start, last_loss = 0, time.perf_counter(), float("nan")
    bar = progress(range(budget.epochs * per_epoch), desc=desc)
    for _ in range(budget.epochs):
        batches = iterate_batches(images, labels, bs, generator=generator, shuffle=True, augmentation=True)
        for _, (x, y) in zip(range(per_epoch), batches, strict=False):
            if before_step is not None:
                before_step(step)
            with torch.no_grad():
                teacher_logits = teacher(x) if teacher is not None else None
            loss = data_loss(model(x), y, teacher_logits, budget)
            loss = regularizer(loss) if regularizer is not None else loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            last_loss = loss.item()
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{last_loss:.3f}", refresh=False)
    bar.close()
    seconds = time.perf_counter() - start
    logger.info("%s: %d steps in %.1fs, last loss %.4f", desc, step, seconds, last_loss)
    per_epoch_s = seconds / budget.epochs if budget.epochs else 0.0
    return {"steps": step, "seconds": seconds, "seconds_per_epoch": per_epoch_s, "last_loss": last_loss}


@torch.no_grad()
def predict(model: nn.Module, images: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Argmax class of each uint8 image, computed in eval mode (model's mode restored after)."""
    was_training = model.training
    model.eval()
    preds = [model(normalize(images[i : i + batch_size])).argmax(1) for i in range(0, len(images), batch_size)]
    model.train(was_training)
    return torch.cat(preds) if preds else torch.empty(0, dtype=torch.int64)
