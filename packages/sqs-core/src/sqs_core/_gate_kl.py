"""The gate KL of eq. approx_elbo on its own, for k* found by an earlier forward.

A training step gets it from :func:`sqs_core.chunked.posterior_moments`, which sums it in the same passes
as θ^avg; :meth:`SpikeGMMPosterior.kl` falls back to this when no such forward result is pending (the KL
asked for twice, or after the parameters changed).
"""

from __future__ import annotations

import torch

from ._autocast import without_autocast
from ._gate_terms import _gate_probs, _kl_gate_grads, _kl_terms_sum, check_first_order, gate_drop
from ._index_add import index_add_all
from ._one_hot import _flat_index
from .chunked import _chunk_ranges

__all__ = ["gate_kl"]


class _GateKL(torch.autograd.Function):
    """Σ_i KL(Bern(λ̃_i)‖Bern(λ)) + Σ_i λ̃_i KL_{w_i, k*_i}, with closed-form gradients (O(T) memory).

    ``prior_keep`` None drops the Bernoulli term (the Gaussian-prior ablation, eq. Gaussian prior).
    A gate forced to zero by the pruning schedule has λ̃ = 0: its term is the constant −log(1 − λ).
    ``compiled``: the sum and each chunk's gradients by sqs_core._fused's kernels (the same values).
    """

    @staticmethod
    def forward(ctx, gate_logits, component_kl, mask, window_ids, kstar, gate_temperature, prior_keep, compiled):
        total_of, _ = _gate_kl_parts(compiled)
        total = total_of(gate_logits, component_kl, mask, window_ids, kstar, gate_temperature, prior_keep)
        ctx.save_for_backward(gate_logits, component_kl, mask, window_ids, kstar)
        ctx.gate_temperature, ctx.prior_keep, ctx.compiled = gate_temperature, prior_keep, compiled
        return total.to(gate_logits.dtype)

    @staticmethod
    @without_autocast
    def backward(ctx, grad):
        check_first_order()
        gate_logits, component_kl, mask, window_ids, kstar = ctx.saved_tensors
        _, chunk_grads = _gate_kl_parts(ctx.compiled)
        g_gate = torch.empty_like(gate_logits)
        g_comp = torch.zeros(component_kl.numel(), dtype=torch.float64, device=gate_logits.device)
        for a, b in _chunk_ranges(gate_logits.numel(), 1, gate_logits.device):
            chunk = (gate_logits[a:b], component_kl, mask[a:b], window_ids[a:b], kstar[a:b])
            index, lam, g_gate[a:b] = chunk_grads(*chunk, ctx.gate_temperature, ctx.prior_keep, grad)
            index_add_all([(g_comp, index, lam)])
        g_comp = (grad * g_comp).to(component_kl.dtype).reshape(component_kl.shape)
        return g_gate, g_comp, None, None, None, None, None, None


def _gate_kl_parts(compiled: bool):
    """(KL sum, one chunk's (flat index, λ̃ as float64, ∂KL/∂s̃)): eager here, or sqs_core._fused's kernels."""
    if not compiled:
        return _gate_kl_total, _gate_kl_chunk_grads
    from ._fused import gate_kl_chunk_grads, gate_kl_total  # torch.compile machinery only when asked for

    return gate_kl_total, gate_kl_chunk_grads


def _gate_kl_total(gate_logits, component_kl, mask, window_ids, kstar, gate_temperature, prior_keep):
    """The KL sum in float64, chunk by chunk."""
    total = torch.zeros((), dtype=torch.float64, device=gate_logits.device)
    for a, b in _chunk_ranges(gate_logits.numel(), 1, gate_logits.device):
        chunk = (gate_logits[a:b], component_kl, mask[a:b], window_ids[a:b], kstar[a:b])
        total += _gate_kl_chunk_sum(*chunk, gate_temperature, prior_keep)
    return total


def _gate_kl_chunk_sum(gate_logits, component_kl, mask, window_ids, kstar, tau, prior_keep):
    """One chunk's Σ_i λ̃_i KL_{w_i,k*_i} + Σ_i KL(Bern(λ̃_i)‖Bern(λ)) in float64: :func:`_kl_terms_sum`."""
    scaled, _, lam = _gate_probs(gate_logits, mask, tau)
    ck = component_kl.reshape(-1).index_select(0, _flat_index(window_ids, kstar, component_kl.shape[1]))
    return _kl_terms_sum(scaled, lam, mask, ck, prior_keep)


def _gate_kl_chunk_grads(gate_logits, component_kl, mask, window_ids, kstar, tau, prior_keep, grad):
    """One chunk's (flat index w·K + k*, λ̃ as float64, ∂KL/∂s̃): :func:`_kl_gate_grads`."""
    scaled, _, lam = _gate_probs(gate_logits, mask, tau)
    index = _flat_index(window_ids, kstar, component_kl.shape[1], torch.int64)
    ck = component_kl.reshape(-1).index_select(0, index)
    return index, lam.double(), _kl_gate_grads(scaled, gate_drop(scaled), lam, ck, tau, prior_keep, grad)


def gate_kl(gate_logits, component_kl, mask, window_ids, kstar, gate_temperature, prior_keep, *, compiled=False):
    """Differentiable KL sum of one posterior; see :class:`_GateKL` (``compiled``: sqs_core._fused)."""
    return _GateKL.apply(gate_logits, component_kl, mask, window_ids, kstar, gate_temperature, prior_keep, compiled)
