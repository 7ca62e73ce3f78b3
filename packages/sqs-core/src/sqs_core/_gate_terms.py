"""The per-weight formulas of the gates, the moments and the gate KL that every posterior path shares.

λ̃ = sigmoid(s̃/τ') masked and floored (eq. lambda-prime), Var_q(θ̃), ∂L/∂λ̃ through θ^avg and Var, ∂L/∂s̃ from
∂L/∂λ̃, and the gate KL's sum and gradients (eq. approx_elbo). The eager path (:mod:`sqs_core.chunked`), the
compiled kernels (:mod:`sqs_core._fused`, :mod:`sqs_core._fused_uncovered`), the dense route
(:mod:`sqs_core._dense`) and the stand-alone gate KL (:mod:`sqs_core._gate_kl`) call these, so each formula has one
coding.
"""

from __future__ import annotations

import math

import torch

from .mixture import gate_entropy, prior_logit, zero_at_most_


def check_first_order() -> None:
    """Called first in the backward of the posterior's autograd Functions (here, in _fused and in _gate_kl):
    their gradients are computed by hand (no graph of their own), so a backward that builds one
    (``create_graph=True``) would be wrong or fail inside."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            "SQS posteriors give first-order gradients only: a backward with create_graph=True through an SQS "
            "layer's weight (a penalty on gradients of the posterior's parameters, a Hessian-vector product) is not "
            "supported; gradients with respect to the inputs (an input-gradient penalty) work"
        )


GATE_FLOOR = 2.0**-64
"""λ̃ at most this (ℓ = s̃/τ' ≤ −44.4) is taken as 0 in training: θ^avg, Var, the gate KL's λ̃ KL_k and their
gradients. Such a weight contributes 2^-64 of its retained value, far below float32 rounding of any sum beside
a retained weight, and its gate's exact gradient is as small: far below AdamW's ε = 1e-8 for any sane loss
scale, so its step would be a vanishing fraction of the learning rate (the gate is frozen either way). Left
exact, a gate driven towards 0 spends steps with λ̃ μ near or below float32's smallest normal number, and the
subnormal products that follow (in the layer's matrix products, forward and backward) take a microcode assist
each on x86: docs/method.md, "Session 32". Inference ranks the gates by their logits, untouched."""


def _gate_probs(gate_logits: torch.Tensor, mask: torch.Tensor, gate_temperature: float):
    """(ℓ = s̃/τ', λ̃ = sigmoid(ℓ) (eq. lambda-prime), λ̃ where the pruning mask keeps the gate and λ̃ exceeds
    :data:`GATE_FLOOR`, else 0)."""
    scaled = gate_logits / gate_temperature
    lam_raw = torch.sigmoid(scaled)
    # λ̃ · mask, not torch.where: the same bits (λ̃ ≥ 0, so a pruned one is +0), and 4–6× faster on a CPU under
    # the schedule's mask, whose random pattern defeats where's branches (2.5–4 against 0.6 ms per 2^20)
    lam = lam_raw * as_factor(mask)
    return scaled, lam_raw, zero_at_most_(lam, GATE_FLOOR)


def as_factor(mask: torch.Tensor) -> torch.Tensor:
    """A bool ``mask`` as a factor of float products: eagerly its uint8 view, the same 0/1 and the same bits (x × 0
    keeps x's sign either way); a float × bool product took 0.25–0.31 ms per 2^20 on the CPU against 0.095 ms by the
    uint8 view (session 43). Traced (inductor fuses either) or not bool: the mask itself."""
    if mask.dtype != torch.bool or torch.compiler.is_compiling():
        return mask
    return mask.view(torch.uint8)


def sum64(values: torch.Tensor) -> torch.Tensor:
    """Σ ``values`` in float64: converted first, then summed (``sum(dtype=torch.float64)`` of a float32 tensor took
    0.18–0.33 ms per 2^20 on the CPU against 0.12 ms; session 43)."""
    return values.double().sum()


def moments_dlam(grad_mean, grad_var, m, s, lam, spike_variance):
    """∂L/∂λ̃ through θ^avg = λ̃ m and Var = λ̃ s − (λ̃ m)² + (1 − λ̃) σ_0² (:func:`_variance`), for ∂L/∂θ^avg =
    ``grad_mean`` and ∂L/∂Var = ``grad_var`` (None: Var unused, ``s`` then ignored)."""
    if grad_var is None:
        return grad_mean * m
    return grad_mean * m + grad_var * (s - 2 * lam * m * m - spike_variance)


def gate_drop(scaled):
    """1 − λ̃ of the unmasked gate, as sigmoid(−ℓ) for ℓ = ``scaled``: 1 − sigmoid(ℓ) rounds to 0 past ℓ ≈ 17 in
    float32 (16.6: 1 − λ̃ < 2^-24), where ∂λ̃/∂s̃ = λ̃(1 − λ̃)/τ' is still 6.4e-5 at ℓ = 17, and a saturated kept
    gate's gradient was exactly 0: Adam then stopped moving it, as float64 does not (session 65)."""
    return torch.sigmoid(-scaled)


def gate_logit_grad(dlam, lam, drop, tau):
    """∂L/∂s̃ = ∂L/∂λ̃ λ̃ (1 − λ̃)/τ' for λ̃ = sigmoid(s̃/τ') (eq. lambda-prime), from ∂L/∂λ̃ = ``dlam``, the masked
    and floored λ̃ (``lam``: 0 where masked, so is the result) and 1 − λ̃ unmasked (``drop``: :func:`gate_drop`).
    The eager backward of :class:`_PosteriorMoments` forms the same product in place, chunk by chunk."""
    return dlam * lam * drop / tau


def _variance(lam, m, s, spike_variance):
    """Var_q(θ̃) = λ̃ s − (λ̃ m)² + (1 − λ̃) σ_0² for the spike-and-GMM posterior with m = Σ_k φ_k μ_k and
    s = Σ_k φ_k (μ_k² + σ_k²), clamped at 0 against rounding."""
    return (lam * s - (lam * m) ** 2 + (1 - lam) * spike_variance).clamp_min(0)


def materialized_grads(like, grad_mean, grad_var, second):
    """(∂L/∂θ^avg, ∂L/∂Var) for a posterior-moments backward whose Function does not materialise its outputs'
    gradients (``ctx.set_materialize_grads(False)``: autograd would otherwise fill a zero gradient for the T-sized
    uint8 k* output every step, 1.5–4.5 ms for the 4096² layer): zeros shaped as ``like`` for a missing one that
    the backward reads (∂L/∂Var only where ``second``); None for an unread one."""
    if grad_mean is None:
        grad_mean = torch.zeros_like(like)
    if second and grad_var is None:
        grad_var = torch.zeros_like(like)
    return grad_mean, (grad_var if second else None)


def kl_accumulator(component_kl, grad_kl):
    """The float64 Σ λ̃ per component that the gate KL's backward fills, or None when the KL is absent
    or its incoming gradient is exactly 0 (unused, or β = 0): then it adds nothing."""
    if component_kl is None or grad_kl is None or not bool(grad_kl != 0):
        return None
    return torch.zeros(component_kl.numel(), dtype=torch.float64, device=component_kl.device)


def kl_grad(component_kl, g_comp, grad_kl):
    """∂KL/∂KL_wk = Σ_{i: w_i = w, k*_i = k} λ̃_i, times the incoming gradient, in component_kl's shape."""
    if g_comp is None:
        return None
    return (grad_kl * g_comp).to(component_kl.dtype).reshape(component_kl.shape)


def _kl_terms_sum(scaled, lam, mask, ck, prior_keep):
    """Σ_i λ̃_i KL_{w_i,k*_i} + Σ_i KL(Bern(λ̃_i)‖Bern(λ)) in float64 from ℓ = s̃/τ', the masked λ̃ and each
    weight's component KL ``ck`` (the Bernoulli term unless ``prior_keep`` is None; a gate the schedule
    forced to zero has λ̃ = 0 and the constant −log(1 − λ)). The Bernoulli terms are not formed one by one:
    Σ_i KL(Bern(λ̃_i)‖Bern(λ)) = −Σ_{i kept} H(λ̃_i) − logit λ Σ_i λ̃_i − T log(1 − λ) (eq. approx_elbo's
    −H − λ̃ logit λ − log(1 − λ) per gate; λ̃ = 0 where masked), four passes over the gates fewer a chunk."""
    total = sum64(lam * ck)
    if prior_keep is not None:
        kept_entropy = sum64(gate_entropy(scaled).mul_(as_factor(mask)))  # H is finite for finite ℓ
        total -= kept_entropy + prior_logit(prior_keep) * sum64(lam) + lam.numel() * math.log1p(-prior_keep)
    return total


def kl_dlam(scaled, ck, prior_keep):
    """∂KL/∂λ̃ of each gate's KL terms: KL_{w,k*} + ℓ − logit λ from ℓ = s̃/τ' and each weight's component KL ``ck``
    (no ℓ − logit λ when ``prior_keep`` is None: the Gaussian prior); a new tensor."""
    if prior_keep is None:
        return ck.clone()
    return (scaled - prior_logit(prior_keep)).add_(ck)


def _kl_gate_grads(scaled, drop, lam, ck, tau, prior_keep, grad):
    """∂KL/∂s̃ = (KL_{w,k*} + ℓ − logit λ) λ̃ (1 − λ̃)/τ' times the incoming ``grad``, from ℓ, 1 − λ̃ unmasked
    (:func:`gate_drop`), the masked λ̃ and each weight's component KL ``ck`` (no ℓ − logit λ when ``prior_keep`` is
    None)."""
    return kl_dlam(scaled, ck, prior_keep).mul_(lam).mul_(drop).mul_(grad / tau)
