"""Memory-lean autograd for the posterior: chunk over weights, recompute in backward.

A direct autograd implementation keeps the (T, K) responsibilities of every layer alive until backward
(K = 64 on a 4096×4096 layer is 4 GiB). Here forward runs chunk by chunk without a graph and saves only
the inputs (which are alive anyway); backward recomputes each chunk's (n, K) block, takes its
vector-Jacobian product, and frees it. Peak extra memory is O(n·K) for one chunk plus O(T) outputs.

All tensors are flat: ``theta``, ``gate_logits``, ``mask``, ``window_ids`` are (T,); the component
parameters are (W, K).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._autocast import without_autocast
from ._gate_terms import (
    _gate_probs,
    _kl_terms_sum,
    _variance,
    check_first_order,
    gate_drop,
    kl_accumulator,
    kl_dlam,
    kl_grad,
    materialized_grads,
    moments_dlam,
)
from ._nearby import (
    NearbyTables,
    TableGradients,
    _Uncovered,
    cotangents,
    lumped_grads,
    lumped_moments,
    nearby_grads,
    nearby_moments,
)
from ._one_hot import OneHotLevels, OneHotSums, _flat_index
from .mixture import component_log_density, flush_subnormals_, log_responsibilities
from .onehot import (
    ALL_LUMPED,
    bin_components,
    bin_table,
    certify_one_hot,
    classify,
    columns_of,
    flat_indices,
    uncovered_blocks,
)

__all__ = [
    "PosteriorSpec",
    "certified_levels",
    "check_first_order",
    "posterior_moments",
    "responsibility_blocks",
    "uncertain_log_responsibilities",
]

CHUNK_ELEMENTS = 1 << 20  # on the CPU: elements of one (n, K) block, sized for its caches
DEVICE_CHUNK_ELEMENTS = 1 << 22
"""On an accelerator: elements of one (n, K) block. There the chunk sets the number of kernel launches, which
bound an eager step: the 4096² Linear's eager CUDA step (K = 64, 2,048 tokens, H200) took 157, 77, 52.5, 28.8 and
20.7 ms at 2^20 … 2^24 (8,900 launches a step at 2^20), its peak memory 1.36, 1.52, 1.90, 2.57 and 3.88× a plain
step's; the compiled step 40.3, 24.8 and 24.1 ms at 2^20, 2^22 and 2^24, peak 1.38, 1.58 and 1.99× (docs/method.md,
"Session 33"). The extra memory is O(chunk), not O(T)."""


def chunk_elements(device: torch.device) -> int:
    """The elements of one (n, K) block on ``device``: :data:`CHUNK_ELEMENTS` on the CPU, else
    :data:`DEVICE_CHUNK_ELEMENTS`."""
    return CHUNK_ELEMENTS if device.type == "cpu" else DEVICE_CHUNK_ELEMENTS


@dataclass(frozen=True)
class PosteriorSpec:
    """Non-tensor settings of one posterior evaluation."""

    kind: str
    temperature: float
    gate_temperature: float
    spike_variance: float = 0.0  # σ_0² for the Gaussian-"spike" ablation family, else 0
    compiled: bool = False  # the per-weight passes as torch.compile'd kernels (sqs_core._fused)
    prior_keep: float | None = None  # λ of the spike-and-slab prior; None: no Bernoulli KL (Gaussian prior)


def _chunk_ranges(numel: int, num_components: int, device: torch.device) -> Iterator[tuple[int, int]]:
    step = max(1, chunk_elements(device) // num_components)
    for start in range(0, numel, step):
        yield start, min(numel, start + step)


def _log_density_rows(th, wid, means, log_stds, log_mix):
    """q = log(π_k N_k(θ)) (n, K) of flat weights ``th``, each with the components of its window ``wid`` (int64);
    for the inference paths (the training path, :func:`_full_moments`, reuses its gathered rows for the moments)."""
    return component_log_density(th, means[wid], log_stds[wid], log_mix[wid])  # row i: window wid_i


@torch.no_grad()
def responsibility_blocks(theta, window_ids, means, log_stds, mixing_logits, kind, temperature):
    """Yield ``(start, end, log_phi)`` blocks of :func:`chunk_elements` // K weights covering all weights."""
    log_mix = F.log_softmax(mixing_logits, dim=-1)
    for a, b in _chunk_ranges(theta.numel(), means.shape[1], theta.device):
        q = _log_density_rows(theta[a:b], window_ids[a:b].long(), means, log_stds, log_mix)
        yield a, b, log_responsibilities(q, kind, temperature)


@torch.no_grad()
def certified_levels(theta, window_ids, means, log_stds, mixing_logits, kind, temperature):
    """(k* uint8 within the window, certified bool), both (T,), for flat weights; k* is argmax_k φ_k
    where certified (:mod:`sqs_core.onehot`) and undefined elsewhere."""
    log_mix = F.log_softmax(mixing_logits, dim=-1)
    table = bin_table(theta, window_ids, means, log_stds, log_mix, kind, temperature)
    kstar = torch.empty(theta.shape, dtype=torch.uint8, device=theta.device)
    certified = torch.empty(theta.shape, dtype=torch.bool, device=theta.device)
    for a, b in _chunk_ranges(theta.numel(), 1, theta.device):
        kstar[a:b], _, certified[a:b] = certify_one_hot(theta[a:b], window_ids[a:b], table)
    return kstar, certified


@torch.no_grad()
def uncertain_log_responsibilities(theta, window_ids, certified, means, log_stds, mixing_logits, kind, temperature):
    """Yield ``(flat index (n,), log φ (n, K), k* (n,))`` blocks covering the weights that are not certified,
    :func:`chunk_elements` // K at a time. k* = argmax_k log(π_k N_k(θ)): φ_k is increasing in π_k N_k for either kind,
    so this is argmax_k φ_k exactly, also where float32 φ ties (a weight far from every component, whose
    paper φ rounds to uniform: argmax of φ would take the window's first level, however far it is)."""
    log_mix = F.log_softmax(mixing_logits, dim=-1)
    step = max(1, chunk_elements(theta.device) // means.shape[1])
    for index in torch.split(flat_indices(certified, test=torch.logical_not), step):
        q = _log_density_rows(theta[index], window_ids[index].long(), means, log_stds, log_mix)
        yield index, log_responsibilities(q, kind, temperature), q.argmax(-1)


class _PosteriorMoments(torch.autograd.Function):
    """θ^avg_i = λ̃_i Σ_k φ_ik μ_k and (optionally) Var_q(θ̃_i); also k*_i = argmax_k φ_ik.

    Weights certified one-hot (:mod:`sqs_core.onehot`) cost O(1) each: θ^avg = λ̃ μ_{k*}, and their
    gradients are scattered onto μ_{k*} (and σ_{k*} for Var). The rest are evaluated on their bin's 4, 8,
    16 or (sqs_core._wide) up to 32 nearby components plus one lumped term where the paper's formula allows it
    exactly (sqs_core._nearby, its backward derived by hand; where every component is lumped, m = Σ_k μ_k / K with
    no evaluation, and where moreover the bin settles one k*, with the certified weights: sqs_core._one_hot), else
    on all K (autograd); both recomputed in backward, at the indices the forward found (kept as int32). Windows
    are handled by gathering each weight's row of (W, K) parameters.
    With ``component_kl`` the gate KL (eq. approx_elbo) at these k* is summed in the same chunk loop and
    its gradients, ∂/∂s̃ and Σ λ̃ per component, are added in the same backward loop: one autograd node
    and one T-sized ∂/∂s̃ instead of two.
    """

    @staticmethod
    def forward(ctx, theta, gate_logits, means, log_stds, mixing_logits, component_kl, mask, window_ids, *settings):
        spec, second, ranges = settings
        kl = torch.zeros((), dtype=torch.float64, device=theta.device)
        mean = torch.empty_like(theta)
        var = torch.empty_like(theta) if second else theta.new_zeros(0)
        kstar = torch.empty(theta.shape, dtype=torch.uint8, device=theta.device)
        classes = torch.empty(theta.shape, dtype=torch.uint8, device=theta.device)  # onehot.classify's
        log_mix = F.log_softmax(mixing_logits, dim=-1)
        k = means.shape[1]
        table = bin_table(theta, window_ids, means, log_stds, log_mix, spec.kind, spec.temperature, ranges)
        tables = NearbyTables.build(means, log_stds, log_mix, second) if table.any_lumpable else None
        levels = OneHotLevels.build(means, log_stds, second) if second else None
        blocks: list[tuple[int, int]] = []  # (chunk start, width) of each block of uncovered weights
        block_indices: list[torch.Tensor] = []  # its indices within the chunk, int32, kept for backward
        for a, b in _chunk_ranges(theta.numel(), 1, theta.device):
            th, wid = theta[a:b], window_ids[a:b]
            ks, m, cls = classify(th, wid, table, keep=mask[a:b])  # a pruned weight is not evaluated
            s = levels.second_moment(m, *levels.entries(wid, ks, cls)) if levels is not None else None
            for u, width in uncovered_blocks(cls, table, k, chunk_elements(theta.device), settled_inline=True):
                th_u, wid_u = th.index_select(0, u), wid.index_select(0, u).long()  # 3× faster than th[u]
                if width:
                    assert tables is not None  # a width only where the table has lumpable bins
                    flat = bin_components(table, th_u, columns_of(width))
                    evaluate = lumped_moments if width == ALL_LUMPED else nearby_moments
                    moments = evaluate(th_u, wid_u, flat, tables, spec.temperature)
                else:
                    moments = _full_levels(th_u, wid_u, means, log_stds, log_mix, spec, second)
                m_u, s_u, ks_u = moments
                m.index_copy_(0, u, m_u)  # 1.5× faster than m[u] = m_u
                ks.index_copy_(0, u, ks_u)
                if s is not None:
                    s.index_copy_(0, u, s_u)
                blocks.append((a, width))
                block_indices.append(u.int())
            scaled, _, lam = _gate_probs(gate_logits[a:b], mask[a:b], spec.gate_temperature)
            if component_kl is not None:
                ck = component_kl.reshape(-1).index_select(0, _flat_index(wid, ks, k))
                kl += _kl_terms_sum(scaled, lam, mask[a:b], ck, spec.prior_keep)
            flush_subnormals_(torch.mul(lam, m, out=mean[a:b]))  # no chunk-sized temporary to copy
            kstar[a:b] = ks
            classes[a:b] = cls
            if s is not None:
                var[a:b] = flush_subnormals_(_variance(lam, m, s, spec.spike_variance))
        saved = (theta, gate_logits, means, log_stds, mixing_logits, component_kl, mask, window_ids, kstar, classes)
        ctx.save_for_backward(*saved, *block_indices)
        ctx.spec, ctx.second, ctx.table, ctx.blocks = spec, second, table, blocks
        ctx.mark_non_differentiable(kstar)
        ctx.set_materialize_grads(False)  # see _gate_terms.materialized_grads
        return mean, var, kstar, kl.to(theta.dtype)

    @staticmethod
    @without_autocast
    def backward(ctx, grad_mean, grad_var, _grad_kstar, grad_kl):
        check_first_order()
        theta, gate_logits, means, log_stds, mixing_logits, component_kl, mask, window_ids, kstar, classes, *indices = (
            ctx.saved_tensors
        )
        blocks: dict[int, list[tuple[torch.Tensor, int]]] = {}  # chunk start: [(indices, width)] as forward found
        for (start, width), u in zip(ctx.blocks, indices, strict=True):
            blocks.setdefault(start, []).append((u.long(), width))
        spec, second, g_comp = ctx.spec, ctx.second, kl_accumulator(component_kl, grad_kl)
        grad_mean, grad_var = materialized_grads(theta, grad_mean, grad_var, second)
        leaves = [p.detach().requires_grad_() for p in (means, log_stds, mixing_logits)]
        # float64 accumulators: millions of per-weight terms are summed into W·K entries
        param_grads = [torch.zeros(p.numel(), dtype=torch.float64, device=p.device) for p in leaves]
        g_theta = torch.zeros_like(theta) if ctx.needs_input_grad[0] else None
        g_gate = torch.empty_like(gate_logits)
        nearby = TableGradients(leaves, second) if ctx.table.any_lumpable else None
        size = min(theta.numel(), chunk_elements(theta.device))
        one_hot = OneHotSums(means, log_stds, second, component_kl, g_comp is not None, size)
        for a, b in _chunk_ranges(theta.numel(), 1, theta.device):
            wid = window_ids[a:b]
            scaled, _, lam = _gate_probs(gate_logits[a:b], mask[a:b], spec.gate_temperature)
            gm, gv = grad_mean[a:b], (grad_var[a:b] if second else None)
            m, s, ck = one_hot.add(wid, kstar[a:b], classes[a:b], gm, gv, lam)
            for u, width in blocks.get(a, []):
                block = _Uncovered.gather(a, u, wid, theta[a:b], gm, gv, lam)
                if width == ALL_LUMPED:
                    assert nearby is not None
                    m_u, s_u = lumped_grads(block, nearby)
                elif width:
                    assert nearby is not None  # a width only where the table has lumpable bins
                    flat_u = bin_components(ctx.table, block.theta, width)
                    m_u, s_u = nearby_grads(g_theta, block, flat_u, nearby, spec)
                else:
                    m_u, s_u = _full_grads(param_grads, g_theta, block, leaves, spec)
                m.index_copy_(0, u, m_u)
                if s is not None:
                    s.index_copy_(0, u, s_u)
            dlam = moments_dlam(gm, gv, m, s, lam, spec.spike_variance)
            if ck is not None:  # the gate KL's ∂/∂λ̃ joins before the common factor, as the compiled kernel has it
                dlam.addcmul_(kl_dlam(scaled, ck, spec.prior_keep), grad_kl)
            dlam.mul_(lam).mul_(gate_drop(scaled))  # times λ̃(1 − λ̃)/τ', 0 where masked
            torch.div(dlam, spec.gate_temperature, out=g_gate[a:b])
        one_hot.into(param_grads, g_comp)
        if nearby is not None:
            nearby.into(param_grads)
        grads = [g.to(p.dtype).reshape(p.shape) for g, p in zip(param_grads, leaves, strict=True)]
        return g_theta, g_gate, *grads, kl_grad(component_kl, g_comp, grad_kl), None, None, None, None, None


def _full_levels(th, wid, means, log_stds, log_mix, spec, second):
    """(m, s or None, k* uint8) of uncovered weights on all K components; k* = argmax_k log(π_k N_k(θ)), which is
    argmax_k φ_k exactly, also where float32 φ ties (:func:`uncertain_log_responsibilities`)."""
    m, s, log_density = _full_moments(th, wid, means, log_stds, log_mix, spec, second)
    return m, s, log_density.argmax(-1).to(torch.uint8)


def gather(source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``source[index]`` along dim 0 for an integer index of any shape, by ``index_select``: its backward is
    ``index_add_``, ~10× faster on the CPU than the accumulating ``index_put_`` that ``source[index]``'s
    backward runs (34 against 3 ms for 100K rows of 64 into 3)."""
    return source.index_select(0, index.reshape(-1)).view(*index.shape, *source.shape[1:])


def _full_moments(th, wid, means, log_stds, log_mix, spec, second):
    """(m, s or None, q = log π_k N_k(θ)) of the full (n, K) evaluation, each weight with its window's components."""
    mu, log_std = gather(means, wid), gather(log_stds, wid)  # gathered once: q and the moments share them
    q = component_log_density(th, mu, log_std, gather(log_mix, wid))  # (n, K): row i holds window wid_i's
    phi = log_responsibilities(q, spec.kind, spec.temperature).exp()
    m = (phi * mu).sum(-1)
    s = (phi * (mu * mu + torch.exp(2 * log_std))).sum(-1) if second else None
    return m, s, q


def _full_grads(param_grads, g_theta, block: _Uncovered, leaves, spec):
    """Recompute the uncovered weights of ``block`` on all K with a graph and accumulate their gradients;
    returns their (m, s) values."""
    second, (means, log_stds, _) = block.grad_var is not None, leaves

    def evaluate(th_leaf, log_mix):
        return _full_levels(th_leaf, block.wid, means, log_stds, log_mix, spec, second)

    where, gm, gv = (block.a, block.u), block.grad_mean, block.grad_var
    return recomputed_grads(param_grads, g_theta, where, leaves, block.theta, evaluate, gm, gv, block.lam)


def recomputed_grads(param_grads, g_theta, where, leaves, th, evaluate, gm, gv, lam):
    """Recompute (m, s) = ``evaluate(θ leaf, log π)`` of some weights with a graph and accumulate the gradients
    of ∂L/∂θ^avg = ``gm`` (and ∂L/∂Var = ``gv`` or None) through θ^avg = λ̃ m, Var = λ̃ s − (λ̃ m)² + ... into
    ``param_grads`` (float64, flat) and ``g_theta`` (or None) at ``where`` = (offset, local indices);
    ``gm``, ``gv``, ``lam`` are those weights' own. Returns their (m, s or None) values."""
    th_leaf = th.detach().requires_grad_(g_theta is not None)
    with torch.enable_grad():
        m, s = evaluate(th_leaf, F.log_softmax(leaves[2], dim=-1))[:2]
    grad_m, grad_s = cotangents(gm, gv, lam, m.detach())
    outputs, grads_out = [m], [grad_m]
    if grad_s is not None:
        outputs.append(s)
        grads_out.append(grad_s)
    inputs = leaves + ([th_leaf] if g_theta is not None else [])
    grads = torch.autograd.grad(outputs, inputs, grads_out, allow_unused=True)
    for acc, g in zip(param_grads, grads[:3], strict=True):
        if g is not None:
            acc += g.reshape(-1)
    if g_theta is not None and grads[3] is not None:
        g_theta[where[0] :][where[1]] = grads[3].to(g_theta.dtype)  # index_copy_ takes int64 indices only
    return m.detach(), (s.detach() if s is not None else None)


def posterior_moments(flat, spec, second, window_ranges=None, component_kl=None):
    """Differentiable (θ^avg, Var or empty, k*, gate KL) for ``flat`` = (θ, s̃, μ, log σ, mixing logits, mask,
    window ids), the weights' tensors flat; see :class:`_PosteriorMoments`.
    ``window_ranges`` (W, 2): each window's smallest and largest θ, when the caller caches them.
    ``component_kl`` (W, K), KL(N(μ_wk, σ_wk²)‖N(0, σ_0²)): the gate KL of eq. approx_elbo (see
    :func:`sqs_core._gate_kl.gate_kl`, with ``spec.prior_keep``) is summed in the same passes over the
    weights, at the k* this forward finds, and its gradients join the same backward; None: it is 0."""
    theta, gate_logits, means, log_stds, mixing_logits, mask, window_ids = flat
    function: type[torch.autograd.Function] = _PosteriorMoments
    if spec.compiled:  # torch.compile machinery only when asked for
        from . import _dense
        from ._fused import FusedPosteriorMoments

        function = _dense.DensePosteriorMoments if _dense.dense_route(theta.device) else FusedPosteriorMoments
    return function.apply(
        theta, gate_logits, means, log_stds, mixing_logits, component_kl, mask, window_ids, spec, second, window_ranges
    )
