"""The Hellinger risk of a fitted SQS student, under each distribution the paper uses for θ̃.

For Y | x ~ N(f(x), σ²) and the truth N(f0(x), σ²), d²(P_θ, P_0) = 1 − E_x exp(−(f_θ(x) − f0(x))² / (8σ²))
(:func:`hellinger.hellinger_sq`); E_x is a mean over a fixed test sample of x ~ U[0,1]^p. The estimators:

* ``hellinger_sq``: ∫ d²(P_θ, P_0) q̂(dθ), the left side of the Theorem, by M draws of θ̃ ~ q̂
  (γ ~ Bern(λ̂), z ~ Cat(φ), N(μ_z, σ_z²); the Gaussian-prior family draws its "spike" from N(0, σ_0²));
* ``hellinger_sq_avg``: at θ^avg = E_q[θ̃] (the training forward, eq. approx_elbo), with ``hellinger_sq_x_se``
  the Monte Carlo standard error of its average over x;
* ``hellinger_sq_sampled``: the same average under the discrete inference distribution (eq. infer-theta,
  levels μ_k with probability φ_k, pruned deterministically at the Non-zero rate);
* ``hellinger_sq_bma``: the Bayesian average of M such draws (eq. infer-bam), a predictor, not a θ;
* ``hellinger_sq_greedy``: the greedy weights μ_{k*} (eq. greedy).
"""

from __future__ import annotations

import numpy as np
import sqs_core as sqs
import torch
from torch import nn

from . import _tensors
from . import _validate as check
from .hellinger import hellinger_sq, hellinger_sq_gaussian

__all__ = ["draw_from_q_", "predict", "risk_summary"]


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    """f(x) as a float64 vector (n,), for x (n, p) finite, of the model's dtype."""
    with check.within("predict"):
        _tensors.inputs(model, x)
    return model(x).numpy().ravel().astype(float)


def _sqs_model(name: str, model: nn.Module) -> None:
    """A model prepared by sqs-core (an unprepared one has nothing to draw, and a draw was silently nothing)."""
    if not isinstance(model, nn.Module) or not sqs.sqs_layers(model):
        raise ValueError(
            f"{name} must be prepared by sqs_core.prepare_ (it has no SQS layers), got {type(model).__name__}"
        )


@torch.no_grad()
@check.arguments(model=_sqs_model, generator=_tensors.generator)
def draw_from_q_(model: nn.Module, generator: torch.Generator) -> None:
    """Fix every SQS layer of ``model`` to one draw θ̃ ~ q̂ (eq. marginal_vb, with the pruning masks)."""
    layers = sqs.sqs_layers(model)
    for name, p in sqs.posteriors(model).items():
        lam = p.effective_keep_probs().reshape(-1)  # λ̃ · mask: the schedule's zeros are γ = 0
        gamma = torch.rand(lam.shape, generator=generator) < lam
        z = torch.multinomial(p.responsibilities(), 1, generator=generator).squeeze(1)
        flat = p.window_ids.reshape(-1).long() * p.num_components + z
        std = p.log_stds.detach().exp().reshape(-1)[flat]
        slab = p.level_values(z).reshape(-1) + std * torch.randn(lam.shape, generator=generator)
        spike_std = p.config.prior.slab_std if p.config.prior.kind == "gaussian" else 0.0
        spike = spike_std * torch.randn(lam.shape, generator=generator)
        layers[name].set_fixed_weight(torch.where(gamma, slab, spike).reshape(p.weight.shape))


def _mean_sd(values) -> tuple[float, float]:
    """Mean and its standard error s/√m, s the sample standard deviation (ddof = 1: with ddof = 0 it was
    √((m-1)/m) too small, 29 % at m = 2); NaN for a single value, whose error cannot be estimated."""
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return float(np.mean(values)), float("nan")
    return float(np.mean(values)), float(np.std(values, ddof=1) / np.sqrt(values.size))


def _draws(name: str, value) -> int:
    """M >= 2 draws: the standard error of their average needs two (with one it had been reported as 0)."""
    return check.count(name, value, low=2)


def _test_sample(model: nn.Module, x_test, f0) -> None:
    """x_test (n, p) finite, of the model's dtype, and f0 its n finite true values (a shorter f0 broadcast)."""
    n = _tensors.inputs(model, x_test, name="x_test")
    truth = check.finite_array("f0", f0)
    if truth.shape != (n,):
        raise ValueError(f"f0 must have shape (n_test,) = {(n,)}, got {truth.shape}")


@check.arguments(model=_sqs_model, sigma="positive", density="fraction", draws=_draws, generator=_tensors.generator)
def risk_summary(
    model: nn.Module, x_test: torch.Tensor, f0: np.ndarray, *, sigma: float, density: float, draws: int, generator
) -> dict[str, float]:
    """Every estimator of the module docstring, with Monte Carlo standard errors over the M = ``draws`` draws
    (ddof = 1; ``hellinger_sq_x_se`` is NaN for a single test x); leaves ``model`` in its variational forward.
    ``model`` prepared by sqs-core, x_test (n, p) and f0 (n,) finite, σ > 0, density in (0, 1], draws >= 2."""
    with check.within("risk_summary"):
        _test_sample(model, x_test, f0)
    pointwise = hellinger_sq_gaussian(predict(model, x_test), f0, sigma)
    out = {"hellinger_sq_avg": float(pointwise.mean()), "hellinger_sq_x_se": _mean_sd(pointwise)[1]}
    q_draws, d_draws = [], []
    for _ in range(draws):
        draw_from_q_(model, generator)
        q_draws.append(hellinger_sq(predict(model, x_test), f0, sigma))
        sqs.sample_(model, nonzero=density, generator=generator)
        d_draws.append(hellinger_sq(predict(model, x_test), f0, sigma))
    out["hellinger_sq"], out["hellinger_sq_se"] = _mean_sd(q_draws)
    out["hellinger_sq_sampled"], out["hellinger_sq_sampled_se"] = _mean_sd(d_draws)
    bma = sqs.BayesianAverage(model, samples=draws, nonzero=density, generator=generator)
    out["hellinger_sq_bma"] = hellinger_sq(predict(bma, x_test), f0, sigma)
    sqs.greedy_(model, nonzero=density)
    out["hellinger_sq_greedy"] = hellinger_sq(predict(model, x_test), f0, sigma)
    sqs.variational_(model)
    return out
