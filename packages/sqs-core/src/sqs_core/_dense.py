"""The compiled path on an accelerator: every weight on all K components, with no decision taken on the host.

On the CPU, ``compile_kernels`` certifies most weights one-hot and evaluates only the rest (sqs_core._fused):
that saves work, and the CPU is bound by work. On a GPU the same plan is bound by the host: which weights take
which evaluation is found by ``nonzero`` and ``topk`` every step, each a device wait, and the 4096² Linear's
compiled step (K = 64, 2,048 tokens, H200) spent 32 ms of host time a step against 6.9 ms of GPU time
(docs/step-benchmarks.md, "Session 33"). Here every weight is evaluated on all K components (eq. compute-phi-k,
the formula of sqs_core._nearby with no lumped term) by kernels whose launches depend on the sizes alone:

* forward, per chunk of :data:`DENSE_CHUNK_WEIGHTS` weights, one kernel: φ, m = Σ_k φ_k μ_k, s, k*, λ̃,
  θ^avg, Var and the gate KL's float64 sum (sqs_core._fused._gate_and_kl at that k*);
* backward, per chunk, a row kernel: φ recomputed, the cotangents G_m = ∂L/∂θ^avg λ̃ − 2 ∂L/∂Var λ̃² m and
  G_s = ∂L/∂Var λ̃, ∂/∂s̃, ∂/∂θ and each weight's row statistics (the softmaxes' maxima and normalisers, τ D);
* backward, per chunk, a column kernel: φ again from those statistics, the gradients of the (n, K) pairs
  with respect to the tables (μ, 1/σ, log π − log σ − ½ log 2π) and Σ λ̃ at each k* (the gate KL's), summed
  over the weights of each window inside the kernel (float32 tiles of :data:`COLUMN_TILE` weights, float64
  across them): no (n, K) tensor is written to memory.

The gradient is sqs_core._nearby's with width K (no lumped term):
∂/∂x_k = φ_k (G_m (μ_k − m) + G_s (v_k − s)), ∂/∂a_k = x_k (∂/∂x_k − τ D), ∂/∂q_k = a_k ∂/∂a_k
(the "standard" kind: ∂/∂q_k = ∂/∂x_k / τ), then z, μ, σ, θ by the chain rule; the tables' gradients reach
(μ, log σ, mixing logits) by sqs_core._nearby.TableGradients. Each kernel keeps K a compile-time constant
(``_Kernel(dynamic=None)``), so its reductions over the components stay in registers.

Measured on session 35's lent H200 (torch 2.11.0+cu130; docs/step-benchmarks.md, "Session 35"): 28.2 ms a step
against a plain step's 3.15 ms in the same process (8.9×), peak 625 against 513 MiB (1.22×). Session 33's
certified plan on the same kind of machine and torch took 22–33 ms (6.8–10.6×) at 1.38–1.60× the plain peak, and
slows down as training leaves more weights uncovered; this route's cost is fixed. Neither meets the issue's 2×:
with float64 tiles (31.9 ms), of the 28.7 ms of GPU time a step the column pass took 17.5, the forward 4.1 and
the row pass 3.8: at 4–16 ps a (weight, component) pair, inductor's kernels take several times what their exps
alone would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._autocast import without_autocast
from ._compiled import _Kernel, _scalar
from ._fused import _dkl_dlam, _gate_and_kl, _prior_logit, _prior_logs
from ._gate_terms import (
    _gate_probs,
    _variance,
    check_first_order,
    gate_drop,
    gate_logit_grad,
    kl_grad,
    moments_dlam,
)
from ._nearby import NearbyTables, TableGradients, cotangents
from ._one_hot import _flat_index
from .mixture import PAPER_CLAMP, exp_floor, flush_subnormals

__all__ = ["DENSE_CHUNK_WEIGHTS", "KERNELS", "DensePosteriorMoments", "dense_route"]

DENSE_CHUNK_WEIGHTS = 1 << 20
"""Weights per chunk of the dense kernels. Their memory is O(chunk): nine row statistics a weight in backward
(36 MiB in float32 at 2^20), no (n, K) tensor. On the H200, before :data:`INLINE`: 34.4 ms a step at 2^20 and
39.7 ms at 2^22 (docs/results/gpu_dense_first_s35.txt)."""


def dense_route(device: torch.device) -> bool:
    """Whether ``compile_kernels`` evaluates every weight on all K (this module) on ``device``: on an accelerator,
    where it meets the memory target the certified plan misses at a step time within that plan's measured range
    (module docstring). The CPU keeps the certified plan of sqs_core._fused: there the dense route took 26 s a
    step of the 4096² layer against ~1 s."""
    return device.type != "cpu"


@dataclass
class _Pairs:
    """The (n, K) evaluation of a chunk and its row statistics ((n, 1) each; None where the kind has none)."""

    mu: torch.Tensor
    inv_std: torch.Tensor
    offset: torch.Tensor  # θ − μ_k
    z: torch.Tensor
    q: torch.Tensor  # log π_k N_k(θ)
    a: torch.Tensor | None  # π N, clamped ("paper")
    x: torch.Tensor  # the second softmax's argument: φ'/τ ("paper") or q/τ ("standard")
    phi: torch.Tensor
    stats: tuple  # (top, scale, top2, norm): the two softmaxes' maxima and normalisers


def _pairs(th, wid, tables, temperature, kind, stats=None) -> _Pairs:
    """φ of weights ``th`` (n,) in windows ``wid`` (int64) on the (W, K) ``tables`` (μ, 1/σ, const, ...), the
    row reductions taken here or, given ``stats``, read from them (the column kernel)."""
    mu, inv_std = tables[0][wid], tables[1][wid]
    offset = th[:, None] - mu
    z = offset * inv_std
    q = tables[2][wid] - 0.5 * z * z
    floor = exp_floor(q.dtype)
    a, top, scale = None, None, None
    if kind == "paper":
        a = torch.exp(q.clamp(floor, PAPER_CLAMP))
        top = a.amax(1, keepdim=True) if stats is None else stats[0]
        e = torch.exp((a - top).clamp(min=floor))
        scale = 1 / (e.sum(1, keepdim=True) * temperature) if stats is None else stats[1]
        x = e * scale
    else:
        x = q / temperature
    top2 = stats[2] if stats is not None else _largest(x, scale)
    phi = torch.exp((x - top2).clamp(min=floor))
    norm = 1 / phi.sum(1, keepdim=True) if stats is None else stats[3]
    return _Pairs(mu, inv_std, offset, z, q, a, x, phi * norm, (top, scale, top2, norm))


def _largest(x, scale):
    """max_k x_k: the scale of the "paper" kind (its largest e is e^0 = 1 exactly), else a reduction."""
    return scale if scale is not None else x.amax(1, keepdim=True)


def _moments(pairs: _Pairs, level_sq):
    """(m = Σ_k φ_k μ_k, s = Σ_k φ_k (μ_k² + σ_k²) or None) from the gathered ``level_sq`` rows (or None)."""
    m = (pairs.phi * pairs.mu).sum(1)
    return m, (None if level_sq is None else (pairs.phi * level_sq).sum(1))


def _dense_forward(theta, window_ids, gate_logits, mask, tables, scalars, kl, outputs):
    """One chunk: writes θ^avg, Var (when ``outputs`` has a buffer for it) and k* (uint8) into ``outputs`` and
    returns the chunk's gate KL (float64) or None without ``kl`` = (flat component KLs, log λ, log(1 − λ)).
    ``scalars``: τ, kind, τ', K, σ_0²."""
    temperature, kind, tau, k, spike_var = scalars
    wid = window_ids.long()
    pairs = _pairs(theta, wid, tables, temperature, kind)
    m, s = _moments(pairs, None if tables[3] is None else tables[3][wid])
    kstar = pairs.q.argmax(1)
    lam, total = _gate_and_kl(gate_logits, mask, window_ids, kstar, tau, k, *kl)
    out_mean, out_var, out_kstar = outputs
    out_mean.copy_(flush_subnormals(lam * m))
    if s is not None:
        out_var.copy_(flush_subnormals(_variance(lam, m, s, spike_var)))
    out_kstar.copy_(kstar)
    return total


def _grad_x(pairs: _Pairs, level_sq, m, s, grad_m, grad_s):
    """∂L/∂x_k = φ_k (G_m (μ_k − m) + G_s (v_k − s)), (n, K)."""
    inner = grad_m[:, None] * (pairs.mu - m[:, None])
    if grad_s is not None:
        inner = inner + grad_s[:, None] * (level_sq - s[:, None])
    return pairs.phi * inner


def _grad_q(pairs: _Pairs, g_x, total, temperature):
    """∂L/∂q_k from ∂L/∂x (``total`` = τ D, "paper" only): 0 where q was clamped for the exp."""
    if pairs.a is None:
        return g_x / temperature
    floor = exp_floor(pairs.q.dtype)
    clamped = (pairs.q < floor) | (pairs.q > PAPER_CLAMP)
    return torch.where(clamped, 0.0, (g_x - total) * pairs.x * pairs.a)


def _dense_backward_rows(theta, window_ids, gate_logits, mask, kstar, grads, tables, scalars, kl, outputs):
    """One chunk's row pass: ∂/∂s̃ into ``outputs[0]``, ∂/∂θ into ``outputs[1]`` (when not None); returns the row
    statistics the column pass needs: (top, scale, top2, norm, G_m, G_s, m, s, τ D), None where unused.
    ``grads``: (∂L/∂θ^avg, ∂L/∂Var or None); ``scalars``: τ, kind, τ', K, σ_0²; ``kl``: (flat component KLs,
    logit λ or None, the KL's incoming gradient), or Nones."""
    temperature, kind, tau, k, spike_var = scalars
    (gm, gv), wid = grads, window_ids.long()
    pairs = _pairs(theta, wid, tables, temperature, kind)
    level_sq = None if gv is None else tables[3][wid]
    m, s = _moments(pairs, level_sq)
    scaled, _, lam = _gate_probs(gate_logits, mask, tau)
    grad_m, grad_s = cotangents(gm, gv, lam, m)
    dlam = moments_dlam(gm, gv, m, s, lam, spike_var)
    kl_table, prior_logit, grad_kl = kl
    if kl_table is not None:
        dlam = dlam + grad_kl * _dkl_dlam(scaled, kl_table[_flat_index(window_ids, kstar, k)], prior_logit)
    outputs[0].copy_(gate_logit_grad(dlam, lam, gate_drop(scaled), tau))
    g_x = _grad_x(pairs, level_sq, m, s, grad_m, grad_s)
    total = None if pairs.a is None else temperature * (pairs.x * g_x).sum(1, keepdim=True)
    if outputs[1] is not None:
        g_q = _grad_q(pairs, g_x, total, temperature)
        outputs[1].copy_(-(g_q * pairs.z * pairs.inv_std).sum(1))
    return (*pairs.stats, grad_m, grad_s, m, s, total)


def _dense_backward_columns(theta, window_ids, gate_logits, mask, kstar, tables, stats, scalars, windows):
    """One chunk's column pass: (4 or 3, W, K) float64 sums over the chunk's weights of each window of
    ∂/∂μ_k, ∂/∂(1/σ_k), ∂/∂const_k and, when ``kstar`` is given, Σ λ̃ [k* = k] (the gate KL's)."""
    temperature, kind, tau = scalars
    wid = window_ids.long()
    pairs = _pairs(theta, wid, tables, temperature, kind, stats[:4])
    grad_m, grad_s, m, s, total = stats[4:]
    level_sq = None if grad_s is None else tables[3][wid]
    g_q = _grad_q(pairs, _grad_x(pairs, level_sq, m, s, grad_m, grad_s), total, temperature)
    g_qz = g_q * pairs.z
    g_mu = g_qz * pairs.inv_std + pairs.phi * grad_m[:, None]
    g_inv = -g_qz * pairs.offset
    if grad_s is not None:
        g_mu = g_mu + pairs.phi * (2 * grad_s[:, None]) * pairs.mu
        g_inv = g_inv - pairs.phi * (2 * grad_s[:, None]) * pairs.inv_std.pow(-3)  # ∂σ²/∂(1/σ) = −2σ³
    terms = [g_mu, g_inv, g_q]
    if kstar is not None:
        lam = _gate_probs(gate_logits, mask, tau)[2]
        level = torch.arange(pairs.q.shape[1], device=kstar.device)
        terms.append(torch.where(level == kstar[:, None].long(), lam[:, None], 0.0))
    if windows == 1:
        return torch.stack([_column_sum(t) for t in terms])[:, None]
    per_window = [[_column_sum(torch.where((wid == w)[:, None], t, 0.0)) for w in range(windows)] for t in terms]
    return torch.stack([torch.stack(rows) for rows in per_window])


def _column_sum(terms):
    """Σ over the weights of (n, K) ``terms``, in float64: by tiles of :data:`COLUMN_TILE` weights first, when n is
    a multiple of it (a reduction over tiles of (COLUMN_TILE, K) pairs, then one over the tiles' sums)."""
    n = terms.shape[0]
    if COLUMN_TILE and n % COLUMN_TILE == 0 and n > COLUMN_TILE:
        tiles = terms.view(n // COLUMN_TILE, COLUMN_TILE, -1)
        return tiles.sum(1, dtype=torch.promote_types(terms.dtype, TILE_DTYPE)).sum(0, dtype=torch.float64)
    return terms.sum(0, dtype=torch.float64)


TILE_DTYPE = torch.float32
"""The dtype of the sums within a tile of :data:`COLUMN_TILE` weights, at least the weights' (a float64 posterior sums
in float64); the sums over tiles are float64. On the H200
the step took 28.2 ms with float32 tiles against 32.1 ms with float64 ones (docs/results/gpu_dense_tiles_s35.txt),
and the float32 gradients stay as near float64's as the eager path's (tests/core/test_dense.py)."""

COLUMN_TILE = 256
"""Weights per tile of the column sums: inductor then reduces (COLUMN_TILE, K) blocks of pairs, each weight's
inputs read once per block. On the H200 the step took 31.9 ms with float64 tiles of 256 and 64.8 ms without tiles
(docs/results/gpu_dense_variants_s35.txt); with float32 tiles 29.7, 28.2 and 33.6 ms for 64, 256 and 1,024
(gpu_dense_tiles_s35.txt). 0: no tiles."""


INLINE = {
    "realize_opcount_threshold": 1 << 20,
    "realize_cpu_opcount_threshold": 1 << 20,
    "realize_reads_threshold": 1 << 20,
    "realize_acc_reads_threshold": 1 << 20,
    "realize_cpu_acc_reads_threshold": 1 << 20,
}
"""Inductor settings of these kernels: never write a shared (n, K) intermediate to memory (recompute it in each
kernel that reads it). By default inductor stores an intermediate that several reductions read and that costs
more than 30 operations: at 2^20 weights a chunk, 256 MiB each. On session 35's H200 the step's peak was 1,641 MiB
with inductor's default (3.2× a plain step's) and 625 MiB with these settings, at the same time (32.1 against
31.9 ms). Settings this torch lacks are left out (sqs_core._compiled). On the CPU inductor stores any reused
intermediate that takes an exp whatever these say; the CPU takes the certified route."""

KERNELS = {
    fn.__name__: _Kernel(fn, dynamic=None, options=INLINE)
    for fn in (_dense_forward, _dense_backward_rows, _dense_backward_columns)
}


def _ranges(numel: int):
    for start in range(0, numel, DENSE_CHUNK_WEIGHTS):
        yield start, min(numel, start + DENSE_CHUNK_WEIGHTS)


def _tables(nearby: NearbyTables, means, log_stds, second):
    """The (W, K) μ, 1/σ, log π − log σ − ½ log 2π (``nearby``'s flat columns) and, with Var, μ² + σ²: what the
    kernels gather rows of."""
    mu, inv_std, const = (c.view(means.shape) for c in nearby.columns)
    return mu, inv_std, const, (mu * mu + torch.exp(2 * log_stds.detach()) if second else None)


def _scalars(spec, k):
    """The kernels' (τ, responsibility kind, τ', K, σ_0²); floats as 0-d tensors (no recompile per value)."""
    return _scalar(spec.temperature), spec.kind, _scalar(spec.gate_temperature), k, _scalar(spec.spike_variance)


class DensePosteriorMoments(torch.autograd.Function):
    """chunked._PosteriorMoments evaluated densely (this module's docstring): the same (θ^avg, Var or empty, k*,
    gate KL), k* = argmax_k log π_k N_k over all K. Saves only the inputs and k*."""

    @staticmethod
    def forward(ctx, theta, gate_logits, means, log_stds, mixing_logits, component_kl, mask, window_ids, *settings):
        spec, second, _ = settings
        nearby = NearbyTables.build(means, log_stds, F.log_softmax(mixing_logits, dim=-1), second)
        tables = _tables(nearby, means, log_stds, second)
        mean, kstar = torch.empty_like(theta), torch.empty(theta.shape, dtype=torch.uint8, device=theta.device)
        var = torch.empty_like(theta) if second else theta.new_zeros(0)
        kl = (None, None, None)
        if component_kl is not None:
            kl = (component_kl.detach().reshape(-1), *_prior_logs(spec.prior_keep))
        scalars = _scalars(spec, means.shape[1])
        total = torch.zeros((), dtype=torch.float64, device=theta.device)
        for a, b in _ranges(theta.numel()):
            outputs = (mean[a:b], (var[a:b] if second else None), kstar[a:b])
            part = KERNELS["_dense_forward"](
                theta[a:b], window_ids[a:b], gate_logits[a:b], mask[a:b], tables, scalars, kl, outputs
            )
            if part is not None:
                total = total + part
        ctx.save_for_backward(theta, gate_logits, means, log_stds, mixing_logits, component_kl, mask, window_ids, kstar)
        ctx.spec, ctx.second = spec, second
        ctx.mark_non_differentiable(kstar)
        return mean, var, kstar, total.to(theta.dtype)

    @staticmethod
    @without_autocast
    def backward(ctx, grad_mean, grad_var, _grad_kstar, grad_kl):
        check_first_order()
        theta, gate_logits, means, log_stds, mixing_logits, component_kl, mask, window_ids, kstar = ctx.saved_tensors
        spec, gv = ctx.spec, (grad_var if ctx.second else None)
        leaves = [p.detach().requires_grad_() for p in (means, log_stds, mixing_logits)]
        table_grads = TableGradients(leaves, ctx.second)
        tables = _tables(table_grads.tables, means, log_stds, ctx.second)  # the tables it differentiates
        with_kl = component_kl is not None and grad_kl is not None
        kl = (None, None, None)
        if with_kl:
            kl = (component_kl.detach().reshape(-1), _prior_logit(spec.prior_keep), grad_kl.detach())
        row_scalars = _scalars(spec, means.shape[1])
        g_theta = torch.zeros_like(theta) if ctx.needs_input_grad[0] else None
        g_gate = torch.empty_like(gate_logits)
        sums = torch.zeros(3 + with_kl, *means.shape, dtype=torch.float64, device=means.device)
        for a, b in _ranges(theta.numel()):
            chunk = (theta[a:b], window_ids[a:b], gate_logits[a:b], mask[a:b])
            cotangents = (grad_mean[a:b], None if gv is None else gv[a:b])
            outputs = (g_gate[a:b], None if g_theta is None else g_theta[a:b])
            stats = KERNELS["_dense_backward_rows"](*chunk, kstar[a:b], cotangents, tables, row_scalars, kl, outputs)
            levels = kstar[a:b] if with_kl else None
            sums += KERNELS["_dense_backward_columns"](*chunk, levels, tables, stats, row_scalars[:3], means.shape[0])
        for acc, total in zip(table_grads.columns, sums[:3], strict=True):
            acc += total.reshape(-1)
        table_grads.used = True
        param_grads = [torch.zeros(p.numel(), dtype=torch.float64, device=p.device) for p in leaves]
        table_grads.into(param_grads)
        grads = [g.to(p.dtype).reshape(p.shape) for g, p in zip(param_grads, leaves, strict=True)]
        g_comp = sums[3].reshape(-1) if with_kl else None
        return g_theta, g_gate, *grads, kl_grad(component_kl, g_comp, grad_kl), None, None, None, None, None
