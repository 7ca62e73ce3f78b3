"""The SQS training objective Ω_apx (eq. approx_elbo), scaled per training example.

    loss = NLL + β · [Σ_i KL(Bern(λ̃_i)‖Bern(λ)) + Σ_i λ̃_i KL(N(μ_k*,σ_k*²)‖N(0,σ_0²))] / num_data

NLL is the task loss averaged over the batch (so the sum over the data set is num_data · NLL), the KL is
summed over all weights of all compressed layers and divided by ``num_data`` once. β = ``kl_weight``
(SQSConfig) tempers the KL; β = 1 is the paper's objective taken literally (see docs/method.md).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .prepare import posteriors, prepared_config

__all__ = ["Objective"]


class Objective:
    """``objective(nll)`` returns the scalar loss; ``objective.last`` holds its parts as floats."""

    def __init__(self, model: nn.Module, *, num_data: int, kl_weight: float | None = None) -> None:
        config = prepared_config(model)
        if isinstance(num_data, bool) or not isinstance(num_data, int) or num_data <= 0:
            raise ValueError(f"num_data must be a positive int (training examples), got {num_data!r}")
        beta = config.kl_weight if kl_weight is None else kl_weight
        if not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta < 0:
            raise ValueError(f"kl_weight must be a finite number >= 0, got {beta!r}")
        self.model = model
        self.num_data = num_data
        self.kl_weight = float(beta)
        self.last: dict[str, float] = {}

    def kl(self) -> torch.Tensor:
        """The summed (unscaled) KL over every posterior of the model."""
        terms = [p.kl() for p in posteriors(self.model).values()]
        return torch.stack(terms).sum()

    def __call__(self, nll: torch.Tensor) -> torch.Tensor:
        if not isinstance(nll, torch.Tensor) or nll.dim() != 0:
            raise ValueError("Objective expects the batch-mean task NLL as a scalar tensor")
        if not torch.isfinite(nll):
            raise FloatingPointError(f"task NLL is {float(nll)}; refusing to propagate it into the posterior")
        kl = self.kl()
        loss = nll + (self.kl_weight / self.num_data) * kl
        self.last = {"nll": float(nll.detach()), "kl": float(kl.detach()), "loss": float(loss.detach())}
        return loss
