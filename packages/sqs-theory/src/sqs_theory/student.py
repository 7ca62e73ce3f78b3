"""The SQS student: sqs-core's spike-and-GMM posterior q (eq. marginal_vb) fitted to the synthetic data.

Two procedures start from the same full-precision fit θ (the "pretrained weights"):

* ``init="projection"`` (the study; θ canonicalised first, :mod:`projection`). q starts at the projection of
  θ onto H(T, s, K): gates λ̃ = sigmoid(±a)
  on / off the s largest |θ| (global ranking, as the Non-zero rule of Section "Inference Procedure"), per-layer
  levels μ = the exact K-level quantization of the kept weights (:func:`hspace.quantize_exact`; K-means can stop
  at a worse local optimum), and every component standard deviation fixed at σ_n of the proof of Lemma
  ``bound_elbo`` (the q* of that proof uses σ_k = σ_n for every k). It is then trained with the Theorem's
  weighting, β = 1 (``kl_weight``; ELBO per datum = NLL + KL/n) and λ from Theorem ``formal_convergence``,
  and the moment-matched likelihood, a local-reparameterisation estimate of E_q[−log p(D|θ̃)] (the plug-in
  −log p(D|θ^avg) lets λ̃ act as a free per-weight scale that inference then drops: erratum A3).
  Responsibilities are ``standard`` (nearest level for equal σ_k); the paper's form makes φ uniform for a
  weight many σ_k from every level (docs/method.md), which is every weight once σ_k = σ_n.
* ``init="default"`` (an ablation): sqs-core's defaults, as a user would run them — K-means over *all* weights
  of a layer (one level is spent on the weights about to be pruned), within-layer magnitude gates, the cubic
  pruning schedule, the plug-in likelihood, β = 1e-3 and the appendix learning rates.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import sqs_core as sqs
import torch
from sqs_core import keep_top_fraction
from torch import nn

from . import _tensors
from . import _validate as check
from .hspace import quantize_exact
from .rates import log_sigma_n_sq, neg_log_lambda
from .synthetic import LEVELS, _gaussian_nll, layers

__all__ = ["INITS", "LIKELIHOODS", "PRIORS", "StudentSpec", "fit_student", "proof_log_std", "theorem_keep_prob"]

PRIORS = ("spike_slab", "gaussian")
INITS = ("projection", "default")
LIKELIHOODS = ("moment_matched", "plugin")


@check.arguments(n="at_least_one", T="count", L="count", N="count", p="count", delta="positive")
def theorem_keep_prob(n: int, *, T: int, L: int, N: int, p: int, delta: float) -> float:
    """λ of Theorem ``formal_convergence``: −log λ = log T + δ[(L + 1) log N + log(√n p)] (T: weights here)."""
    return math.exp(-neg_log_lambda(n, L, N, p, delta, T=T))


@check.arguments(n="at_least_one", s="positive", N="count", p="count", B="positive")
def proof_log_std(n: int, *, s: int, N: int, p: int, B: float) -> float:
    """log σ_n for L = 1, with the squared bracket the proof's algebra needs (erratum B7); B·N > 1."""
    return 0.5 * log_sigma_n_sq(n, s, 1, N, p, B, squared=True)


def _config(init: str, prior: str, *, keep_prob: float, likelihood: str) -> sqs.SQSConfig:
    if prior == "spike_slab":
        spec: sqs.SpikeSlabPrior | sqs.GaussianPrior = sqs.SpikeSlabPrior(keep_prob=keep_prob, slab_std=1.0)
    else:
        spec = sqs.GaussianPrior(slab_std=1.0)
    if init == "default":
        return sqs.SQSConfig(num_components=len(LEVELS), windows="none", prior=spec, train_weight=True)
    return sqs.SQSConfig(
        num_components=len(LEVELS),
        windows="none",
        prior=spec,
        responsibility="standard",
        likelihood=likelihood,
        kl_weight=1.0,
    )


def _levels(kept: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(μ (k,), mixing (k,)) of the exact k-level quantization of ``kept``; spare components never win."""
    if kept.size == 0:
        return np.linspace(-1.0, 1.0, k), np.full(k, 1.0 / k)
    q = quantize_exact(kept, K=k, B=float(np.abs(kept).max()) + 1.0).theta
    levels, counts = np.unique(q, return_counts=True)
    spare = k - levels.size
    mix = np.concatenate([counts / counts.sum(), np.full(spare, 1e-6)])
    means = np.concatenate([levels, np.full(spare, levels[np.argmax(counts)])])
    order = np.argsort(means, kind="stable")
    return means[order], mix[order] / mix.sum()


@torch.no_grad()
def _init_at_projection_(model: nn.Module, *, density: float, gate_logit: float, log_std: float) -> None:
    posts = sqs.posteriors(model)
    # the round(density·T) largest |θ| over all layers (ties: first position), sqs-core's Non-zero rule
    support = keep_top_fraction({name: p.weight.abs() for name, p in posts.items()}, density)
    for name, p in posts.items():
        keep = support[name]
        means, mix = _levels(p.weight[keep].double().numpy(), p.num_components)
        p.means.copy_(torch.tensor(means, dtype=p.means.dtype).expand_as(p.means))
        p.mixing_logits.copy_(torch.tensor(np.log(mix), dtype=p.means.dtype).expand_as(p.mixing_logits))
        p.log_stds.fill_(log_std)
        sign = keep.to(p.gate_logits.dtype) * 2 - 1  # s̃ = ±a·τ' so that λ̃ = sigmoid(±a)
        p.gate_logits.copy_(sign * gate_logit * float(p.gate_temperature))


def _optimizer(model: nn.Module, init: str, quant_lr: float, gate_lr: float) -> torch.optim.Optimizer:
    if init == "default":
        return torch.optim.AdamW(
            sqs.param_groups(model, quant_lr=1e-2, gate_lr=0.012, weight_lr=1e-2), weight_decay=0.0
        )
    groups = sqs.param_groups(model, quant_lr=quant_lr, gate_lr=gate_lr)
    frozen = {id(p.log_stds) for p in sqs.posteriors(model).values()}  # σ_k = σ_n, not learned
    for group in groups:
        group["params"] = [q for q in group["params"] if id(q) not in frozen]
    return torch.optim.AdamW(groups, weight_decay=0.0)


@dataclass(frozen=True, kw_only=True)
class StudentSpec:
    """One SQS variant and its optimisation settings (see the module docstring)."""

    prior: str = "spike_slab"
    init: str = "projection"
    likelihood: str = "moment_matched"
    steps: int = 500
    quant_lr: float = 2e-3
    gate_lr: float = 6e-4
    gate_logit: float = 20.0  # a: initial λ̃ = sigmoid(±a)
    delta: float = 1.5  # δ of the Theorem's λ
    B: float = 1.5  # the bound B of H(T, s, K) used in σ_n

    def __post_init__(self) -> None:
        with check.within("StudentSpec"):
            for name, value, choices in (
                ("prior", self.prior, PRIORS),
                ("init", self.init, INITS),
                ("likelihood", self.likelihood, LIKELIHOODS),
            ):
                if value not in choices:
                    raise ValueError(f"unknown {name} {value!r}; expected one of {choices}")
            if self.init == "default" and self.likelihood != "plugin":
                raise ValueError("init='default' runs sqs-core's defaults, whose likelihood is 'plugin'")
            object.__setattr__(self, "steps", check.count("steps", self.steps, low=1))  # 2.0 -> 2; 2.5 refused
            for name in ("quant_lr", "gate_lr", "gate_logit", "delta", "B"):
                check.real(name, getattr(self, name), low=0.0, strict=True)

    @property
    def key(self) -> str:
        return f"{self.prior}/{self.init}/{self.likelihood}"


def _spec(name: str, value: object) -> None:
    if not isinstance(value, StudentSpec):
        raise ValueError(f"{name} must be a StudentSpec, got {value!r:.80}")


@check.arguments(sigma="positive", density="fraction", spec=_spec)
def fit_student(fp_model: nn.Module, x, y, *, sigma: float, density: float, spec: StudentSpec) -> nn.Module:
    """Compress a copy of ``fp_model`` (a ``p -> width -> 1`` bias-free MLP) with sqs-core as ``spec`` says;
    returns the prepared model in eval mode, in its variational (θ^avg) forward. x (n, p) and y (n, 1) finite,
    of the model's dtype; σ > 0; density in (0, 1], keeping at least one weight where q starts at the projection."""
    with check.within("fit_student"):
        _tensors.data(fp_model, x, y)
    n, T = x.shape[0], sum(m.weight.numel() for m in fp_model.modules() if isinstance(m, nn.Linear))
    if spec.init == "projection" and round(density * T) < 1:
        raise ValueError(f"density must keep at least one of T={T} weights, got {density!r} (in fit_student)")
    width, p = layers(fp_model)[0].out_features, layers(fp_model)[0].in_features
    theorem = theorem_keep_prob(n, T=T, L=1, N=width, p=p, delta=spec.delta)
    keep_prob = density if spec.init == "default" else theorem  # the defaults put λ at the Non-zero rate
    config = _config(spec.init, spec.prior, keep_prob=keep_prob, likelihood=spec.likelihood)
    model = sqs.prepare_(copy.deepcopy(fp_model).requires_grad_(True), config)
    if spec.init == "projection":
        log_std = proof_log_std(n, s=round(density * T), N=width, p=p, B=spec.B)
        _init_at_projection_(model, density=density, gate_logit=spec.gate_logit, log_std=log_std)
    opt = _optimizer(model, spec.init, spec.quant_lr, spec.gate_lr)
    end = 0.75 if spec.init == "default" else 0.0  # the study's support is set at initialisation
    pruning = sqs.PruningSchedule(model, target_nonzero=density, total_steps=spec.steps, end_fraction=end)
    decay = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=spec.steps) if spec.init == "projection" else None
    objective = sqs.Objective(model, num_data=n)
    model.train()
    for step in range(spec.steps):
        pruning.step(step)
        opt.zero_grad()
        objective(_gaussian_nll(model, x, y, sigma)).backward()
        opt.step()
        if decay is not None:
            decay.step()
    return model.eval()
