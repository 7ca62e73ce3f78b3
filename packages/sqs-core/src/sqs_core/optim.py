"""Optimizer parameter groups with the appendix's separate learning rates as defaults (AdamW, no weight
decay on the posterior: decay would pull s̃ towards λ̃ = ½ and μ towards 0 regardless of the objective).
For pretrained CNNs pass ``gate_lr=1e-4``: docs/method.md shows why the appendix's 0.012 fails there."""

from __future__ import annotations

from typing import Any

from torch import nn

from ._checks import check_positive, check_real
from .prepare import posteriors, prepared_config

__all__ = ["param_groups"]


def param_groups(
    model: nn.Module,
    *,
    quant_lr: float = 5e-5,
    gate_lr: float = 0.012,
    weight_lr: float | None = None,
    other_lr: float | None = None,
    other_weight_decay: float = 0.0,
) -> list[dict[str, Any]]:
    """Groups for ``torch.optim.AdamW``: quantization (μ, log σ, π logits) at ``quant_lr``, gates s̃ at
    ``gate_lr`` (the appendix's 0.012 moves each gate logit s̃/τ' by ≈ 1 per Adam step, a random walk
    that erases the magnitude-ranked start; 1e-4 measured best on ResNet-20 and the digits), θ at ``weight_lr`` when
    ``train_weight`` is set, and every other trainable parameter of the model (biases, norms, uncompressed
    layers) at ``other_lr`` (left out when None)."""
    prepared_config(model)
    quant_lr = check_positive("quant_lr", quant_lr)
    gate_lr = check_positive("gate_lr", gate_lr)
    weight_lr = None if weight_lr is None else check_positive("weight_lr", weight_lr)
    other_lr = None if other_lr is None else check_positive("other_lr", other_lr)
    other_weight_decay = check_real("other_weight_decay", other_weight_decay)
    if other_weight_decay < 0:
        raise ValueError(f"other_weight_decay must be a finite number >= 0, got {other_weight_decay!r}")
    quant, gates, weights = [], [], []
    for p in posteriors(model).values():
        quant += [p.means, p.log_stds, p.mixing_logits]
        gates.append(p.gate_logits)
        if isinstance(p.weight, nn.Parameter):
            weights.append(p.weight)
    groups: list[dict[str, Any]] = [
        {"params": quant, "lr": quant_lr, "weight_decay": 0.0, "name": "quantization"},
        {"params": gates, "lr": gate_lr, "weight_decay": 0.0, "name": "gates"},
    ]
    if weights:
        if weight_lr is None:
            raise ValueError("the config trains θ (train_weight=True): pass weight_lr")
        groups.append({"params": weights, "lr": weight_lr, "weight_decay": 0.0, "name": "weights"})
    if other_lr is not None:
        taken = {id(p) for g in groups for p in g["params"]}
        rest = [p for p in model.parameters() if p.requires_grad and id(p) not in taken]
        if rest:
            groups.append({"params": rest, "lr": other_lr, "weight_decay": other_weight_decay, "name": "other"})
    return groups
