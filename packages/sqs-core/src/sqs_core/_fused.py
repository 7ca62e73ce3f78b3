"""The per-weight passes of a training step as ``torch.compile``'d kernels (``SQSConfig.compile_kernels``).

:mod:`sqs_core.chunked` spends a small-batch training step mostly in elementwise passes over all T
weights: λ̃ = sigmoid(s̃/τ') (eq. lambda-prime), the one-hot certificate (:mod:`sqs_core.onehot`),
θ^avg = λ̃ μ_k* and Var_q, their gradients, and the gate KL (eq. approx_elbo) with its gradients, about
25 passes each reading and writing T numbers. Here each group is one kernel fused by inductor:

* moments forward: gate, certificate lookup, θ^avg, k* (and Var) and the float64 gate-KL sum (the KL is
  summed in the same pass, chunked._PosteriorMoments): one kernel over all T weights; the B·K bounds of the
  certificate's bin table (sqs_core._bounds): one kernel;
* moments backward: gate, one-hot gradients, the gate KL's gradients, ∂/∂s̃: one kernel per chunk of
  chunked.chunk_elements weights;
* the weights the certificate does not cover (sqs_core._fused_uncovered): in forward, a block of weights in
  lumpable bins is one kernel that gathers its inputs, looks up its bins' 4 to 32 nearby components and evaluates
  φ with the loop over components unrolled (a block of weights whose every component is lumped: m = Σ_k μ_k / K,
  one kernel forward and one backward); the other uncovered weights, φ on all K with the components
  along the first dimension so that the reductions over k vectorise along the weights. Backward recomputes
  both: a nearby block by one input kernel and one ``torch.func.vjp`` kernel that gathers its own columns of
  the (W, K) tables, a full block from eagerly gathered columns, values and gradients by AOTAutograd;
* the gate KL on its own (sqs_core._gate_kl, when a forward's KL is not at hand): one float64 reduction
  over all T weights; its backward one kernel per chunk.

What stays eager: finding the uncovered weights (``nonzero`` over the class onehot.classify gives each,
once over all weights and once per width over the uncovered ones), gathering their rows of the (W, K)
parameters in backward (so the gradients reach the parameters through the deterministic backward of
indexing), the table's ``topk``, and the float64 ``index_add_`` that sums per-weight gradients into the
(W, K) parameters (compiled, it becomes atomic adds whose order, hence result, varies between runs with
several threads). The backward works in chunks so that its float64 temporaries stay O(chunk_elements).

Each kernel is compiled on its first call (``dynamic=True``: one graph for every size, chunk and K;
floats travel as 0-d tensors so no value triggers a recompile). Importing this module compiles nothing.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._autocast import without_autocast
from ._bounds import _bin_bounds
from ._compiled import _Kernel, _scalar
from ._fused_uncovered import KERNELS as UNCOVERED_KERNELS
from ._fused_uncovered import bin_scalars, block_gradients, full_block, lumped_gradients, nearby_block, unpack_blocks
from ._gate_terms import (
    GATE_FLOOR,
    _gate_probs,
    _variance,
    check_first_order,
    gate_drop,
    gate_logit_grad,
    kl_accumulator,
    kl_grad,
    materialized_grads,
)
from ._index_add import index_add_all
from ._nearby import NearbyTables, TableGradients
from ._one_hot import _flat_index, one_hot_workspace
from ._settled import fold_settled, level_tables
from .chunked import _chunk_ranges, chunk_elements
from .mixture import bernoulli_kl_terms, exp_floor, flush_subnormals, prior_logit
from .onehot import ALL_LUMPED, CERTIFIED, bin_of, bin_table, columns_of, uncovered_blocks

__all__ = ["KERNELS", "FusedPosteriorMoments", "gate_kl_chunk_grads", "gate_kl_total"]


def _certify(theta, window_ids, mask, table):
    """(k*, μ_{k*}, class) of onehot.classify: one bin lookup and one comparison per weight, a pruned weight
    (``mask`` False: λ̃ = 0, so θ^avg = 0 and no gradient whatever φ) classed certified, at its bin's best
    component (:func:`sqs_core.onehot.classify` with ``keep``). ``table``: the
    BinTable's (mean_radius, codes, low, inv_width), the floats as 0-d tensors; the bin's best component,
    near width and owner come from one int32 code (three gathers instead of five: 30% off this part of the
    kernel on an AVX2 machine). The class as arithmetic on int32: inductor stores a float comparison's mask
    as bool several times slower."""
    mean_radius, codes, low, inv_width = table
    b = bin_of(theta, low, inv_width, mean_radius.shape[1])
    mean = mean_radius[0][b]
    within = ((theta - mean).abs() <= mean_radius[1][b]).int()
    code = codes[b]
    owns = ((code >> 16) == window_ids.int()).int()  # one window: 0 == 0
    certified = within * owns | (1 - mask.int())
    classes = certified * CERTIFIED + (1 - certified) * owns * ((code >> 8) & 255)
    return (code & 255).to(torch.uint8), mean, classes.to(torch.uint8)


def _moments_first(theta, gate_logits, mask, window_ids, table, tau, k, kl_table, log_keep, log_drop):
    """(θ^avg = λ̃ μ_{k*}, k*, class, gate KL or None) of every weight, as if every weight were certified;
    the gate KL (:func:`_kl_sum`) when ``kl_table`` (flat component KLs) is given."""
    kstar, mean, classes = _certify(theta, window_ids, mask, table)
    lam, kl = _gate_and_kl(gate_logits, mask, window_ids, kstar, tau, k, kl_table, log_keep, log_drop)
    return flush_subnormals(lam * mean), kstar, classes, kl


def _moments_second(
    theta,
    gate_logits,
    mask,
    window_ids,
    table,
    tau,
    k,
    kl_table,
    log_keep,
    log_drop,
    spreads,
    spike_var,
):
    """(θ^avg, Var_q = λ̃ s − (λ̃ m)² + (1 − λ̃) σ_0², k*, class, gate KL or None) at k*, as :func:`_moments_first`:
    s = μ² + σ² (``spreads``: sqs_core._settled.level_tables' second table), or a settled weight's window's s."""
    kstar, m, classes = _certify(theta, window_ids, mask, table)
    lam, kl = _gate_and_kl(gate_logits, mask, window_ids, kstar, tau, k, kl_table, log_keep, log_drop)
    settled = _settled(classes.int())
    s = m * m * (1 - settled) + spreads[_flat_index(window_ids, kstar, k) + settled * (spreads.shape[0] // 2)]
    return flush_subnormals(lam * m), flush_subnormals(_variance(lam, m, s, spike_var)), kstar, classes, kl


def _settled(classes):
    """1 where the (int32) class is onehot.LUMPED_SETTLED (254), else 0, by arithmetic (see :func:`_uint8`)."""
    return ((classes + 2) >> 8) - ((classes + 1) >> 8)


def _gate_and_kl(gate_logits, mask, window_ids, kstar, tau, k, kl_table, log_keep, log_drop):
    """(λ̃ as _gate_terms._gate_probs gives it, masked and floored; the gate KL at k* or None without ``kl_table``):
    with the KL, λ̃ comes from the KL's own e^{−|ℓ|} (:func:`_gate_terms`): one exp per weight, not two."""
    if kl_table is None:
        return _gate_probs(gate_logits, mask, tau)[2], None
    terms = _gate_terms(gate_logits, mask, tau)
    flat = _flat_index(window_ids, kstar, k)
    return terms[2], _kl_sum(gate_logits, mask, flat, kl_table, tau, log_keep, log_drop, terms)


def _one_hot_backward(
    gate_logits,
    mask,
    window_ids,
    kstar,
    classes,
    means,
    spreads,
    grad_mean,
    grad_var,
    tau,
    k,
    spike_var,
    kl_table,
    prior_logit,
    grad_kl,
    out_gate,
    workspace,
):
    """One chunk of weights' gradients, as _one_hot.one_hot_grads and the ∂/∂s̃ of _PosteriorMoments.backward
    compute them, written in place (nothing is returned): ∂/∂s̃ into ``out_gate`` (the chunk's slice of the
    s̃ gradient; the moments' part of weights that are neither certified nor settled is left out: the caller adds
    it), and into ``workspace`` (_one_hot.one_hot_workspace, the chunk's size) the entry w·K + k* + W·K·settled of
    sqs_core._settled.level_tables (``means``, ``spreads``; int64), ∂/∂μ_{k*} (settled: ∂L/∂m) (float64),
    ∂/∂log σ_{k*} (settled: ∂L/∂s) (float64; None without Var) and λ̃ (float64; None without KL).
    ``grad_var`` None: the plug-in (no Var). ``kl_table`` (flat component KLs): the gate KL's gradients with
    incoming ``grad_kl`` are included, as _gate_kl_backward's; ``prior_logit`` None: no Bernoulli term."""
    scaled, _, lam = _gate_probs(gate_logits, mask, tau)
    flat = _flat_index(window_ids, kstar, k)
    certified = (classes.int() + 1) >> 8  # 1 where classes == CERTIFIED (255), else 0: arithmetic, see _uint8
    settled = _settled(classes.int())
    entry = (flat + settled * (means.shape[0] // 2)).to(torch.int64)
    m = means[entry]
    on = lam * (certified + settled)
    dm = grad_mean * on
    d_log_std = None
    dlam = grad_mean * m
    if grad_var is not None:
        spread = spreads[entry]
        gv = grad_var * on
        dm = dm + 2 * gv * m * (1 - settled - lam)  # certified: G_m + 2 μ G_s; settled: G_m
        d_log_std = gv * (2 * spread * (1 - settled) + settled)  # certified: 2 σ² G_s; settled: G_s
        dlam = dlam + grad_var * (m * m * (1 - settled) + spread - 2 * lam * m * m - spike_var)
    dlam = dlam * (certified + settled)
    if kl_table is not None:
        dlam = dlam + grad_kl * _dkl_dlam(scaled, kl_table[flat], prior_logit)
    out_flat, out_mean, out_log_std, out_lam = workspace
    out_flat.copy_(entry)
    out_mean.copy_(dm)
    if d_log_std is not None:
        out_log_std.copy_(d_log_std)
    if kl_table is not None:
        out_lam.copy_(lam)
    out_gate.copy_(gate_logit_grad(dlam, lam, gate_drop(scaled), tau))


def _gate_kl_sum(gate_logits, mask, window_ids, kstar, component_kl, tau, k, log_keep, log_drop):
    """:func:`_kl_sum` at the components w·K + k*."""
    return _kl_sum(gate_logits, mask, _flat_index(window_ids, kstar, k), component_kl, tau, log_keep, log_drop)


def _kl_sum(gate_logits, mask, flat, component_kl, tau, log_keep, log_drop, terms=None):
    """Σ_i λ̃_i KL_{flat_i} + Σ_i KL(Bern(λ̃_i)‖Bern(λ)) in float64 (``log_keep`` None: no Bernoulli term);
    KL(Bern) by mixture.bernoulli_kl_terms with log λ, log(1 − λ) given; a masked gate's term is −log(1 − λ).
    ``terms``: :func:`_gate_terms` when the caller has them."""
    scaled, e, lam = _gate_terms(gate_logits, mask, tau) if terms is None else terms
    total = (lam * component_kl[flat]).sum(dtype=torch.float64)
    if log_keep is None:
        return total
    bern = bernoulli_kl_terms(scaled, lam, log_keep - log_drop, log_drop, tail=e)  # λ̃ masked: replaced below
    # torch.where(mask, bern, −log(1 − λ)) by arithmetic on the uint8 mask (see _uint8): the same bits
    pruned = (1 - mask.int()) * (-log_drop).to(bern.dtype)
    return total + (bern * mask + pruned).sum(dtype=torch.float64)


def _gate_terms(gate_logits, mask, tau):
    """(ℓ = s̃/τ', e^{−|ℓ|} raised to exp_floor as bernoulli_kl_terms raises it, λ̃ = sigmoid(ℓ) from that e,
    masked and floored as _gate_terms._gate_probs)."""
    scaled = gate_logits / tau
    e = torch.exp((-scaled.abs()).clamp(min=exp_floor(scaled.dtype)))
    q = torch.where(scaled >= 0, 1.0, e) / (1 + e)
    return scaled, e, torch.where(q > GATE_FLOOR, q, 0.0) * mask


def _gate_kl_backward(gate_logits, mask, window_ids, kstar, component_kl, tau, k, prior_logit, grad):
    """(flat index, λ̃ as float64, ∂KL/∂s̃) of one chunk, as _gate_kl._gate_kl_chunk_grads (``prior_logit``
    None: no Bernoulli term)."""
    scaled, _, lam = _gate_probs(gate_logits, mask, tau)
    flat = _flat_index(window_ids, kstar, k, torch.int64)
    grads = _dkl_dlam(scaled, component_kl[flat], prior_logit) * lam * gate_drop(scaled) * (grad / tau)
    return flat, lam.double(), grads


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
    )
}
KERNELS.update(UNCOVERED_KERNELS)


def _certified_moments(theta, gate_logits, mask, window_ids, params, table, spec, second, component_kl):
    """(θ^avg, Var or empty, k*, class (onehot.classify), gate KL or None) of every weight as if its φ were
    one-hot at the certificate's k* (right for the certified and settled weights; the caller corrects the others).
    ``params``: the (W, K) means and log σ."""
    bins = (table.mean_radius, table.codes, *bin_scalars(table, theta.dtype))
    kl = (None, None, None) if component_kl is None else (component_kl.reshape(-1), *_prior_logs(spec.prior_keep))
    args = (bins, _scalar(spec.gate_temperature), params[0].shape[1], *kl)
    if second:
        args = (*args, level_tables(params[0], params[1], True)[1], _scalar(spec.spike_variance))
        mean, var, kstar, classes, total = KERNELS["_moments_second"](theta, gate_logits, mask, window_ids, *args)
    else:
        mean, kstar, classes, total = KERNELS["_moments_first"](theta, gate_logits, mask, window_ids, *args)
        var = theta.new_zeros(0)
    return mean, var, kstar, classes, total


def _prior_logs(prior_keep):
    """(log λ, log(1 − λ)) as kernel inputs, or (None, None) without a Bernoulli term (Gaussian prior)."""
    return (None, None) if prior_keep is None else (_scalar(math.log(prior_keep)), _scalar(math.log1p(-prior_keep)))


def _prior_logit(prior_keep):
    """logit λ as a kernel input, or None without a Bernoulli term."""
    return None if prior_keep is None else _scalar(prior_logit(prior_keep))


def _chunk_divisor(device: torch.device) -> int:
    """How many times smaller than chunked.chunk_elements the compiled step's blocks of uncovered weights and
    its one-hot backward's chunks are on ``device``: 2 on the CPU, where their outputs (the nearby vjp's column
    gradients, the float64 workspace) set the heap's high-water mark, which glibc keeps after the step (the
    4096² layer over 40 steps: the largest heap 282 → 262 MiB, the largest peak RSS 1,122 → 1,089–1,106 MiB
    against the plain step's 745, step time unchanged: docs/method.md "Session 42"); 1 on an accelerator,
    whose chunk sets the number of launches."""
    return 2 if device.type == "cpu" else 1


def _one_hot_gradients(param_grads, g_comp, gate_logits, mask, window_ids, kstar, classes, means, log_stds, *rest):
    """Accumulate the certified and settled weights' gradients into ``param_grads`` (float64, as chunked does; the
    settled ones' per window, sqs_core._settled.fold_settled) and, with ``g_comp``, every weight's λ̃ into it (the
    gate KL's); return ∂/∂s̃ of every weight, without the moments' part for the uncovered ones, chunk by chunk
    (float64 temporaries stay small)."""
    component_kl, gm, gv, grad_kl, spec = rest
    g_gate = torch.empty_like(gate_logits)
    consts = level_tables(means, log_stds, gv is not None)
    used = (param_grads[0], param_grads[1] if gv is not None else None, g_comp)  # ∂/∂log σ: through Var only
    halves = [None if acc is None else acc.new_zeros(2 * acc.numel()) for acc in used]
    scalars = (_scalar(spec.gate_temperature), means.shape[1], _scalar(spec.spike_variance))
    kl = (None, None, None)
    if g_comp is not None:
        kl = (component_kl.detach().reshape(-1), _prior_logit(spec.prior_keep), grad_kl.detach())
    workspace: tuple = ()
    for a, b in _chunk_ranges(gate_logits.numel(), _chunk_divisor(gate_logits.device), gate_logits.device):
        if not workspace or workspace[0].numel() != b - a:
            workspace = one_hot_workspace(b - a, gv is not None, g_comp is not None, gate_logits.device)
        chunk = (gate_logits[a:b], mask[a:b], window_ids[a:b], kstar[a:b], classes[a:b], *consts, gm[a:b])
        outputs = (g_gate[a:b], workspace)
        KERNELS["_one_hot_backward"](*chunk, (gv[a:b] if gv is not None else None), *scalars, *kl, *outputs)
        flat, *sources = workspace
        sums = zip(halves, sources, strict=True)
        index_add_all([(acc, flat, source) for acc, source in sums if acc is not None and source is not None])
    fold_settled((*param_grads[:2], g_comp), halves, means, log_stds)
    return g_gate


class FusedPosteriorMoments(torch.autograd.Function):
    """chunked._PosteriorMoments with the per-weight passes fused: the same (θ^avg, Var or empty, k*, gate KL).
    The uncovered weights' indices (and, in lumpable bins, the bins the forward kernel found: 8 bytes each,
    4 on all K) are kept from forward to backward as saved tensors rather than found again."""

    @staticmethod
    def forward(ctx, theta, gate_logits, means, log_stds, mixing_logits, component_kl, mask, window_ids, *settings):
        spec, second, ranges = settings
        mask = _uint8(mask)
        log_mix = F.log_softmax(mixing_logits, dim=-1)
        args = (theta, window_ids, means, log_stds, log_mix, spec.kind, spec.temperature, ranges)
        table = bin_table(*args, bounds=KERNELS["_bin_bounds"])
        mean, var, kstar, classes, kl = _certified_moments(
            theta, gate_logits, mask, window_ids, (means, log_stds), table, spec, second, component_kl
        )
        # int32 indices: they are saved for backward; settled weights were evaluated with the certified ones
        block_elements = chunk_elements(theta.device) // _chunk_divisor(theta.device)
        found = uncovered_blocks(classes, table, means.shape[1], block_elements, torch.int32, settled_inline=True)
        blocks = list(found)
        inputs = (theta, gate_logits, means, log_stds, mask, window_ids)
        kl_table = None if component_kl is None else component_kl.detach().reshape(-1)
        scalars, saved_blocks = bin_scalars(table, theta.dtype), []
        tables = NearbyTables.build(means, log_stds, log_mix, second) if table.any_lumpable else None
        out = (mean, var if second else None, kstar)  # the blocks overwrite their weights' entries
        for u, width in blocks:
            if width:
                assert tables is not None  # a width only where the table has lumpable bins
                lookup = (table.nearby[:, : columns_of(width)], *scalars)  # (B, columns) components, bin_of's floats
                correction, bins = nearby_block(u, width, inputs, lookup, tables, spec, kl_table, out)
            else:
                correction, bins = full_block(u, inputs, log_mix, spec, second, kl_table, out)
            saved_blocks += [u] if bins is None else [u, bins]
            if correction is not None:
                kl = kl + correction
        saved = (theta, gate_logits, means, log_stds, mixing_logits, component_kl, mask, window_ids, kstar, classes)
        # the blocks' indices and bins as saved tensors too, so that autograd frees them after backward
        ctx.save_for_backward(*saved, table.nearby, *saved_blocks)
        ctx.spec, ctx.second, ctx.widths = spec, second, [w for _, w in blocks]
        ctx.mark_non_differentiable(kstar)
        ctx.set_materialize_grads(False)  # see _gate_terms.materialized_grads
        return mean, var, kstar, (theta.new_zeros(()) if kl is None else kl.to(theta.dtype))

    @staticmethod
    @without_autocast
    def backward(ctx, grad_mean, grad_var, _grad_kstar, grad_kl):
        check_first_order()
        theta, gate_logits, means, log_stds, mixing_logits, component_kl, mask, window_ids, kstar, classes, *rest = (
            ctx.saved_tensors
        )
        grad_mean, gv = materialized_grads(theta, grad_mean, grad_var, ctx.second)
        spec, g_comp = ctx.spec, kl_accumulator(component_kl, grad_kl)
        leaves = [p.detach().requires_grad_() for p in (means, log_stds, mixing_logits)]
        param_grads = [torch.zeros(p.numel(), dtype=torch.float64, device=p.device) for p in leaves]
        g_theta = torch.zeros_like(theta) if ctx.needs_input_grad[0] else None
        one_hot = (gate_logits, mask, window_ids, kstar, classes, means, log_stds, component_kl, grad_mean, gv)
        g_gate = _one_hot_gradients(param_grads, g_comp, *one_hot, grad_kl, spec)
        inputs = (theta, gate_logits, mask, window_ids, grad_mean, gv)
        nearby = rest[0]  # the bin table's (B, columns) nearby components; a block of width w uses the first w
        table_grads = TableGradients(leaves, ctx.second) if any(ctx.widths) else None
        for u, bins, width in unpack_blocks(rest[1:], ctx.widths):  # the uncovered weights: recomputed, as in chunked
            if width == ALL_LUMPED:
                lumped_gradients(g_gate, u, inputs, table_grads, spec)
                continue
            components = (nearby[:, :width], table_grads) if width else None  # None: a full block (all K)
            block_gradients(param_grads, g_theta, g_gate, u, bins, inputs, leaves, components, spec)
        if table_grads is not None:
            table_grads.into(param_grads)
        grads = [g.to(p.dtype).reshape(p.shape) for g, p in zip(param_grads, leaves, strict=True)]
        return g_theta, g_gate, *grads, kl_grad(component_kl, g_comp, grad_kl), None, None, None, None, None


def gate_kl_total(gate_logits, component_kl, mask, window_ids, kstar, gate_temperature, prior_keep):
    """_gate_kl._gate_kl_total as one kernel over all T weights (float64 sum)."""
    args = (component_kl.reshape(-1), _scalar(gate_temperature), component_kl.shape[1], *_prior_logs(prior_keep))
    return KERNELS["_gate_kl_sum"](gate_logits, _uint8(mask), window_ids, kstar, *args)


def gate_kl_chunk_grads(gate_logits, component_kl, mask, window_ids, kstar, tau, prior_keep, grad):
    """_gate_kl._gate_kl_chunk_grads as one kernel."""
    args = (component_kl.reshape(-1), _scalar(tau), component_kl.shape[1], _prior_logit(prior_keep), grad)
    return KERNELS["_gate_kl_backward"](gate_logits, _uint8(mask), window_ids, kstar, *args)


def _uint8(mask):
    """The bool pruning mask as the kernels take it: its uint8 view (0 or 1, no copy), used by arithmetic only
    (λ̃ · mask, 1 − mask). Inductor's CPU kernels handle 8-bit masks lane by lane: a kernel that reads a bool
    input, or compares a uint8 one, took 2.5× the time of the same kernel multiplying by the uint8 (57 against
    23 ms over 16.8M weights, session 39); a float comparison is not slowed."""
    return mask.view(torch.uint8) if mask.dtype == torch.bool else mask
