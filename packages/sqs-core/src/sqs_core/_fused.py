"""The per-weight passes of a training step as ``torch.compile``'d kernels (``SQSConfig.compile_kernels``).

:mod:`sqs_core.chunked` spends a small-batch training step mostly in elementwise passes over all T
weights: λ̃ = sigmoid(s̃/τ') (eq. lambda-prime), the one-hot certificate (:mod:`sqs_core.onehot`),
θ^avg = λ̃ μ_k* and Var_q, their gradients, and the gate KL (eq. approx_elbo) with its gradients, about
25 passes each reading and writing T numbers. Here each group is one kernel fused by inductor:

* moments forward: gate, certificate lookup, θ^avg, k* (and Var) and the float64 gate-KL sum (the KL is
  summed in the same pass, chunked._PosteriorMoments): one kernel over all T weights; the B·K bounds of the
  certificate's bin table (onehot._bin_bounds): one kernel;
* moments backward: gate, one-hot gradients, the gate KL's gradients, ∂/∂s̃: one kernel per chunk of
  CHUNK_ELEMENTS weights;
* the weights the certificate does not cover (sqs_core._fused_uncovered): in forward, a block of weights in
  lumpable bins is one kernel that gathers its inputs, looks up its bins' NEARBY components and evaluates
  φ with the loop over components unrolled; the other uncovered weights, φ on all K with the components
  along the first dimension so that the reductions over k vectorise along the weights. Backward recomputes
  both from eagerly gathered columns, values and gradients by AOTAutograd;
* the gate KL on its own (sqs_core._gate_kl, when a forward's KL is not at hand): one float64 reduction
  over all T weights; its backward one kernel per chunk.

What stays eager: finding the uncovered weights (``nonzero``), gathering their rows of the (W, K)
parameters in backward (so the gradients reach the parameters through the deterministic backward of
indexing), the table's ``topk``, and the float64 ``index_add_`` that sums per-weight gradients into the
(W, K) parameters (compiled, it becomes atomic adds whose order, hence result, varies between runs with
several threads). The backward works in chunks so that its float64 temporaries stay O(CHUNK_ELEMENTS).

Each kernel is compiled on its first call (``dynamic=True``: one graph for every size, chunk and K;
floats travel as 0-d tensors so no value triggers a recompile). Importing this module compiles nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ._fused_uncovered import _full_columns, _nearby_forward, _nearby_inputs, _nearby_vjp
from ._index_add import index_add_all
from .chunked import (
    _chunk_ranges,
    _gate_probs,
    _uncovered_chunks,
    kl_accumulator,
    kl_grad,
    recomputed_grads,
)
from .mixture import HALF_LOG_2PI
from .onehot import _bin_bounds, bin_table

__all__ = ["KERNELS", "FusedPosteriorMoments", "gate_kl_chunk_grads", "gate_kl_total"]

log = logging.getLogger(__name__)


class _Kernel:
    """``fn`` compiled with inductor on its first call; ``calls`` counts the calls (tests check it)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.compiled: Callable[..., Any] | None = None
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if args[0].shape[0] < 2:  # dynamic shapes still specialise sizes 0 and 1: a graph each; not worth it
            return self.fn(*args)
        args = tuple(_unviewed(a) for a in args)
        if self.compiled is not None:
            return self.compiled(*args)
        log.info("compiling %s with torch.compile (once per process; takes seconds)", self.fn.__name__)
        self.compiled = torch.compile(self.fn, dynamic=True, fullgraph=True)
        try:
            return self.compiled(*args)
        except Exception as exc:
            self.compiled = None
            raise RuntimeError(
                f"SQSConfig.compile_kernels: torch.compile failed on {self.fn.__name__} ({type(exc).__name__}); "
                "inductor needs a working C++ compiler on CPU. Set compile_kernels=False to train eagerly."
            ) from exc


def _unviewed(value: Any) -> Any:
    """A view (say ``conv.weight.reshape(-1)[a:b]``) as a plain tensor when no gradient must flow through it:
    dynamo guards on a view's base's shape, which would recompile the kernels for every layer shape."""
    viewed = isinstance(value, torch.Tensor) and value._base is not None
    return value.detach() if viewed and not (torch.is_grad_enabled() and value.requires_grad) else value


def _scalar(value: float) -> torch.Tensor:
    """A 0-d float64 tensor: a kernel input whose value is not baked into the compiled graph."""
    return torch.tensor(value, dtype=torch.float64)


def _flat(window_ids, kstar, k):
    """w·K + k*: the index of each weight's component in the flattened (W, K) parameters (int32 suffices)."""
    return window_ids.int() * k + kstar.int()


def _certify(theta, window_ids, mean_radius, owner, best, low, inv_width):
    """(k*, μ_{k*}, certified as uint8 0/1) of onehot.certify_one_hot: one bin lookup and one comparison
    per weight. uint8, not bool: inductor stores a float comparison's mask as bool several times slower."""
    b = ((theta - low) * inv_width).long().clamp(0, owner.shape[0] - 1)
    mean = mean_radius[:, 0][b]
    within = ((theta - mean).abs() <= mean_radius[:, 1][b]).int()
    return best[b], mean, (within * (owner[b] == window_ids).int()).to(torch.uint8)  # one window: 0 == 0


def _moments_first(
    theta, gate_logits, mask, window_ids, mean_radius, owner, best, low, inv_width, tau, k, kl_table, log_keep, log_drop
):
    """(θ^avg = λ̃ μ_{k*}, k*, certified, gate KL or None) of every weight, as if every weight were certified;
    the gate KL (:func:`_kl_sum`) when ``kl_table`` (flat component KLs) is given."""
    kstar, mean, certified = _certify(theta, window_ids, mean_radius, owner, best, low, inv_width)
    kl = (
        None
        if kl_table is None
        else _kl_sum(gate_logits, mask, _flat(window_ids, kstar, k), kl_table, tau, log_keep, log_drop)
    )
    return _gate_probs(gate_logits, mask, tau)[2] * mean, kstar, certified, kl


def _moments_second(
    theta,
    gate_logits,
    mask,
    window_ids,
    mean_radius,
    owner,
    best,
    low,
    inv_width,
    tau,
    k,
    kl_table,
    log_keep,
    log_drop,
    log_stds,
    spike_var,
):
    """(θ^avg, Var_q = λ̃ (μ² + σ²) − (λ̃ μ)² + (1 − λ̃) σ_0², k*, certified, gate KL or None) at k*
    (flat ``log_stds``), as :func:`_moments_first`."""
    kstar, m, certified = _certify(theta, window_ids, mean_radius, owner, best, low, inv_width)
    lam = _gate_probs(gate_logits, mask, tau)[2]
    flat = _flat(window_ids, kstar, k)
    s = m * m + torch.exp(2 * log_stds[flat])
    kl = None if kl_table is None else _kl_sum(gate_logits, mask, flat, kl_table, tau, log_keep, log_drop)
    return lam * m, (lam * s - (lam * m) ** 2 + (1 - lam) * spike_var).clamp_min(0), kstar, certified, kl


def _one_hot_backward(
    gate_logits,
    mask,
    window_ids,
    kstar,
    certified,
    means,
    log_stds,
    grad_mean,
    grad_var,
    tau,
    k,
    spike_var,
    kl_table,
    prior_logit,
    grad_kl,
):
    """(flat index w·K + k*, ∂/∂μ_{k*} (float64), ∂/∂log σ_{k*} (float64) or None, λ̃ (float64) or None, ∂/∂s̃)
    of one chunk, as chunked._one_hot_grads and the ∂/∂s̃ of _PosteriorMoments.backward compute them; the
    moments' part of ∂/∂s̃ of weights that are not certified is left out (the caller adds it).
    ``grad_var`` None: the plug-in (no Var). ``kl_table`` (flat component KLs): the gate KL's gradients with
    incoming ``grad_kl`` are included, as _gate_kl_backward's; ``prior_logit`` None: no Bernoulli term."""
    scaled, lam_raw, lam = _gate_probs(gate_logits, mask, tau)
    flat = _flat(window_ids, kstar, k)
    m = means[flat]
    on = torch.where(certified, lam, 0.0)
    dm = grad_mean * on
    d_log_std = None
    dlam = grad_mean * m
    if grad_var is not None:
        var = torch.exp(2 * log_stds[flat])
        gv = grad_var * on
        dm = dm + 2 * gv * m * (1 - lam)
        d_log_std = (2 * gv * var).double()
        dlam = dlam + grad_var * (m * m + var - 2 * lam * m * m - spike_var)
    dlam = torch.where(certified, dlam, 0.0)
    lam64 = None
    if kl_table is not None:
        dlam = dlam + grad_kl * _dkl_dlam(scaled, kl_table[flat], prior_logit)
        lam64 = lam.double()
    return flat, dm.double(), d_log_std, lam64, dlam * lam * (1 - lam_raw) / tau


def _gate_kl_sum(gate_logits, mask, window_ids, kstar, component_kl, tau, k, log_keep, log_drop):
    """:func:`_kl_sum` at the components w·K + k*."""
    return _kl_sum(gate_logits, mask, _flat(window_ids, kstar, k), component_kl, tau, log_keep, log_drop)


def _kl_sum(gate_logits, mask, flat, component_kl, tau, log_keep, log_drop):
    """Σ_i λ̃_i KL_{flat_i} + Σ_i KL(Bern(λ̃_i)‖Bern(λ)) in float64 (``log_keep`` None: no Bernoulli term);
    KL(Bern) as mixture.bernoulli_kl with log λ, log(1 − λ) given; a masked gate's term is −log(1 − λ)."""
    scaled = gate_logits / tau
    e = torch.exp(-scaled.abs())  # softplus(±ℓ) = relu(±ℓ) + log1p(e^{-|ℓ|}), sigmoid(ℓ) from the same e
    q = torch.where(scaled >= 0, 1.0, e) / (1 + e)
    total = (torch.where(mask, q, 0.0) * component_kl[flat]).sum(dtype=torch.float64)
    if log_keep is None:
        return total
    soft = torch.log1p(e)
    log_q, log_not_q = -(torch.relu(-scaled) + soft), -(torch.relu(scaled) + soft)
    bern = q * (log_q - log_keep) + (1 - q) * (log_not_q - log_drop)
    return total + torch.where(mask, bern, -log_drop).sum(dtype=torch.float64)


def _gate_kl_backward(gate_logits, mask, window_ids, kstar, component_kl, tau, k, prior_logit, grad):
    """(flat index, λ̃ as float64, ∂KL/∂s̃) of one chunk, as chunked._gate_kl_chunk_grads (``prior_logit``
    None: no Bernoulli term)."""
    scaled, lam_raw, lam = _gate_probs(gate_logits, mask, tau)
    flat = _flat(window_ids, kstar, k)
    return flat, lam.double(), _dkl_dlam(scaled, component_kl[flat], prior_logit) * lam * (1 - lam_raw) * (grad / tau)


def _dkl_dlam(scaled, kl_at, prior_logit):
    """∂/∂λ̃ of one gate's KL terms: KL_{w,k*} + (ℓ − logit λ) (``prior_logit`` None: no Bernoulli term)."""
    return kl_at if prior_logit is None else kl_at + (scaled - prior_logit)


KERNELS = {
    fn.__name__: _Kernel(fn)
    for fn in (
        _bin_bounds,
        _moments_first,
        _moments_second,
        _one_hot_backward,
        _gate_kl_sum,
        _gate_kl_backward,
        _full_columns,
        _nearby_forward,
        _nearby_inputs,
        _nearby_vjp,
    )
}


def _full_eval(th, wid, means, log_stds, log_mix, spec, second):
    """(m, s or None, k* uint8) of uncovered weights on all K: chunked._full_moments with the (K, n) evaluation
    compiled; the gathers stay eager, so that in backward the gradients reach the (W, K) parameters through
    their deterministic eager backward."""
    columns = [p.t().index_select(1, wid) for p in (means, log_stds, log_mix)]  # (K, n)
    m, s, best = KERNELS["_full_columns"](th, *columns, _scalar(spec.temperature), spec.kind, second)
    return m, s, best.to(torch.uint8)


def _nearby_tables(means, log_stds, log_mix):
    """μ, 1/σ and log π − log σ − ½ log 2π per component, (W, K) each: what the nearby evaluation gathers."""
    return means, torch.exp(-log_stds), log_mix - log_stds - HALF_LOG_2PI


def _level_sq_totals(means, log_stds):
    """Σ_k (μ_k² + σ_k²) per window, (W,)."""
    return (means * means + torch.exp(2 * log_stds)).sum(-1)


def _nearby_block(u, bins, inputs, table, log_mix, spec, second, kl_table):
    """:func:`_nearby_forward` for one block: (θ^avg, Var or None, k*, KL correction or None)."""
    theta, gate_logits, means, log_stds, mask, window_ids, kstar = inputs
    k = means.shape[1]
    tables = [t.detach().reshape(-1) for t in _nearby_tables(means, log_stds, log_mix)]
    totals = (means.detach().sum(-1), _level_sq_totals(means, log_stds).detach() if second else None)
    lumped = float(k - table.nearby.shape[1])
    scalars = (
        _scalar(lumped),
        _scalar(spec.temperature),
        _scalar(spec.gate_temperature),
        k,
        _scalar(spec.spike_variance),
    )
    args = (theta, gate_logits, mask, window_ids, kstar, table.nearby, tables, totals, scalars, kl_table)
    return KERNELS["_nearby_forward"](u, bins, *args)


def _certified_moments(theta, gate_logits, mask, window_ids, log_stds, table, spec, second, component_kl):
    """(θ^avg, Var or empty, k*, certified, gate KL or None) of every weight as if its φ were one-hot at the
    certificate's k* (right for the certified weights; the caller corrects the others)."""
    bins = (table.mean_radius, table.owner, table.best, _scalar(table.low), _scalar(table.inv_width))
    kl = (None, None, None) if component_kl is None else (component_kl.reshape(-1), *_prior_logs(spec.prior_keep))
    args = (*bins, _scalar(spec.gate_temperature), log_stds.shape[1], *kl)
    if second:
        args = (*args, log_stds.detach().reshape(-1), _scalar(spec.spike_variance))
        mean, var, kstar, certified, total = KERNELS["_moments_second"](theta, gate_logits, mask, window_ids, *args)
    else:
        mean, kstar, certified, total = KERNELS["_moments_first"](theta, gate_logits, mask, window_ids, *args)
        var = theta.new_zeros(0)
    return mean, var, kstar, certified.view(torch.bool), total  # certified: 0/1 bytes


def _prior_logs(prior_keep):
    """(log λ, log(1 − λ)) as kernel inputs, or (None, None) without a Bernoulli term (Gaussian prior)."""
    return (None, None) if prior_keep is None else (_scalar(math.log(prior_keep)), _scalar(math.log1p(-prior_keep)))


def _prior_logit(prior_keep):
    """logit λ as a kernel input, or None without a Bernoulli term."""
    return None if prior_keep is None else _scalar(math.log(prior_keep) - math.log1p(-prior_keep))


def _one_hot_gradients(param_grads, g_comp, gate_logits, mask, window_ids, kstar, certified, means, log_stds, *rest):
    """Accumulate the certified weights' gradients into ``param_grads`` (float64, as chunked does) and, with
    ``g_comp``, every weight's λ̃ into it (the gate KL's); return ∂/∂s̃ of every weight, without the moments'
    part for the uncovered ones, chunk by chunk (float64 temporaries stay small)."""
    component_kl, gm, gv, grad_kl, spec = rest
    g_gate = torch.empty_like(gate_logits)
    consts = (means.detach().reshape(-1), log_stds.detach().reshape(-1))
    scalars = (_scalar(spec.gate_temperature), means.shape[1], _scalar(spec.spike_variance))
    kl = (None, None, None)
    if g_comp is not None:
        kl = (component_kl.detach().reshape(-1), _prior_logit(spec.prior_keep), grad_kl.detach())
    for a, b in _chunk_ranges(gate_logits.numel(), 1):
        chunk = (gate_logits[a:b], mask[a:b], window_ids[a:b], kstar[a:b], certified[a:b], *consts, gm[a:b])
        flat, d_mean, d_log_std, lam, g_gate[a:b] = KERNELS["_one_hot_backward"](
            *chunk, (gv[a:b] if gv is not None else None), *scalars, *kl
        )
        sums = [(param_grads[0], d_mean), (param_grads[1], d_log_std), (g_comp, lam)]
        index_add_all([(acc, flat, source) for acc, source in sums if source is not None])
    return g_gate


def _full_block(u, inputs, log_mix, spec, second, kl_table):
    """θ^avg, Var or None, k* and the gate-KL correction (or None) of uncovered weights ``u`` on all K."""
    theta, gate_logits, means, log_stds, mask, window_ids, kstar = inputs
    wid = window_ids[u].long()
    m, s, levels = _full_eval(theta[u], wid, means, log_stds, log_mix, spec, second)
    lam = _gate_probs(gate_logits[u], mask[u], spec.gate_temperature)[2]
    var = None if s is None else (lam * s - (lam * m) ** 2 + (1 - lam) * spec.spike_variance).clamp_min(0)
    correction = None
    if kl_table is not None:  # as in _nearby_forward
        k = means.shape[1]
        diff = kl_table.index_select(0, wid * k + levels.long()) - kl_table.index_select(0, wid * k + kstar[u].long())
        correction = (lam * diff).sum(dtype=torch.float64)
    return lam * m, var, levels, correction


def _unpack_blocks(tensors, near):
    """[(u, bins or None)] from the flat saved tensors: two per nearby block, one per full block."""
    blocks, items = [], iter(tensors)
    for is_near in near:
        u = next(items)
        blocks.append((u, next(items) if is_near else None))
    return blocks


def _block_gradients(param_grads, g_theta, g_gate, u, bins, inputs, leaves, nearby_table, spec):
    """Recompute one block of uncovered weights (``bins`` None: on all K) with a graph, accumulate their
    parameter gradients and add the moments' part of their ∂/∂s̃ to ``g_gate``."""
    if bins is not None:
        return _nearby_gradients(param_grads, g_theta, g_gate, u, bins, inputs, leaves, nearby_table, spec)
    theta, gate_logits, mask, window_ids, grad_mean, grad_var = inputs
    second, tau = grad_var is not None, spec.gate_temperature
    _, lam_raw, lam = _gate_probs(gate_logits[u], mask[u], tau)
    th, wid, gm, gv = theta[u], window_ids[u].long(), grad_mean[u], (grad_var[u] if second else None)

    def evaluate(th_leaf, log_mix):
        return _full_eval(th_leaf, wid, leaves[0], leaves[1], log_mix, spec, second)

    m, s = recomputed_grads(param_grads, g_theta, (0, u), leaves, th, evaluate, gm, gv, lam)
    dlam = gm * m if gv is None else gm * m + gv * (s - 2 * lam * m * m - spec.spike_variance)
    g_gate.index_add_(0, u, dlam * lam * (1 - lam_raw) / tau)


def _nearby_gradients(param_grads, g_theta, g_gate, u, bins, inputs, leaves, nearby_table, spec):
    """:func:`_block_gradients` of a block in lumpable bins: its inputs gathered by one kernel, its columns of
    the (W, K) tables by ``index_select``, values and gradients by one :func:`_nearby_vjp` kernel; the column
    gradients are summed into the tables by ``index_add_`` and taken through the small graph
    tables ← (μ, log σ, mixing logits) by autograd."""
    means, log_stds, mixing_logits = leaves
    second, tau = inputs[-1] is not None, _scalar(spec.gate_temperature)
    with torch.enable_grad():
        tables = _nearby_tables(means, log_stds, F.log_softmax(mixing_logits, dim=-1))
        totals = [means.sum(-1)] + ([_level_sq_totals(means, log_stds)] if second else [])
    th, wid, lam, lam_raw, gm, gv, nearby = KERNELS["_nearby_inputs"](u, bins, *inputs, nearby_table, tau)
    flat = nearby.reshape(-1)
    columns = [t.detach().reshape(-1).index_select(0, flat).view(nearby.shape) for t in tables]
    per_weight = [t.detach().index_select(0, wid) for t in totals] + ([] if second else [None])
    lumped = _scalar(float(means.shape[1] - nearby.shape[0]))
    scalars = (lumped, _scalar(spec.temperature), tau, _scalar(spec.spike_variance))
    g_gate_u, g_th, *column_grads = KERNELS["_nearby_vjp"](th, *columns, *per_weight, gm, gv, lam, lam_raw, scalars)
    outputs = [*tables, *totals]
    grads_out = [t.new_zeros(t.shape) for t in outputs]
    jobs = [(g.view(-1), flat, c.reshape(-1)) for g, c in zip(grads_out[:3], column_grads[:3], strict=True)]
    index_add_all(jobs + [(g, wid, c) for g, c in zip(grads_out[3:], column_grads[3:], strict=True)])
    for acc, g in zip(param_grads, torch.autograd.grad(outputs, leaves, grads_out, allow_unused=True), strict=True):
        if g is not None:
            acc += g.reshape(-1)
    if g_theta is not None:
        g_theta.index_copy_(0, u, g_th.to(g_theta.dtype))
    g_gate.index_add_(0, u, g_gate_u)


class FusedPosteriorMoments(torch.autograd.Function):
    """chunked._PosteriorMoments with the per-weight passes fused: the same (θ^avg, Var or empty, k*, gate KL).
    The uncovered weights' indices (and bins) are kept from forward to backward as saved tensors (16 bytes each)
    rather than found again."""

    @staticmethod
    def forward(ctx, theta, gate_logits, means, log_stds, mixing_logits, component_kl, mask, window_ids, *settings):
        spec, second, ranges = settings
        log_mix = F.log_softmax(mixing_logits, dim=-1)
        args = (theta, window_ids, means, log_stds, log_mix, spec.kind, spec.temperature, ranges)
        table = bin_table(*args, bounds=KERNELS["_bin_bounds"])
        mean, var, kstar, certified, kl = _certified_moments(
            theta, gate_logits, mask, window_ids, log_stds, table, spec, second, component_kl
        )
        blocks = [b for b in _uncovered_chunks(theta, window_ids, certified, table, means.shape[1]) if b[0].numel()]
        inputs = (theta, gate_logits, means, log_stds, mask, window_ids, kstar)
        kl_table = None if component_kl is None else component_kl.detach().reshape(-1)
        for u, bins in blocks:
            if bins is not None:
                mean_u, var_u, levels, correction = _nearby_block(
                    u, bins, inputs, table, log_mix, spec, second, kl_table
                )
            else:
                mean_u, var_u, levels, correction = _full_block(u, inputs, log_mix, spec, second, kl_table)
            if correction is not None:
                kl = kl + correction
            kstar[u], mean[u] = levels, mean_u
            if var_u is not None:
                var[u] = var_u
        saved = (theta, gate_logits, means, log_stds, mixing_logits, component_kl, mask, window_ids, kstar, certified)
        # the blocks' indices and bins as saved tensors too, so that autograd frees them after backward
        ctx.save_for_backward(*saved, table.nearby, *(t for block in blocks for t in block if t is not None))
        ctx.spec, ctx.second, ctx.near = spec, second, [bins is not None for _, bins in blocks]
        ctx.mark_non_differentiable(kstar)
        return mean, var, kstar, (theta.new_zeros(()) if kl is None else kl.to(theta.dtype))

    @staticmethod
    def backward(ctx, grad_mean, grad_var, _grad_kstar, grad_kl):
        theta, gate_logits, means, log_stds, mixing_logits, component_kl, mask, window_ids, kstar, certified, *rest = (
            ctx.saved_tensors
        )
        nearby, blocks = rest[0], _unpack_blocks(rest[1:], ctx.near)
        spec, gv, g_comp = ctx.spec, (grad_var if ctx.second else None), kl_accumulator(component_kl, grad_kl)
        leaves = [p.detach().requires_grad_() for p in (means, log_stds, mixing_logits)]
        param_grads = [torch.zeros(p.numel(), dtype=torch.float64, device=p.device) for p in leaves]
        g_theta = torch.zeros_like(theta) if ctx.needs_input_grad[0] else None
        one_hot = (gate_logits, mask, window_ids, kstar, certified, means, log_stds, component_kl, grad_mean, gv)
        g_gate = _one_hot_gradients(param_grads, g_comp, *one_hot, grad_kl, spec)
        inputs = (theta, gate_logits, mask, window_ids, grad_mean, gv)
        for u, bins in blocks:  # the uncovered weights: recomputed with a graph, as in chunked
            _block_gradients(param_grads, g_theta, g_gate, u, bins, inputs, leaves, nearby, spec)
        grads = [g.to(p.dtype).reshape(p.shape) for g, p in zip(param_grads, leaves, strict=True)]
        return g_theta, g_gate, *grads, kl_grad(component_kl, g_comp, grad_kl), None, None, None, None, None


def gate_kl_total(gate_logits, component_kl, mask, window_ids, kstar, gate_temperature, prior_keep):
    """chunked._gate_kl_total as one kernel over all T weights (float64 sum)."""
    args = (component_kl.reshape(-1), _scalar(gate_temperature), component_kl.shape[1], *_prior_logs(prior_keep))
    return KERNELS["_gate_kl_sum"](gate_logits, mask, window_ids, kstar, *args)


def gate_kl_chunk_grads(gate_logits, component_kl, mask, window_ids, kstar, tau, prior_keep, grad):
    """chunked._gate_kl_chunk_grads as one kernel."""
    args = (component_kl.reshape(-1), _scalar(tau), component_kl.shape[1], _prior_logit(prior_keep), grad)
    return KERNELS["_gate_kl_backward"](gate_logits, mask, window_ids, kstar, *args)
