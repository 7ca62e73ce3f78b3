"""The per-weight passes of a training step as ``torch.compile``'d kernels (``SQSConfig.compile_kernels``).

:mod:`sqs_core.chunked` spends a small-batch training step mostly in elementwise passes over all T
weights: λ̃ = sigmoid(s̃/τ') (eq. lambda-prime), the one-hot certificate (:mod:`sqs_core.onehot`),
θ^avg = λ̃ μ_k* and Var_q, their gradients, and the gate KL (eq. approx_elbo) with its gradients, about
25 passes each reading and writing T numbers. Here each group is one kernel fused by inductor:

* moments forward: gate, certificate lookup, θ^avg, k* (and Var): one kernel over all T weights; the B·K
  bounds of the certificate's bin table (onehot._bin_bounds): one kernel;
* moments backward: gate, one-hot gradients, ∂/∂s̃: one kernel per chunk of CHUNK_ELEMENTS weights;
* the weights the certificate does not cover: φ on all K or on the NEARBY components, with the components
  along the first dimension so that the reductions over k vectorise along the weights; values, and
  gradients (AOTAutograd) when backward recomputes them;
* gate KL forward: one float64 reduction over all T weights; gate KL backward: one kernel per chunk.

What stays eager: finding the uncovered weights (``nonzero``) and gathering their rows of the (W, K)
parameters (so the gradients reach the parameters through the deterministic backward of indexing), the
table's ``topk``, and the float64 ``index_add_`` that sums per-weight gradients into the (W, K) parameters
(compiled, it becomes atomic adds whose order, hence result, varies between runs with several threads).
The backward works in chunks so that its float64 temporaries stay O(CHUNK_ELEMENTS).

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

from .chunked import (
    _chunk_ranges,
    _full_grads,
    _gate_probs,
    _Uncovered,
    _uncovered_chunks,
    gather,
)
from .mixture import HALF_LOG_2PI, PAPER_CLAMP
from .onehot import _bin_bounds, bin_index, bin_table

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


def _moments_first(theta, gate_logits, mask, window_ids, mean_radius, owner, best, low, inv_width, tau):
    """(θ^avg = λ̃ μ_{k*}, k*, certified) of every weight, as if every weight were certified."""
    kstar, mean, certified = _certify(theta, window_ids, mean_radius, owner, best, low, inv_width)
    return _gate_probs(gate_logits, mask, tau)[2] * mean, kstar, certified


def _moments_second(
    theta, gate_logits, mask, window_ids, mean_radius, owner, best, low, inv_width, tau, log_stds, k, spike_var
):
    """(θ^avg, Var_q = λ̃ (μ² + σ²) − (λ̃ μ)² + (1 − λ̃) σ_0², k*, certified) at k* (flat ``log_stds``)."""
    kstar, m, certified = _certify(theta, window_ids, mean_radius, owner, best, low, inv_width)
    lam = _gate_probs(gate_logits, mask, tau)[2]
    s = m * m + torch.exp(2 * log_stds[_flat(window_ids, kstar, k)])
    return lam * m, (lam * s - (lam * m) ** 2 + (1 - lam) * spike_var).clamp_min(0), kstar, certified


def _one_hot_backward(
    gate_logits, mask, window_ids, kstar, certified, means, log_stds, grad_mean, grad_var, tau, k, spike_var
):
    """(flat index w·K + k*, ∂/∂μ_{k*} (float64), ∂/∂log σ_{k*} (float64) or None, ∂/∂s̃) of one chunk,
    as chunked._one_hot_grads and the ∂/∂s̃ of _PosteriorMoments.backward compute them; ∂/∂s̃ of weights
    that are not certified is overwritten by the caller. ``grad_var`` None: the plug-in (no Var)."""
    _, lam_raw, lam = _gate_probs(gate_logits, mask, tau)
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
    return flat, dm.double(), d_log_std, dlam * lam * (1 - lam_raw) / tau


def _gate_kl_sum(gate_logits, mask, window_ids, kstar, component_kl, tau, k, log_keep, log_drop):
    """Σ_i λ̃_i KL_{w_i,k*_i} + Σ_i KL(Bern(λ̃_i)‖Bern(λ)) in float64 (``log_keep`` None: no Bernoulli term);
    KL(Bern) as mixture.bernoulli_kl with log λ, log(1 − λ) given; a masked gate's term is −log(1 − λ)."""
    scaled = gate_logits / tau
    e = torch.exp(-scaled.abs())  # softplus(±ℓ) = relu(±ℓ) + log1p(e^{-|ℓ|}), sigmoid(ℓ) from the same e
    q = torch.where(scaled >= 0, 1.0, e) / (1 + e)
    total = (torch.where(mask, q, 0.0) * component_kl[_flat(window_ids, kstar, k)]).sum(dtype=torch.float64)
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
    dkl_dlam = component_kl[flat] if prior_logit is None else component_kl[flat] + (scaled - prior_logit)
    return flat, lam.double(), dkl_dlam * lam * (1 - lam_raw) * (grad / tau)


def _log_density_columns(th, mu, log_std, log_mix):
    """q_ki = log π_k + log N(θ_i | μ_k, σ_k²) on gathered (K, n) columns: mixture.component_log_density
    transposed, so that the reductions over k are vectorised along the weights."""
    z = (th - mu) * torch.exp(-log_std)
    return log_mix - log_std - HALF_LOG_2PI - 0.5 * z * z


def _full_columns(th, mu, log_std, log_mix, temperature, kind, second):
    """(m = Σ_k φ_k μ_k, s = Σ_k φ_k (μ_k² + σ_k²) or None, argmax_k φ_k) of n weights on gathered
    (K, n) columns, φ of eq. compute-phi-k (mixture.log_responsibilities): chunked._full_moments."""
    q = _log_density_columns(th, mu, log_std, log_mix)
    if kind == "paper":
        q = torch.softmax(torch.exp(q.clamp(max=PAPER_CLAMP)), dim=0)  # φ', as mixture._paper_first_stage
    log_phi = F.log_softmax(q / temperature, dim=0)
    phi = log_phi.exp()
    s = (phi * (mu * mu + torch.exp(2 * log_std))).sum(0) if second else None
    return (phi * mu).sum(0), s, log_phi.argmax(0)


def _nearby_columns(th, mu, inv_std, const, total_mu, total_sq, lumped_count, temperature):
    """chunked._nearby_moments on gathered (NEARBY, n) columns (``inv_std`` = 1/σ_c, ``const`` = log π_c − log σ_c
    − ½ log 2π): φ_c of the nearby components and one φ_l shared by the L = ``lumped_count`` lumped ones;
    ``total_mu``, ``total_sq``: Σ_k μ_k, Σ_k (μ_k² + σ_k²) of each weight's window (``total_sq`` None: no s).
    Each stage's exponentials are taken once and normalised by their sum (the log-sum-exps of the eager code
    take them again), and 1/σ comes gathered: 26 exponentials per weight instead of about 55. Returns
    (m, s or None, argmax_c φ_c)."""
    z = (th - mu) * inv_std
    a = torch.exp((const - 0.5 * z * z).clamp(max=PAPER_CLAMP))  # π N: the first stage's inputs
    top = torch.clamp(a.amax(0), min=0.0)  # the lumped components have a = 0
    e, e_l = torch.exp(a - top), torch.exp(-top)
    scale = 1.0 / ((e.sum(0) + e_l * lumped_count) * temperature)
    stage2, stage2_l = e * scale, e_l * scale  # φ'/τ
    top2 = torch.maximum(stage2.amax(0), stage2_l)
    f, f_l = torch.exp(stage2 - top2), torch.exp(stage2_l - top2)
    norm = 1.0 / (f.sum(0) + f_l * lumped_count)
    phi_c, phi_l = f * norm, f_l * norm
    m = (phi_c * mu).sum(0) + phi_l * (total_mu - mu.sum(0))
    s = None
    if total_sq is not None:
        level_sq = mu * mu + 1.0 / (inv_std * inv_std)
        s = (phi_c * level_sq).sum(0) + phi_l * (total_sq - level_sq.sum(0))
    return m, s, phi_c.argmax(0)


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
        _nearby_columns,
    )
}


def _uncovered_moments(th, wid, near, table, means, log_stds, log_mix, spec, second):
    """chunked._uncovered_moments with the (K, n) or (NEARBY, n) evaluation compiled; the gathers stay
    eager, so the gradients reach the (W, K) parameters through their deterministic eager backward."""
    k = means.shape[1]
    temperature = _scalar(spec.temperature)
    if not near:
        columns = [p.t().index_select(1, wid) for p in (means, log_stds, log_mix)]  # (K, n)
        m, s, best = KERNELS["_full_columns"](th, *columns, temperature, spec.kind, second)
        return m, s, best.to(torch.uint8)
    bins = bin_index(th.detach(), table)
    nearby = torch.stack([column.index_select(0, bins) for column in table.nearby.unbind(1)])  # (NEARBY, n) flat
    tables = (means, torch.exp(-log_stds), log_mix - log_stds - HALF_LOG_2PI)  # μ, 1/σ, log π − log σ − ½ log 2π
    columns = [gather(p.reshape(-1), nearby) for p in tables]
    total_sq = gather((means * means + torch.exp(2 * log_stds)).sum(-1), wid) if second else None
    lumped = _scalar(float(k - nearby.shape[0]))
    m, s, pos = KERNELS["_nearby_columns"](th, *columns, gather(means.sum(-1), wid), total_sq, lumped, temperature)
    best = nearby.gather(0, pos[None]).squeeze(0)
    return m, s, (best - wid * k).to(torch.uint8)


def _certified_moments(theta, gate_logits, mask, window_ids, log_stds, table, spec, second):
    """(θ^avg, Var or empty, k*, certified) of every weight as if its φ were one-hot at the certificate's
    k* (right for the certified weights; the caller overwrites the others)."""
    bins = (table.mean_radius, table.owner, table.best, _scalar(table.low), _scalar(table.inv_width))
    tau = _scalar(spec.gate_temperature)
    if second:
        args = (*bins, tau, log_stds.detach().reshape(-1), log_stds.shape[1], _scalar(spec.spike_variance))
        mean, var, kstar, certified = KERNELS["_moments_second"](theta, gate_logits, mask, window_ids, *args)
    else:
        mean, kstar, certified = KERNELS["_moments_first"](theta, gate_logits, mask, window_ids, *bins, tau)
        var = theta.new_zeros(0)
    return mean, var, kstar, certified.view(torch.bool)  # 0/1 bytes


def _one_hot_gradients(param_grads, gate_logits, mask, window_ids, kstar, certified, means, log_stds, gm, gv, spec):
    """Accumulate the certified weights' gradients into ``param_grads`` (float64, as chunked does) and
    return ∂/∂s̃ of every weight as if it were certified, chunk by chunk (float64 temporaries stay small)."""
    g_gate = torch.empty_like(gate_logits)
    consts = (means.detach().reshape(-1), log_stds.detach().reshape(-1))
    scalars = (_scalar(spec.gate_temperature), means.shape[1], _scalar(spec.spike_variance))
    for a, b in _chunk_ranges(gate_logits.numel(), 1):
        chunk = (gate_logits[a:b], mask[a:b], window_ids[a:b], kstar[a:b], certified[a:b], *consts, gm[a:b])
        flat, d_mean, d_log_std, g_gate[a:b] = KERNELS["_one_hot_backward"](
            *chunk, (gv[a:b] if gv is not None else None), *scalars
        )
        param_grads[0].index_add_(0, flat, d_mean)
        if d_log_std is not None:
            param_grads[1].index_add_(0, flat, d_log_std)
    return g_gate


class FusedPosteriorMoments(torch.autograd.Function):
    """chunked._PosteriorMoments with the per-weight passes fused: the same (θ^avg, Var or empty, k*).
    The uncovered weights' indices are kept from forward to backward (8 bytes each) rather than found again."""

    @staticmethod
    def forward(ctx, theta, gate_logits, means, log_stds, mixing_logits, mask, window_ids, spec, second, ranges):
        log_mix = F.log_softmax(mixing_logits, dim=-1)
        args = (theta, window_ids, means, log_stds, log_mix, spec.kind, spec.temperature, ranges)
        table = bin_table(*args, bounds=KERNELS["_bin_bounds"])
        mean, var, kstar, certified = _certified_moments(
            theta, gate_logits, mask, window_ids, log_stds, table, spec, second
        )
        blocks = [
            (u, near) for u, near in _uncovered_chunks(theta, window_ids, certified, table, means.shape[1]) if u.numel()
        ]
        for u, near in blocks:
            wid = window_ids[u].long()
            m, s, kstar[u] = _uncovered_moments(theta[u], wid, near, table, means, log_stds, log_mix, spec, second)
            lam = _gate_probs(gate_logits[u], mask[u], spec.gate_temperature)[2]
            mean[u] = lam * m
            if s is not None:
                var[u] = (lam * s - (lam * m) ** 2 + (1 - lam) * spec.spike_variance).clamp_min(0)
        ctx.save_for_backward(theta, gate_logits, means, log_stds, mixing_logits, mask, window_ids, kstar, certified)
        ctx.spec, ctx.second, ctx.table, ctx.blocks = spec, second, table, blocks
        ctx.mark_non_differentiable(kstar)
        return mean, var, kstar

    @staticmethod
    def backward(ctx, grad_mean, grad_var, _grad_kstar):
        theta, gate_logits, means, log_stds, mixing_logits, mask, window_ids, kstar, certified = ctx.saved_tensors
        spec, gv = ctx.spec, (grad_var if ctx.second else None)
        leaves = [p.detach().requires_grad_() for p in (means, log_stds, mixing_logits)]
        param_grads = [torch.zeros(p.numel(), dtype=torch.float64, device=p.device) for p in leaves]
        g_theta = torch.zeros_like(theta) if ctx.needs_input_grad[0] else None
        one_hot = (gate_logits, mask, window_ids, kstar, certified, means, log_stds, grad_mean, gv, spec)
        g_gate = _one_hot_gradients(param_grads, *one_hot)
        for u, near in ctx.blocks:  # the uncovered weights: recomputed with a graph, as in chunked
            _, lam_raw, lam = _gate_probs(gate_logits[u], mask[u], spec.gate_temperature)
            block, gm = _Uncovered(0, u, window_ids[u].long(), near, ctx.table), grad_mean[u]
            m, s = _full_grads(param_grads, g_theta, block, leaves, theta, spec, gm, gv, lam, _uncovered_moments)
            dlam = gm * m if gv is None else gm * m + gv[u] * (s - 2 * lam * m * m - spec.spike_variance)
            g_gate[u] = dlam * lam * (1 - lam_raw) / spec.gate_temperature
        grads = [g.to(p.dtype).reshape(p.shape) for g, p in zip(param_grads, leaves, strict=True)]
        return g_theta, g_gate, *grads, None, None, None, None, None


def gate_kl_total(gate_logits, component_kl, mask, window_ids, kstar, gate_temperature, prior_keep):
    """chunked._gate_kl_total as one kernel over all T weights (float64 sum)."""
    logs = (None, None) if prior_keep is None else (_scalar(math.log(prior_keep)), _scalar(math.log1p(-prior_keep)))
    args = (component_kl.reshape(-1), _scalar(gate_temperature), component_kl.shape[1], *logs)
    return KERNELS["_gate_kl_sum"](gate_logits, mask, window_ids, kstar, *args)


def gate_kl_chunk_grads(gate_logits, component_kl, mask, window_ids, kstar, tau, prior_keep, grad):
    """chunked._gate_kl_chunk_grads as one kernel."""
    prior_logit = None if prior_keep is None else _scalar(math.log(prior_keep) - math.log1p(-prior_keep))
    args = (component_kl.reshape(-1), _scalar(tau), component_kl.shape[1], prior_logit, grad)
    return KERNELS["_gate_kl_backward"](gate_logits, mask, window_ids, kstar, *args)
