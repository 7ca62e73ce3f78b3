"""The compiled path (sqs_core._fused) for the weights the one-hot certificate does not cover.

Kernel bodies, each compiled once (``KERNELS``, counted into ``_fused.KERNELS``; a graph per width in
onehot.NEARBY_WIDTHS where they unroll a loop over components): the full (K, n) evaluation; the evaluation
on a bin's nearby components with the loop over components unrolled (sqs_core._fused_nearby); the forward
of a block of weights in lumpable bins, which gathers its own inputs; backward's input gathering and its
recomputation with the hand-derived gradient. And the per-block glue FusedPosteriorMoments calls:
``nearby_block`` and ``full_block`` in forward, ``block_gradients`` in backward (``unpack_blocks`` rebuilds
the blocks from the saved tensors); ``bin_scalars``, the bin table's floats as inputs of onehot.bin_of in a
kernel. Blocks wider than :data:`UNROLLED_MAX` run sqs_core._nearby's evaluation compiled with its loop
over the components rolled; all-lumped blocks (onehot.ALL_LUMPED) one small kernel each way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._compiled import _Kernel, _scalar
from ._fused_nearby import lumped_rows, nearby_rows, nearby_rows_vjp
from ._gate_terms import _gate_probs, _variance, gate_drop, gate_logit_grad, moments_dlam
from ._nearby import NearbyTables, lumped_vjp, nearby_moments, nearby_vjp
from ._one_hot import _flat_index
from .chunked import recomputed_grads
from .mixture import HALF_LOG_2PI, PAPER_CLAMP, flush_subnormals
from .onehot import ALL_LUMPED, bin_of

UNROLLED_MAX = 16
"""The widest block of nearby components evaluated by the unrolled kernels; wider ones (up to onehot.NEARBY = 32) take
sqs_core._nearby's (width, n) evaluation compiled as a whole, its loop over the components rolled
(:func:`_rolled_forward`, :func:`_rolled_vjp`). Unrolled, width 32's forward and backward kernels took 172 and
295 s to compile in float32 (longer in float64) on session 33's Intel Xeon, against 10–20 s for width 16.
Paired from the 4096² layer's step-350 state (session 34): the compiled step took 2.17 s with the rolled
kernels at width 32, 2.34 s with session 33's eager evaluation there, and 2.22 s with width 16 rolled too
(docs/method.md, "Session 34")."""

__all__ = [
    "KERNELS",
    "bin_scalars",
    "block_gradients",
    "full_block",
    "lumped_gradients",
    "nearby_block",
    "unpack_blocks",
]


def _log_density_columns(th, mu, log_std, log_mix):
    """q_ki = log π_k + log N(θ_i | μ_k, σ_k²) on gathered (K, n) columns: mixture.component_log_density
    transposed, so that the reductions over k are vectorised along the weights."""
    z = (th - mu) * torch.exp(-log_std)
    return log_mix - log_std - HALF_LOG_2PI - 0.5 * z * z


def _full_columns(th, mu, log_std, log_mix, temperature, kind, second):
    """(m = Σ_k φ_k μ_k, s = Σ_k φ_k (μ_k² + σ_k²) or None, k* = argmax_k log(π_k N_k)) of n weights on gathered
    (K, n) columns, φ of eq. compute-phi-k (mixture.log_responsibilities): chunked._full_levels."""
    q = _log_density_columns(th, mu, log_std, log_mix)
    stage = torch.softmax(torch.exp(q.clamp(max=PAPER_CLAMP)), dim=0) if kind == "paper" else q  # φ' for "paper"
    phi = F.log_softmax(stage / temperature, dim=0).exp()
    s = (phi * (mu * mu + torch.exp(2 * log_std))).sum(0) if second else None
    return (phi * mu).sum(0), s, q.argmax(0)


def bin_scalars(table, dtype):
    """The BinTable's ``low`` and ``inv_width`` as kernel inputs (onehot.bin_of) in the weights' ``dtype``, as
    onehot.bin_index computes (float64 ones would make inductor convert every θ), at least float32 (B / range
    overflows float16)."""
    dtype = torch.promote_types(dtype, torch.float32)
    return torch.tensor(table.low, dtype=dtype), torch.tensor(table.inv_width, dtype=dtype)


def _nearby_forward(u, theta, gate_logits, mask, window_ids, lookup, tables, totals, scalars, kl_table, out):
    """θ^avg, Var (with ``out``'s Var) and k* of the uncovered weights ``u`` in lumpable bins, written at ``u`` into
    ``out`` = (θ^avg, Var or None, k*) of all weights (its k*, the certificate's, read first for the KL), and
    returned: the gate-KL correction (or None) and the bins (int32, for backward): their inputs gathered, their
    bins found again and their nearby components (``lookup``: the (B, width) table, ``low``, ``inv_width``) looked
    up in the (W·K,) ``tables`` (μ, 1/σ, log π − log σ − ½ log 2π) and :func:`_nearby_rows`, in one kernel (the
    forward needs no graph). ``totals``: (W,) Σ_k μ_k and Σ_k (μ_k² + σ_k²) or None; ``scalars``: L, τ, τ', K,
    σ_0². Writing inside the kernel: eager ``index_put_``s at int32 indices took 4.4 ns a weight."""
    lumped, temperature = scalars[:2]
    th, wid, flat, bins, mu, inv_std, const = _gathered_rows(u, theta, window_ids, lookup, tables)
    total_sq = None if totals[1] is None else totals[1][wid]
    rows = nearby_rows(th, mu, inv_std, const, totals[0][wid], total_sq, lumped, temperature)  # float64 m, s
    outputs = _rows_outputs(u, th, wid, flat, rows, gate_logits, mask, out[2], scalars[2:], kl_table)
    return _written(u, out, outputs), bins


def _lumped_forward(u, theta, gate_logits, mask, window_ids, lookup, tables, totals, scalars, kl_table, out):
    """:func:`_nearby_forward` of weights in all-lumped bins (onehot.ALL_LUMPED; ``lookup``'s table: their
    onehot.LUMPED_SCAN columns, for k*), by :func:`lumped_rows`; returns the KL correction alone (backward needs
    no bins)."""
    th, wid, flat, _, mu, inv_std, const = _gathered_rows(u, theta, window_ids, lookup, tables)
    total_sq = None if totals[1] is None else totals[1][wid]
    rows = lumped_rows(th, mu, inv_std, const, totals[0][wid], total_sq, scalars[3])
    return _written(u, out, _rows_outputs(u, th, wid, flat, rows, gate_logits, mask, out[2], scalars[2:], kl_table))


def _written(u, out, outputs):
    """Write ``outputs`` = (θ^avg, Var or None, k*, KL correction or None) of weights ``u`` at ``u`` into ``out`` =
    (θ^avg, Var or None, k*) of all weights; return the correction."""
    mean, var, kstar, correction = outputs
    out[0][u] = mean
    if var is not None:
        out[1][u] = var
    out[2][u] = kstar
    return correction


def _gathered_rows(u, theta, window_ids, lookup, tables):
    """θ and window (int32: _one_hot._flat_index's arithmetic) of weights ``u``, their bins' flat component
    indices (one row per column of ``lookup``'s table), their bins, and the μ, 1/σ, const rows."""
    th, wid = theta[u], window_ids[u].int()
    table, low, inv_width = lookup
    bins = bin_of(th, low, inv_width, table.shape[0])
    flat = [table[:, c][bins] for c in range(table.shape[1])]
    mu, inv_std, const = ([t[i] for i in flat] for t in tables)
    return th, wid, flat, bins, mu, inv_std, const


def _rows_outputs(u, th, wid, flat, rows, gate_logits, mask, kstar, scalars, kl_table):
    """θ^avg, Var or None, k* (uint8) and the gate-KL correction (or None) from ``rows`` = (m, s or None, the
    position of k* among ``flat``); ``scalars``: τ', K, σ_0²."""
    m, s, pos = rows
    best = flat[0]
    for c in range(1, len(flat)):
        best = torch.where(pos == c, flat[c], best)
    outputs = _block_outputs(u, wid, (m, s, best), gate_logits, mask, kstar, scalars, kl_table, th.dtype)
    return outputs[0], outputs[1], (best - wid * scalars[1]).to(torch.uint8), outputs[2]


def _block_outputs(u, wid, moments, gate_logits, mask, kstar, scalars, kl_table, dtype):
    """(θ^avg = λ̃ m in ``dtype``, Var or None, the gate-KL correction or None) of uncovered weights ``u`` from
    ``moments`` = (m, s or None, the flat index w·K + k of their k*), λ̃ from their gates, Var formed in m's
    dtype; ``scalars``: τ', K, σ_0². The one epilogue of every uncovered block, compiled or eager."""
    (m, s, flat), (tau, k, spike_var) = moments, scalars
    lam = _gate_probs(gate_logits[u], mask[u], tau)[2]
    var = None if s is None else flush_subnormals(_variance(lam.to(m.dtype), m, s, spike_var).to(dtype))
    correction = None if kl_table is None else _kl_correction(kl_table, flat, _flat_index(wid, kstar[u], k), lam)
    return flush_subnormals((lam * m).to(dtype)), var, correction


def _kl_correction(kl_table, flat, flat_before, lam):
    """Σ λ̃ (KL at ``flat`` − KL at ``flat_before``) in float64: the certified kernel summed each weight's gate
    KL at its bin's choice of component (``flat_before``), an uncovered weight's k* (``flat``) may differ."""
    return (lam * (kl_table[flat] - kl_table[flat_before])).sum(dtype=torch.float64)


def _nearby_inputs(u, bins, theta, gate_logits, mask, window_ids, grad_mean, grad_var, nearby, tau):
    """What backward's recomputation of the uncovered weights ``u`` in lumpable bins ``bins`` (as forward found
    them: recomputing them here would chain a gather on θ's, 2× the time) needs, gathered in one kernel:
    θ, window (int64), λ̃ (masked), 1 − λ̃ (unmasked: _gate_terms.gate_drop), ∂L/∂θ^avg, ∂L/∂Var (or None) and
    the (width, n) flat indices of their bins' nearby components (the (B, width) table ``nearby``)."""
    scaled, _, lam = _gate_probs(gate_logits[u], mask[u], tau)
    flat = torch.stack([nearby[:, c][bins] for c in range(nearby.shape[1])])
    gv = None if grad_var is None else grad_var[u]
    drop = gate_drop(scaled)
    return theta[u], window_ids[u].long(), lam, drop, grad_mean[u], gv, flat.long()  # int64: scatter_add_'s


def _nearby_vjp(th, flat, tables, totals, wid, gm, gv, lam, drop, scalars, u, grads):
    """Backward of uncovered weights in one kernel: their (width, n) columns of the flat (W·K,) ``tables``
    (μ, 1/σ, log π − log σ − ½ log 2π) at the component indices ``flat`` and their windows' ``totals``
    (Σ_k μ_k, Σ_k (μ_k² + σ_k²) or None) gathered inside it (no column is written out), θ^avg (and Var)
    recomputed and pulled back by hand (sqs_core._fused_nearby.nearby_rows_vjp) with ∂L/∂θ^avg = ``gm`` and
    ∂L/∂Var = ``gv`` (None: Var unused). The moments' part of ∂/∂s̃ and ∂/∂θ go into ``grads`` at the weights
    ``u`` (:func:`_added`); returns ∂/∂ of the μ, 1/σ and log π − log σ − ½ log 2π columns (width, n) float64 and
    of Σ_k μ_k and, with Var, of Σ_k (μ_k² + σ_k²): the caller sums them into the (W, K) parameters,
    deterministically."""
    lumped, temperature, tau, spike_var = scalars
    mu, inv_std, const = ([t[i] for i in flat.unbind(0)] for t in tables)  # the (width, n) index as width rows
    total_sq = None if gv is None else totals[1][wid]
    columns = (th, mu, inv_std, const, (totals[0][wid], total_sq), lumped, temperature)
    m, s, g_th, g_mu, g_inv, g_const, total_grads = nearby_rows_vjp(*columns, (gm, gv, lam))
    lam64 = lam.double()
    g_gate = gate_logit_grad(moments_dlam(gm, gv, m, s, lam64, spike_var), lam64, drop, tau).to(th.dtype)
    # ∂/∂θ below θ's smallest normal number is 0: rounding it to a subnormal costs a microcode assist per vector
    g_th = torch.where(g_th.abs() < torch.finfo(th.dtype).tiny, 0.0, g_th).to(th.dtype)
    _added(u, grads, g_gate, g_th)
    return *(torch.stack(g) for g in (g_mu, g_inv, g_const)), *total_grads


def _added(u, grads, g_gate, g_theta):
    """``grads`` = (∂/∂s̃ of all weights, ∂/∂θ of all weights or None) += (``g_gate``, ``g_theta``) at the weights
    ``u`` (distinct): one add each, as ``index_add_`` (the same bits), inside the kernel (eager, ``index_add_``
    at int32 indices took 2.3 ns a weight)."""
    grads[0][u] = grads[0][u] + g_gate.to(grads[0].dtype)
    if grads[1] is not None:
        grads[1][u] = grads[1][u] + g_theta.to(grads[1].dtype)


def _rolled_forward(u, theta, gate_logits, mask, window_ids, lookup, tables, totals, scalars, kl_table, out):
    """:func:`_nearby_forward` for blocks wider than :data:`UNROLLED_MAX`: sqs_core._nearby's (width, n)
    evaluation (a loop over the components, not unrolled) with the gathers and the gate in one kernel."""
    temperature, k = scalars[1], scalars[3]
    th, wid = theta[u], window_ids[u].long()
    table, low, inv_width = lookup
    bins = bin_of(th, low, inv_width, table.shape[0])
    nearby = NearbyTables(tuple(tables), totals[0], totals[1], k)
    m, s, levels = nearby_moments(th, wid, table[bins].t().long(), nearby, temperature)
    moments = (m, s, _flat_index(wid, levels, k))
    mean, var, correction = _block_outputs(u, wid, moments, gate_logits, mask, out[2], scalars[2:], kl_table, th.dtype)
    return _written(u, out, (mean, var, levels, correction)), bins


def _rolled_vjp(
    u, bins, theta, gate_logits, mask, window_ids, grad_mean, grad_var, table, tables, totals, scalars, grads
):
    """Backward of a block wider than :data:`UNROLLED_MAX` in one kernel: sqs_core._nearby.nearby_vjp with the
    gathers and ∂/∂s̃, ∂/∂s̃ and ∂/∂θ added into ``grads`` (:func:`_added`). Returns (the (width, n) flat component
    indices (int64), the windows (int64), the column gradients and the total gradients as float64)."""
    temperature, tau, k, spike_var = scalars
    scaled, _, lam = _gate_probs(gate_logits[u], mask[u], tau)
    th, wid, gm = theta[u], window_ids[u].long(), grad_mean[u]
    gv = None if grad_var is None else grad_var[u]
    flat = table[bins].t().long()
    nearby = NearbyTables(tuple(tables), totals[0], totals[1], k)
    m, s, g_th, column_grads, total_grads = nearby_vjp(th, wid, flat, nearby, temperature, gm, gv, lam)
    _added(u, grads, gate_logit_grad(moments_dlam(gm, gv, m, s, lam, spike_var), lam, gate_drop(scaled), tau), g_th)
    return flat, wid, [g.double() for g in column_grads], [g.double() for g in total_grads]


def _lumped_backward(u, gate_logits, mask, window_ids, grad_mean, grad_var, tables, totals, scalars, g_gate_all):
    """Backward of weights in all-lumped bins in one kernel (sqs_core._nearby.lumped_vjp, in float64): the moments'
    part of ∂/∂s̃ added into ``g_gate_all`` at ``u``; returns (their windows (int64), ∂/∂Σμ and, with ∂L/∂Var =
    ``grad_var``, ∂/∂Σ(μ² + σ²)); ∂/∂θ is 0. ``totals``: the (W,) Σ_k μ_k and Σ_k (μ_k² + σ_k²) or None;
    ``scalars``: τ', K, σ_0²."""
    tau, k, spike_var = scalars
    scaled, _, lam = _gate_probs(gate_logits[u], mask[u], tau)
    wid, lam64 = window_ids[u].long(), lam.double()
    gm, gv = grad_mean[u].double(), (None if grad_var is None else grad_var[u].double())
    nearby = NearbyTables(tuple(tables), totals[0].double(), None if totals[1] is None else totals[1].double(), k)
    m, s, total_grads = lumped_vjp(wid, nearby, gm, gv, lam64)
    dlam = moments_dlam(gm, gv, m, s, lam64, spike_var)
    _added(u, (g_gate_all, None), gate_logit_grad(dlam, lam64, gate_drop(scaled), tau), None)
    return wid, *total_grads


UNROLLED_FUSION = {"max_fusion_size": 1 << 12}
"""Inductor settings of the unrolled nearby kernels: fuse up to 4,096 nodes into one loop (inductor's default is 64).
At width 16 the unrolled graphs have several hundred nodes, and with the default inductor cut them into 3–4 loops
that wrote 55–134 intermediate rows to memory and read them back. From the 4096² layer's step-300 state (session
39's Intel Xeon; 417k weights at width 16): 358 → 64 ns a weight forward, 510 → 227 backward; widths 4 and 8
unchanged (they fit). Raising the realize thresholds as well (sqs_core._dense.INLINE) had not finished compiling
the width-16 kernels after 20 minutes."""

KERNELS = {
    fn.__name__: _Kernel(fn, options=UNROLLED_FUSION if fn in (_nearby_forward, _nearby_vjp) else None)
    for fn in (
        _full_columns,
        _nearby_forward,
        _lumped_forward,
        _rolled_forward,
        _nearby_inputs,
        _nearby_vjp,
        _lumped_backward,
        _rolled_vjp,
    )
}


def _full_eval(th, wid, means, log_stds, log_mix, spec, second):
    """(m, s or None, k* uint8) of uncovered weights on all K: chunked._full_moments with the (K, n) evaluation
    compiled; the gathers stay eager, so that in backward the gradients reach the (W, K) parameters through
    their deterministic eager backward."""
    columns = [p.t().index_select(1, wid) for p in (means, log_stds, log_mix)]  # (K, n)
    m, s, best = KERNELS["_full_columns"](th, *columns, _scalar(spec.temperature), spec.kind, second)
    return m, s, best.to(torch.uint8)


def nearby_block(u, width, inputs, lookup, nearby: NearbyTables, spec, kl_table, out):
    """:func:`_nearby_forward` (:func:`_lumped_forward` for ``width`` onehot.ALL_LUMPED) for one block whose bins
    take the (B, columns) components ``lookup[0]`` (``lookup``: that table and :func:`bin_scalars`), gathering
    from the forward's ``nearby`` tables; θ^avg, Var and k* written into ``out`` (:func:`_written`). Returns (KL
    correction or None, bins or None)."""
    theta, gate_logits, _, _, mask, window_ids = inputs
    k = nearby.k
    tables, totals = list(nearby.columns), (nearby.total_mu, nearby.total_sq)
    lumped = float(k - lookup[0].shape[1])
    scalars = (
        _scalar(lumped),
        _scalar(spec.temperature),
        _scalar(spec.gate_temperature),
        k,
        _scalar(spec.spike_variance),
    )
    args = (theta, gate_logits, mask, window_ids, lookup, tables, totals, scalars, kl_table, out)
    if width == ALL_LUMPED:
        return KERNELS["_lumped_forward"](u, *args), None
    if width > UNROLLED_MAX:
        return KERNELS["_rolled_forward"](u, *args)
    return KERNELS["_nearby_forward"](u, *args)


def full_block(u, inputs, log_mix, spec, second, kl_table, out):
    """:func:`nearby_block` of uncovered weights ``u`` on all K (the writes eager): (KL correction or None, None)."""
    theta, gate_logits, means, log_stds, mask, window_ids = inputs
    u, k = u.long(), means.shape[1]
    wid = window_ids.index_select(0, u).long()
    m, s, levels = _full_eval(theta.index_select(0, u), wid, means, log_stds, log_mix, spec, second)
    scalars, moments = (spec.gate_temperature, k, spec.spike_variance), (m, s, _flat_index(wid, levels, k))
    outputs = _block_outputs(u, wid, moments, gate_logits, mask, out[2], scalars, kl_table, theta.dtype)
    return _written(u, out, (outputs[0], outputs[1], levels, outputs[2])), None


def unpack_blocks(tensors, widths):
    """[(u, bins or None, width)] from the flat saved tensors: two per nearby block (``width`` > 0), one per
    full or all-lumped block."""
    blocks, items = [], iter(tensors)
    for width in widths:
        u = next(items)
        blocks.append((u, next(items) if width and width != ALL_LUMPED else None, width))
    return blocks


def block_gradients(param_grads, g_theta, g_gate, u, bins, inputs, leaves, nearby, spec):
    """Recompute one block of uncovered weights (``bins`` None: on all K, else in ``bins``, whose components
    ``nearby`` = (the (B, width) table, :class:`~sqs_core._nearby.TableGradients`) lists and sums into) with its
    gradients, accumulate its parameter gradients and add the moments' part of its ∂/∂s̃ to ``g_gate``."""
    if bins is not None:
        return _nearby_gradients(g_theta, g_gate, u, bins, inputs, nearby, spec)
    theta, gate_logits, mask, window_ids, grad_mean, grad_var = inputs
    second, tau = grad_var is not None, spec.gate_temperature
    scaled, _, lam = _gate_probs(gate_logits[u], mask[u], tau)
    th, wid, gm, gv = theta[u], window_ids[u].long(), grad_mean[u], (grad_var[u] if second else None)

    def evaluate(th_leaf, log_mix):
        return _full_eval(th_leaf, wid, leaves[0], leaves[1], log_mix, spec, second)

    m, s = recomputed_grads(param_grads, g_theta, (0, u), leaves, th, evaluate, gm, gv, lam)
    dlam = moments_dlam(gm, gv, m, s, lam, spec.spike_variance)
    g_gate.index_add_(0, u, gate_logit_grad(dlam, lam, gate_drop(scaled), tau))


def lumped_gradients(g_gate, u, inputs, table_grads, spec):
    """:func:`block_gradients` of a block of all-lumped weights: one :func:`_lumped_backward` kernel, its
    gradients summed into ``table_grads``' window totals and the moments' part of ∂/∂s̃ added to ``g_gate``."""
    _, gate_logits, mask, window_ids, grad_mean, grad_var = inputs
    tables = table_grads.tables
    scalars = (_scalar(spec.gate_temperature), tables.k, _scalar(spec.spike_variance))
    totals = [tables.total_mu, tables.total_sq]
    args = (gate_logits, mask, window_ids, grad_mean, grad_var, list(tables.columns), totals, scalars, g_gate)
    wid, *total_grads = KERNELS["_lumped_backward"](u, *args)
    table_grads.add_totals(wid, total_grads)


def _nearby_gradients(g_theta, g_gate, u, bins, inputs, nearby, spec):
    """:func:`block_gradients` of a block in lumpable bins: its inputs gathered by one kernel, values and
    gradients by one :func:`_nearby_vjp` kernel (which gathers its columns of the (W, K) tables); the column
    gradients (float64) are summed into the tables by ``nearby``'s TableGradients, which takes them to the
    (W, K) parameters once per backward."""
    table, table_grads = nearby
    if table.shape[1] > UNROLLED_MAX:
        return _rolled_gradients(g_theta, g_gate, u, bins, inputs, nearby, spec)
    tau = _scalar(spec.gate_temperature)
    th, wid, lam, drop, gm, gv, components = KERNELS["_nearby_inputs"](u, bins, *inputs, table, tau)
    tables = table_grads.tables
    lumped = _scalar(float(tables.k - components.shape[0]))
    scalars = (lumped, _scalar(spec.temperature), tau, _scalar(spec.spike_variance))
    totals = [tables.total_mu, tables.total_sq]
    args = (th, components, list(tables.columns), totals, wid, gm, gv, lam, drop, scalars, u, (g_gate, g_theta))
    column_grads = KERNELS["_nearby_vjp"](*args)
    table_grads.add(components, wid, column_grads[:3], column_grads[3:])


def _rolled_gradients(g_theta, g_gate, u, bins, inputs, nearby, spec):
    """:func:`_nearby_gradients` of a block wider than :data:`UNROLLED_MAX`: one :func:`_rolled_vjp` kernel."""
    table, table_grads = nearby
    tables = table_grads.tables
    totals = [tables.total_mu, tables.total_sq]
    scalars = (_scalar(spec.temperature), _scalar(spec.gate_temperature), tables.k, _scalar(spec.spike_variance))
    args = (u, bins, *inputs, table, list(tables.columns), totals, scalars, (g_gate, g_theta))
    flat, wid, column_grads, total_grads = KERNELS["_rolled_vjp"](*args)
    table_grads.add(flat, wid, column_grads, total_grads)
