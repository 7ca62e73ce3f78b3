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
from torch.nn.utils import get_total_norm

from ._checks import check_finite_parameters, check_int, check_non_negative
from .prepare import posteriors, prepared_config, sqs_layers

__all__ = ["Objective"]

TABLES = ("means", "log_stds", "mixing_logits")
"""A posterior's (W, K) parameters: μ, log σ and the mixing logits."""


class Objective:
    """``objective(nll)`` returns the scalar loss; ``objective.last`` holds its parts as floats."""

    def __init__(self, model: nn.Module, *, num_data: int, kl_weight: float | None = None) -> None:
        config = prepared_config(model)
        num_data = check_int("num_data (training examples)", num_data, 1)
        beta = check_non_negative("kl_weight", config.kl_weight if kl_weight is None else kl_weight)
        self.model = model
        self.num_data = num_data
        self.kl_weight = beta
        self.last: dict[str, float] = {}

    def kl(self) -> torch.Tensor:
        """The summed (unscaled) KL over every posterior of the model; a FloatingPointError naming the first
        layer whose KL is NaN or inf, or whose μ, log σ or mixing logits are (a NaN or inf in a component that no
        weight takes as its k* leaves the loss and the KL finite, not the gradients)."""
        found = posteriors(self.model)
        terms = {name: p.kl() for name, p in found.items()}
        kl = torch.stack(list(terms.values())).sum()
        with torch.no_grad():  # one pass over every layer's (W, K) tables; a single device sync with the KL's
            tables = [getattr(p, attr).detach() for p in found.values() for attr in TABLES]
            largest = get_total_norm(tables, norm_type=math.inf).to(kl.device)
        if not bool(torch.isfinite(kl) & torch.isfinite(largest)):
            for name, p in found.items():
                try:
                    check_finite_parameters(name, p, TABLES, "the objective's gradients would be NaN")
                except ValueError as err:
                    raise FloatingPointError(str(err)) from None
            name, term = next((n, t) for n, t in terms.items() if not torch.isfinite(t))
            raise FloatingPointError(
                f"the KL of layer {name!r} is {float(term.detach())}: its posterior holds NaN or inf (a non-finite "
                "gradient earlier?), or the prior's slab_std is too small for its means"
            )
        return kl

    def __call__(self, nll: torch.Tensor) -> torch.Tensor:
        if not isinstance(nll, torch.Tensor) or nll.dim() != 0:
            raise ValueError("Objective expects the batch-mean task NLL as a scalar tensor")
        if torch.is_grad_enabled():
            self._check_variational()
        kl = self.kl()  # first: a non-finite posterior, named, is the likelier cause of a non-finite NLL
        if not torch.isfinite(nll):
            raise FloatingPointError(f"task NLL is {float(nll.detach())}; refusing to propagate it into the posterior")
        loss = nll + (self.kl_weight / self.num_data) * kl
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"loss is {float(loss.detach())} (NLL {float(nll.detach())}, KL {float(kl.detach())}, "
                f"kl_weight {self.kl_weight}): "
                "β·KL/num_data overflows; lower kl_weight"
            )
        self.last = {"nll": float(nll.detach()), "kl": float(kl.detach()), "loss": float(loss.detach())}
        return loss

    def _check_variational(self) -> None:
        """Training needs the variational forward: a fixed layer (greedy_, sample_) computed the NLL from a
        concrete weight, which the posterior's gradients do not reach, so only the KL would move it."""
        fixed = [name for name, layer in sqs_layers(self.model).items() if layer.mode == "fixed"]
        if fixed:
            raise ValueError(
                f"layers {fixed} have fixed weights (greedy_ or sample_): the task loss does not reach their "
                "posteriors. Call sqs_core.variational_(model) before training, or compute the objective under "
                "torch.no_grad() to evaluate it"
            )
