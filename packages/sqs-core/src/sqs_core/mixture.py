"""The closed-form pieces of the spike-and-GMM posterior, all in log space.

Shapes: ``theta`` (n,), per-window component parameters (K,), results (n, K).

Responsibilities φ_k(θ_i) (eq. compute-phi-k):
* ``paper``:     φ'_k = softmax_k(π_k·N(θ_i | μ_k, σ_k²)),  φ_k = softmax_k(φ'_k / τ).
  Written as exp(π_k N_k) the formula overflows for small σ_k; here π_k N_k = exp(q_k) with
  q_k = log π_k + log N_k, and both softmaxes are evaluated with max-subtraction. Note a property of the
  formula itself (not of its numerics): a weight far from every component (π_k N_k ≈ 0 for all k) gets
  φ' ≈ uniform, hence φ ≈ uniform.
* ``standard``:  φ_k = softmax_k(q_k / τ), i.e. π_k N_k / Σ_j π_j N_j at τ = 1 (the usual GMM
  responsibility, as in DGMS), sharpened by the temperature.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "HALF_LOG_2PI",
    "PAPER_CLAMP",
    "bernoulli_kl",
    "bernoulli_kl_terms",
    "component_log_density",
    "exp_floor",
    "flush_subnormals",
    "flush_subnormals_",
    "gate_entropy",
    "gaussian_kl",
    "log_responsibilities",
    "prior_logit",
    "zero_at_most_",
]

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
PAPER_CLAMP = 80.0  # log π N is clamped here before exp in the paper's first stage (π N ≤ e^80 ≈ 5.5e34)


def exp_floor(dtype: torch.dtype) -> float:
    """1 + log of ``dtype``'s smallest normal number (−86.34 in float32; at the log itself e^x rounds to a
    subnormal): the paper's first stage (:func:`_paper_first_stage`) and the nearby evaluation
    (sqs_core._nearby) raise exp arguments below it to it, so such an e^x is 3.2e-38 where it was smaller (a
    subnormal or 0 below 1.2e-38).
    - π N = e^q: its e^{π N} is exactly 1 either way, and the backward takes ∂π N/∂q as 0 where q was
      raised (as it is where q is clamped at 80), since z, which multiplies it, is huge exactly there.
    - The nearby softmaxes' terms: each one is summed beside its row's largest, e^0 = 1 (both subtract their
      maximum). The moments move by at most ~3e-38 of a μ, and the gradient terms a raised term scales
      stay ~3e-38 of its row's largest.

    Torch's eager CPU exp takes a slow path for such arguments, and for those above log of the largest
    float: on session 29's Intel Xeon, 11 ms against 0.06 ms per 2^19 of them on 2 threads. The late 4096²
    step's nearby blocks hold many: far components, and rows whose largest π N is large."""
    return math.log(torch.finfo(dtype).tiny) + 1.0


def flush_subnormals(x: torch.Tensor) -> torch.Tensor:
    """``x`` with every entry of magnitude at most its dtype's smallest normal number (1.2e-38 in float32: the
    subnormals) set to 0; the form for compiled kernels (:func:`flush_subnormals_`: in place, eager).

    θ^avg = λ̃ m and Var_q leave the posterior flushed. A gate driven towards 0 passes ℓ = s̃/τ' ≈ −83…−89,
    where λ̃ m is subnormal, and on x86 (whose flush-to-zero mode PyTorch leaves off) every arithmetic
    instruction that meets a subnormal takes a microcode assist: the forward matrix product of a 4096²
    layer with 2.1M subnormal weights took 41 s against 0.21 s (session 32's Intel Xeon). The flushed
    values are below 1.2e-38 in magnitude; gradients are those of the values before flushing."""
    return F.hardshrink(x, torch.finfo(x.dtype).tiny)


def flush_subnormals_(x: torch.Tensor) -> torch.Tensor:
    """:func:`flush_subnormals` in place (one pass): ``x`` itself (see :func:`zero_at_most_`)."""
    return zero_at_most_(x, torch.finfo(x.dtype).tiny)


def zero_at_most_(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """``x`` with every entry of magnitude at most ``threshold`` set to 0, in place (one pass) and returned; a new
    tensor where in-place ``out=`` cannot go: under ``torch.compile`` or when ``x`` carries a graph."""
    if torch.compiler.is_compiling() or x.requires_grad:
        return F.hardshrink(x, threshold)
    return torch.ops.aten.hardshrink.out(x, threshold, out=x)


def component_log_density(
    theta: torch.Tensor, means: torch.Tensor, log_stds: torch.Tensor, log_mixing: torch.Tensor
) -> torch.Tensor:
    """q_ik = log π_k + log N(θ_i | μ_k, σ_k²), shape (n, K)."""
    z = (theta[:, None] - means) * torch.exp(-log_stds)
    return log_mixing - log_stds - HALF_LOG_2PI - 0.5 * z * z


def log_responsibilities(q: torch.Tensor, kind: str, temperature: float) -> torch.Tensor:
    """log φ_ik from the component log densities q (n, K); see the module docstring."""
    if kind == "standard":
        return F.log_softmax(q / temperature, dim=-1)
    if kind == "paper":
        return F.log_softmax(_paper_first_stage(q) / temperature, dim=-1)
    raise ValueError(f"unknown responsibility kind {kind!r}; expected 'paper' or 'standard'")


def _paper_first_stage(q: torch.Tensor) -> torch.Tensor:
    """φ'_k = softmax_k(exp(q_k)), stable for large q (exp(q) is clamped where it would overflow, at 80: far
    beyond any σ a float32 weight has) and fast for far components: q is raised to :func:`exp_floor`, so a
    π N that was a subnormal or 0 is 3.2e-38. φ' keeps every bit: softmax subtracts the row's largest π N,
    and either that is ≥ 2^-100, so the difference rounds to minus it for both, or every π N is below it and
    e^{π N − max} rounds to 1 for both. Only ∂π N/∂q, ≤ 3.2e-38, becomes 0 there (docs/method.md, "Session 30")."""
    a = torch.exp(q.clamp(exp_floor(q.dtype), PAPER_CLAMP))
    return torch.softmax(a, dim=-1)


def gaussian_kl(means: torch.Tensor, log_stds: torch.Tensor, prior_std: float) -> torch.Tensor:
    """KL(N(μ, σ²) ‖ N(0, σ_0²)) = log(σ_0/σ) + (σ² + μ²)/(2σ_0²) − ½, elementwise."""
    var_ratio = torch.exp(2 * log_stds) / prior_std**2
    return math.log(prior_std) - log_stds + 0.5 * (var_ratio + means**2 / prior_std**2) - 0.5


def bernoulli_kl(gate_logits_scaled: torch.Tensor, prior_keep: float, keep: torch.Tensor | None = None) -> torch.Tensor:
    """KL(Bern(λ̃) ‖ Bern(λ)) from ℓ = s̃/τ' (λ̃ = sigmoid(ℓ), or ``keep`` when the caller has it), stable for
    any ℓ, elementwise: :func:`bernoulli_kl_terms`."""
    if keep is None:
        keep = torch.sigmoid(gate_logits_scaled)
    return bernoulli_kl_terms(gate_logits_scaled, keep, prior_logit(prior_keep), math.log1p(-prior_keep))


def prior_logit(prior_keep: float) -> float:
    """logit λ = log λ − log(1 − λ) of the spike-and-slab prior's keep probability λ (eq. marginal_prior)."""
    return math.log(prior_keep) - math.log1p(-prior_keep)


def bernoulli_kl_terms(scaled, keep, prior_logit, log_drop, tail=None):
    """KL(Bern(λ̃) ‖ Bern(λ)) = −H(λ̃) − λ̃ logit λ − log(1 − λ) from ℓ = ``scaled``, λ̃ = ``keep``, logit λ =
    ``prior_logit`` and log(1 − λ) = ``log_drop`` (floats, or 0-d tensors in compiled kernels so that λ is
    not baked into a graph), with the entropy written without cancellation, H(λ̃) = log1p(e^{−|ℓ|}) +
    |ℓ| e^{−|ℓ|}/(1 + e^{−|ℓ|}): one exp (``tail`` = e^{−|ℓ|} when the caller has it) and one log1p; softplus
    twice took 4× as long on the CPU. In place past the first results, the same bits: 11.3–11.7 against 19–25 ms
    per 2^20 gates in a fresh process (three alternating pairs). e^{−|ℓ|} is raised to :func:`exp_floor` (3.2e-38
    in float32, where it was a subnormal or 0 for |ℓ| > 86.3: torch's slow exp path, 7–14× the time): the KL
    moves by at most (1 + |ℓ|) 3.2e-38, far below its float32 rounding."""
    return gate_entropy(scaled, tail).add_(keep * prior_logit).neg_().sub_(log_drop)


def gate_entropy(scaled, tail=None):
    """H(λ̃) = log1p(e^{−|ℓ|}) + |ℓ| e^{−|ℓ|}/(1 + e^{−|ℓ|}) of λ̃ = sigmoid(ℓ), ℓ = ``scaled``, as
    :func:`bernoulli_kl_terms` forms it (``tail``: e^{−|ℓ|} raised to :func:`exp_floor`, when the caller has it); a
    new tensor."""
    magnitude = scaled.abs()
    tail = magnitude.neg().clamp_(min=exp_floor(magnitude.dtype)).exp_() if tail is None else tail
    return (tail / (1 + tail)).mul_(magnitude).add_(torch.log1p(tail))
