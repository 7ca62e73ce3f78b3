"""Memory-lean autograd for the posterior: chunk over weights, recompute in backward.

A direct autograd implementation keeps the (T, K) responsibilities of every layer alive until backward
(K = 64 on a 4096×4096 layer is 4 GiB). Here forward runs chunk by chunk without a graph and saves only
the inputs (which are alive anyway); backward recomputes each chunk's (n, K) block, takes its
vector-Jacobian product, and frees it. Peak extra memory is O(n·K) for one chunk plus O(T) outputs.

All tensors are flat: ``theta``, ``gate_logits``, ``mask``, ``window_ids`` are (T,); the component
parameters are (W, K).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .mixture import bernoulli_kl, component_log_density, log_responsibilities

__all__ = ["PosteriorSpec", "gate_kl", "posterior_moments", "responsibility_blocks"]

CHUNK_ELEMENTS = 1 << 20  # elements of one (n, K) block


@dataclass(frozen=True)
class PosteriorSpec:
    """Non-tensor settings of one posterior evaluation."""

    kind: str
    temperature: float
    gate_temperature: float
    spike_variance: float = 0.0  # σ_0² for the Gaussian-"spike" ablation family, else 0


def _chunk_ranges(numel: int, num_components: int) -> Iterator[tuple[int, int]]:
    step = max(1, CHUNK_ELEMENTS // num_components)
    for start in range(0, numel, step):
        yield start, min(numel, start + step)


def _window_selections(window_ids: torch.Tensor, num_windows: int):
    """(window, local index or None for 'all of the chunk') for each non-empty window in a chunk."""
    if num_windows == 1:
        yield 0, None
        return
    for w in range(num_windows):
        sel = (window_ids == w).nonzero().squeeze(1)
        if sel.numel():
            yield w, sel


def responsibility_blocks(theta, window_ids, means, log_stds, mixing_logits, kind, temperature):
    """Yield ``(start, end, local_index, window, log_phi)`` blocks covering all weights (no graph kept)."""
    num_windows, k = means.shape
    log_mix = F.log_softmax(mixing_logits, dim=-1)
    for a, b in _chunk_ranges(theta.numel(), k):
        for w, sel in _window_selections(window_ids[a:b], num_windows):
            th = theta[a:b] if sel is None else theta[a:b][sel]
            q = component_log_density(th, means[w], log_stds[w], log_mix[w])
            yield a, b, sel, w, log_responsibilities(q, kind, temperature)


def _moments(th, means_w, log_stds_w, log_mix_w, spec: PosteriorSpec, second: bool):
    q = component_log_density(th, means_w, log_stds_w, log_mix_w)
    log_phi = log_responsibilities(q, spec.kind, spec.temperature)
    phi = log_phi.exp()
    m = phi @ means_w
    s = phi @ (means_w**2 + torch.exp(2 * log_stds_w)) if second else None
    return m, s, log_phi


def _put(target: torch.Tensor, a: int, b: int, sel, values: torch.Tensor) -> None:
    if sel is None:
        target[a:b] = values
    else:
        target[a:b].index_copy_(0, sel, values.to(target.dtype))


def _take(source: torch.Tensor, a: int, b: int, sel) -> torch.Tensor:
    return source[a:b] if sel is None else source[a:b][sel]


class _PosteriorMoments(torch.autograd.Function):
    """θ^avg_i = λ̃_i Σ_k φ_ik μ_k and (optionally) Var_q(θ̃_i); also k*_i = argmax_k φ_ik."""

    @staticmethod
    def forward(ctx, theta, gate_logits, means, log_stds, mixing_logits, mask, window_ids, spec, second):
        keep = torch.sigmoid(gate_logits / spec.gate_temperature) * mask
        mean = torch.empty_like(theta)
        var = torch.empty_like(theta) if second else theta.new_zeros(0)
        kstar = torch.empty(theta.shape, dtype=torch.uint8, device=theta.device)
        log_mix = F.log_softmax(mixing_logits, dim=-1)
        num_windows, k = means.shape
        for a, b in _chunk_ranges(theta.numel(), k):
            for w, sel in _window_selections(window_ids[a:b], num_windows):
                th = _take(theta, a, b, sel)
                m, s, log_phi = _moments(th, means[w], log_stds[w], log_mix[w], spec, second)
                lam = _take(keep, a, b, sel)
                _put(mean, a, b, sel, lam * m)
                _put(kstar, a, b, sel, log_phi.argmax(-1).to(torch.uint8))
                if second:
                    v = lam * s - (lam * m) ** 2 + (1 - lam) * spec.spike_variance
                    _put(var, a, b, sel, v.clamp_min(0))
        ctx.save_for_backward(theta, gate_logits, means, log_stds, mixing_logits, mask, window_ids)
        ctx.spec, ctx.second = spec, second
        ctx.mark_non_differentiable(kstar)
        return mean, var, kstar

    @staticmethod
    def backward(ctx, grad_mean, grad_var, _grad_kstar):
        theta, gate_logits, means, log_stds, mixing_logits, mask, window_ids = ctx.saved_tensors
        spec, second = ctx.spec, ctx.second
        need_theta = ctx.needs_input_grad[0]
        leaves = [p.detach().requires_grad_() for p in (means, log_stds, mixing_logits)]
        param_grads = [torch.zeros_like(p) for p in leaves]
        g_theta = torch.zeros_like(theta) if need_theta else None
        g_gate = torch.zeros_like(gate_logits)
        keep_raw = torch.sigmoid(gate_logits / spec.gate_temperature)
        for a, b, sel, _w, th_leaf, m, s, lam_raw, lam_mask in _recompute(
            theta, keep_raw, mask, window_ids, leaves, spec, second, need_theta
        ):
            lam = lam_raw * lam_mask
            gm = _take(grad_mean, a, b, sel)
            dm, dlam = gm * lam, gm * m.detach()
            outputs, grads_out = [m], [dm]
            if second:
                gv = _take(grad_var, a, b, sel)
                m_val, s_val = m.detach(), s.detach()
                outputs[0:1], grads_out[0:1] = [m], [dm - 2 * gv * lam * lam * m_val]
                outputs.append(s)
                grads_out.append(gv * lam)
                dlam = dlam + gv * (s_val - 2 * lam * m_val * m_val - spec.spike_variance)
            inputs = leaves + ([th_leaf] if need_theta else [])
            grads = torch.autograd.grad(outputs, inputs, grads_out, allow_unused=True)
            for acc, g in zip(param_grads, grads[:3], strict=True):
                if g is not None:
                    acc += g
            if g_theta is not None and grads[3] is not None:
                _put(g_theta, a, b, sel, grads[3])
            _put(g_gate, a, b, sel, dlam * lam_mask * lam_raw * (1 - lam_raw) / spec.gate_temperature)
        return g_theta, g_gate, *param_grads, None, None, None, None


def _recompute(theta, keep_raw, mask, window_ids, leaves, spec, second, need_theta):
    means, log_stds, mixing_logits = leaves
    num_windows, k = means.shape
    for a, b in _chunk_ranges(theta.numel(), k):
        for w, sel in _window_selections(window_ids[a:b], num_windows):
            th_leaf = _take(theta, a, b, sel).detach().requires_grad_(need_theta)
            with torch.enable_grad():
                log_mix = F.log_softmax(mixing_logits[w], dim=-1)
                m, s, _ = _moments(th_leaf, means[w], log_stds[w], log_mix, spec, second)
            lam_raw = _take(keep_raw, a, b, sel)
            lam_mask = _take(mask, a, b, sel).to(lam_raw.dtype)
            yield a, b, sel, w, th_leaf, m, s, lam_raw, lam_mask


def posterior_moments(theta, gate_logits, means, log_stds, mixing_logits, mask, window_ids, spec, second):
    """Differentiable (θ^avg, Var or empty, k*) for flat inputs; see :class:`_PosteriorMoments`."""
    return _PosteriorMoments.apply(theta, gate_logits, means, log_stds, mixing_logits, mask, window_ids, spec, second)


class _GateKL(torch.autograd.Function):
    """Σ_i KL(Bern(λ̃_i)‖Bern(λ)) + Σ_i λ̃_i KL_{w_i, k*_i}, with closed-form gradients (O(T) memory).

    ``prior_keep`` None drops the Bernoulli term (the Gaussian-prior ablation, eq. Gaussian prior).
    A gate forced to zero by the pruning schedule has λ̃ = 0: its term is the constant −log(1 − λ).
    """

    @staticmethod
    def forward(ctx, gate_logits, component_kl, mask, window_ids, kstar, gate_temperature, prior_keep):
        k = component_kl.shape[1]
        flat_kl = component_kl.reshape(-1)
        total = torch.zeros((), dtype=torch.float64, device=gate_logits.device)
        for a, b in _chunk_ranges(gate_logits.numel(), 1):
            scaled = gate_logits[a:b] / gate_temperature
            on = mask[a:b]
            lam = torch.sigmoid(scaled) * on
            ck = flat_kl[window_ids[a:b].long() * k + kstar[a:b].long()]
            total += (lam * ck).sum(dtype=torch.float64)
            if prior_keep is not None:
                bern = torch.where(on, bernoulli_kl(scaled, prior_keep), -math.log1p(-prior_keep))
                total += bern.sum(dtype=torch.float64)
        ctx.save_for_backward(gate_logits, component_kl, mask, window_ids, kstar)
        ctx.gate_temperature, ctx.prior_keep = gate_temperature, prior_keep
        return total.to(gate_logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        gate_logits, component_kl, mask, window_ids, kstar = ctx.saved_tensors
        tau, prior_keep = ctx.gate_temperature, ctx.prior_keep
        w_count, k = component_kl.shape
        flat_kl = component_kl.reshape(-1)
        g_gate = torch.empty_like(gate_logits)
        g_comp = torch.zeros(w_count * k, dtype=torch.float64, device=gate_logits.device)
        prior_logit = 0.0 if prior_keep is None else math.log(prior_keep) - math.log1p(-prior_keep)
        for a, b in _chunk_ranges(gate_logits.numel(), 1):
            scaled = gate_logits[a:b] / tau
            on = mask[a:b].to(scaled.dtype)
            lam = torch.sigmoid(scaled)
            index = window_ids[a:b].long() * k + kstar[a:b].long()
            dkl_dlam = flat_kl[index] + ((scaled - prior_logit) if prior_keep is not None else 0.0)
            g_gate[a:b] = grad * on * dkl_dlam * lam * (1 - lam) / tau
            g_comp.index_add_(0, index, (lam * on).double())
        g_comp = (grad * g_comp).to(component_kl.dtype).reshape(w_count, k)
        return g_gate, g_comp, None, None, None, None, None


def gate_kl(gate_logits, component_kl, mask, window_ids, kstar, gate_temperature, prior_keep):
    """Differentiable KL sum of one posterior; see :class:`_GateKL`."""
    return _GateKL.apply(gate_logits, component_kl, mask, window_ids, kstar, gate_temperature, prior_keep)
