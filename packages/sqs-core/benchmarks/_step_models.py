"""The models, data and training loops of the step benchmarks (bench_step.py, bench_step_paired.py).

(a) ``resnet20``: a CIFAR ResNet-20 topology (random weights, random labels), K = 4 in the benchmarks;
(b) ``linear4096``: one 4096×4096 Linear with a random regression target (large gradients: the means drift
    fast); ``linear4096-distill``: the same layer with its own fp32 output as the target (the self-distillation
    of compression fine-tuning).
A plain fine-tuning step is AdamW on the model's weights (lr 1e-4); an SQS step is AdamW on
``sqs.param_groups`` with the objective's KL, as a user's loop runs it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import sqs_core as sqs
import torch
import torch.nn.functional as F
from torch import nn

KINDS = ("resnet20", "linear4096", "linear4096-distill")


def parse_case(text: str) -> tuple[str, int, int]:
    """``KIND:BATCH`` as (kind, batch, K): K = 4 for ResNet-20, 64 for the 4096² layer; a ValueError otherwise."""
    kind, _, batch = text.partition(":")
    if kind not in KINDS or not batch.isdigit() or int(batch) < 1:
        raise ValueError(f"expected KIND:BATCH with KIND one of {KINDS} and BATCH >= 1, got {text!r}")
    return kind, int(batch), 4 if kind == "resnet20" else 64


def parse_cases_or_exit(parser: argparse.ArgumentParser, texts: list[str]) -> list[tuple[str, int, int]]:
    """:func:`parse_case` of each ``--only`` value; a bad one ends the script through ``parser.error`` (exit 2)."""
    try:
        return [parse_case(text) for text in texts]
    except ValueError as error:
        parser.error(f"--only: {error}")


class BasicBlock(nn.Module):
    """A CIFAR ResNet block with an option-A (zero-padded, strided) shortcut; at module level so that a
    prepared model pickles (bench_step_late.py saves one)."""

    def __init__(self, i: int, o: int, stride: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(i, o, 3, stride, 1, bias=False), nn.BatchNorm2d(o)
        self.c2, self.b2 = nn.Conv2d(o, o, 3, 1, 1, bias=False), nn.BatchNorm2d(o)
        self.pad, self.stride = (o - i) // 2, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        shortcut = x if self.pad == 0 and self.stride == 1 else F.pad(x[:, :, ::2, ::2], (0,) * 4 + (self.pad,) * 2)
        return F.relu(y + shortcut)


def resnet20() -> nn.Module:
    """He et al.'s CIFAR ResNet-20 (option-A shortcuts, 16/32/64 channels), random weights."""
    layers, i = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()], 16
    for o, stride in ((16, 1), (32, 2), (64, 2)):
        for j in range(3):
            layers.append(BasicBlock(i, o, stride if j == 0 else 1))
            i = o
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def build(kind: str, batch: int, device: torch.device, seed: int = 0):
    """(model, input batch, loss of the model's output) for ``kind``; the same values for the same seed."""
    torch.manual_seed(seed)
    if kind == "resnet20":
        model = resnet20().to(device)
        x = torch.randn(batch, 3, 32, 32).to(device)
        y = torch.randint(0, 10, (batch,)).to(device)
        return model, x, lambda out: F.cross_entropy(out, y)
    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {KINDS}")
    model = nn.Sequential(nn.Linear(4096, 4096)).to(device)
    x = torch.randn(batch, 4096).to(device)
    with torch.no_grad():
        target = model(x) if kind.endswith("distill") else torch.randn(batch, 4096).to(device)
    return model, x, lambda out: F.mse_loss(out, target)


def training(model: nn.Module, loss_fn: Callable, mode: str, k: int, *, prepared: bool = False):
    """(optimizer, loss of an output) for a ``plain`` step or an SQS one (``sqs``, or ``sqs-compiled``:
    ``compile_kernels=True``); SQS modes prepare ``model`` in place first, unless ``prepared`` (an SQS model
    loaded from a checkpoint: only its objective and optimizer are made)."""
    if mode == "plain":
        return torch.optim.AdamW(model.parameters(), lr=1e-4), loss_fn
    if not prepared:
        config = sqs.SQSConfig(num_components=k, windows="outlier", compile_kernels=mode == "sqs-compiled")
        sqs.prepare_(model, config)
    objective = sqs.Objective(model, num_data=50000)
    return torch.optim.AdamW(sqs.param_groups(model, other_lr=1e-3)), lambda out: objective(loss_fn(out))


def certified_fraction(model: nn.Module) -> float:
    """The share of the model's weights the one-hot certificate covers (sqs_core.onehot)."""
    sizes_and_shares = [(p.weight.numel(), p.certified_fraction()) for p in sqs.posteriors(model).values()]
    return sum(n * share for n, share in sizes_and_shares) / sum(n for n, _ in sizes_and_shares)
