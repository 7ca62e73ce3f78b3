"""Baselines re-run beside SQS on the same pretrained model, data and budget.

Each ``method(model, data, budget, **knobs)`` leaves ``model`` untouched and returns ``(compressed, record)``:
``compressed`` is a plain network holding the quantized weights (zeros where pruned), ``record`` a JSON-ready
dict with ``bits``, the measured ``nonzero`` rate over the compressed layers, ``compression_rate_paper``
(:data:`sqs_bench.compression.PAPER_RATE_FORMULA`), ``compression_rate_file`` (None: no artifact) and
per-layer statistics.

- :func:`magnitude_kmeans`: global magnitude pruning of all conv + linear weights to the target non-zero rate,
  a per-layer K-level 1-D k-means codebook on the kept weights, then only the codebook levels are fine-tuned
  (mask and assignments fixed), then batch-norm statistics are re-estimated.
- :func:`uniform`: the same global magnitude pruning, then per-layer symmetric round-to-nearest onto
  ``2**bits`` levels over [−max|w|, max|w|] of the kept weights, then batch-norm re-estimation; no training.
- :func:`dgms`: see :mod:`sqs_bench.dgms`.
"""

from __future__ import annotations

import copy
import logging

import torch
from torch import nn
from torch.nn.utils import parametrize

from sqs_bench import dgms as _dgms
from sqs_bench.compression import (
    PAPER_RATE_FORMULA,
    compressible_layers,
    global_magnitude_masks,
    kmeans_1d,
    layer_stats,
    paper_compression_rate,
    uniform_quantize,
    weight_parametrizations,
)
from sqs_bench.data import CifarSplits, normalize
from sqs_bench.train import Budget, fit

__all__ = ["bn_recalibrate", "dgms", "magnitude_kmeans", "uniform"]

logger = logging.getLogger(__name__)


@torch.no_grad()
def bn_recalibrate(model: nn.Module, images: torch.Tensor, batch_size: int = 128) -> nn.Module:
    """Re-estimate every batch-norm's running mean/var as the plain average over ``images`` (uint8).

    Running stats are reset, momentum set to None (cumulative average), and the images forwarded in train
    mode without gradients; momenta and the model's mode are restored afterwards.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms or images.shape[0] == 0:
        return model
    momenta = [m.momentum for m in norms]
    was_training = model.training
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    for start in range(0, images.shape[0], batch_size):
        model(normalize(images[start : start + batch_size]))
    for m, momentum in zip(norms, momenta, strict=True):
        m.momentum = momentum
    model.train(was_training)
    return model


class _Codebook(nn.Module):
    """Weight parametrization ``W = mask · levels[assign]`` with learnable ``levels`` (K,)."""

    assign: torch.Tensor
    mask: torch.Tensor

    def __init__(self, levels: torch.Tensor, assign: torch.Tensor, mask: torch.Tensor) -> None:
        super().__init__()
        self.levels = nn.Parameter(levels.clone())
        self.register_buffer("assign", assign)
        self.register_buffer("mask", mask)

    def forward(self, _original: torch.Tensor) -> torch.Tensor:
        return torch.where(self.mask, self.levels[self.assign], torch.zeros_like(self.levels[self.assign]))


def _record(method: str, bits: float, weights: dict[str, torch.Tensor], codebook: int, **extra) -> dict:
    """The JSON-ready record shared by all baselines."""
    stats = layer_stats(weights, codebook)
    total, nnz = sum(s.numel for s in stats), sum(s.nnz for s in stats)
    return {
        "method": method,
        "bits": bits,
        "num_components": codebook,
        "nonzero": nnz / total,
        "compressed_weights": total,
        "compression_rate_paper": paper_compression_rate(stats),
        "compression_rate_file": None,
        "rate_formula": PAPER_RATE_FORMULA,
        "layers": [s.to_dict() for s in stats],
        **extra,
    }


def _bn_images(data: CifarSplits, budget: Budget) -> torch.Tensor:
    return data.train_x[: budget.bn_images]


def magnitude_kmeans(
    model: nn.Module,
    data: CifarSplits,
    budget: Budget,
    *,
    bits: int,
    nonzero: float,
    lr: float = 5e-5,
    kmeans_iters: int = 50,
) -> tuple[nn.Module, dict]:
    """Global magnitude pruning + per-layer k-means codebook (K = 2**bits); only the codebook is fine-tuned
    (AdamW, ``lr``, the shared budget), then batch-norm statistics are re-estimated."""
    teacher, model = model, copy.deepcopy(model)
    layers = compressible_layers(model)
    masks = global_magnitude_masks({n: m.weight for n, m in layers.items()}, nonzero)
    k = 2**bits
    for name, module in layers.items():
        kept = module.weight.detach()[masks[name]]
        levels, kept_assign = kmeans_1d(kept, min(k, kept.numel()), iters=kmeans_iters)
        assign = torch.zeros(module.weight.shape, dtype=torch.int64)
        assign[masks[name]] = kept_assign
        module.weight.requires_grad_(False)
        parametrize.register_parametrization(module, "weight", _Codebook(levels, assign, masks[name]))
    for p in model.parameters():
        p.requires_grad_(False)
    codebooks = [weight_parametrizations(m)[0].levels for m in layers.values()]
    for p in codebooks:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(codebooks, lr=lr, weight_decay=0.0)
    train = fit(model, optimizer, data.train_x, data.train_y, budget, teacher=teacher, desc="magnitude_kmeans")
    for module in layers.values():
        parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
    for p in model.parameters():
        p.requires_grad_(True)
    bn_recalibrate(model, _bn_images(data, budget))
    weights = {n: m.weight.detach() for n, m in layers.items()}
    return model.eval(), _record("magnitude_kmeans", bits, weights, k, target_nonzero=nonzero, train=train)


def uniform(
    model: nn.Module, data: CifarSplits, budget: Budget, *, bits: int, nonzero: float
) -> tuple[nn.Module, dict]:
    """Global magnitude pruning + per-layer symmetric uniform round-to-nearest (2**bits levels); batch-norm
    statistics re-estimated; no training."""
    model = copy.deepcopy(model)
    layers = compressible_layers(model)
    masks = global_magnitude_masks({n: m.weight for n, m in layers.items()}, nonzero)
    with torch.no_grad():
        for name, module in layers.items():
            module.weight.copy_(uniform_quantize(module.weight, masks[name], bits))
    bn_recalibrate(model, _bn_images(data, budget))
    weights = {n: m.weight.detach() for n, m in layers.items()}
    return model.eval(), _record("uniform", bits, weights, 2**bits, target_nonzero=nonzero)


def dgms(
    model: nn.Module,
    data: CifarSplits,
    budget: Budget,
    *,
    bits: int,
    temperature: float = 0.1,
    quant_lr: float = 5e-5,
    weight_lr: float = 5e-5,
    weight_decay: float = 0.01,
    recalibrate_bn: bool = False,
) -> tuple[nn.Module, dict]:
    """DGMS with K = 2**bits components (one pinned at 0), weights and mixture trained with AdamW, hard at
    inference. ``recalibrate_bn`` re-estimates batch-norm statistics for the hard weights (not in DGMS)."""
    teacher, model = model, copy.deepcopy(model)
    layers = compressible_layers(model)
    k = 2**bits
    _dgms.attach_gmm(layers, k, temperature)
    mixture = _dgms.gmm_parameters(layers)
    mixture_ids = {id(p) for p in mixture}
    others = [p for p in model.parameters() if id(p) not in mixture_ids]
    optimizer = torch.optim.AdamW(
        [
            {"params": mixture, "lr": quant_lr, "weight_decay": 0.0},
            {"params": others, "lr": weight_lr, "weight_decay": weight_decay},
        ]
    )
    train = fit(model, optimizer, data.train_x, data.train_y, budget, teacher=teacher, desc="dgms")
    _dgms.harden(layers)
    if recalibrate_bn:
        bn_recalibrate(model, _bn_images(data, budget))
    weights = {n: m.weight.detach() for n, m in layers.items()}
    extra = {"temperature": temperature, "recalibrate_bn": recalibrate_bn, "train": train}
    record = _record("dgms", bits, weights, k, target_nonzero=None, **extra)
    return model.eval(), record
