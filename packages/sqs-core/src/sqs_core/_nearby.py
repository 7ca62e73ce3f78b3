"""Uncovered weights on their bin's nearby components, eagerly: the forward and a hand-derived backward.

Under the paper's formula (eq. compute-phi-k) a weight the one-hot certificate does not cover is evaluated
on its bin's ``width`` nearby components c plus one lumped term for the L = K − width others, whose
e^{π N} rounds to exactly 1 (:func:`sqs_core.onehot.lump_log_density`):

    q_c = log π_c − log σ_c − ½ log 2π − ½ z_c²,  z_c = (θ − μ_c)/σ_c,   a_c = e^{min(q_c, 80)} = π_c N_c
    φ'_c = e^{a_c} / (Σ_c e^{a_c} + L),  φ'_l = 1 / (Σ_c e^{a_c} + L)                    (first softmax)
    x = φ'/τ,  φ_c = e^{x_c} / (Σ_c e^{x_c} + L e^{x_l}),  φ_l likewise                  (second softmax)
    m = Σ_c φ_c μ_c + φ_l (Σ_k μ_k − Σ_c μ_c),  s = the same with μ² + σ²

Its gradient, for cotangents G_m, G_s of m and s (per weight):

    ∂/∂x_c = φ_c (G_m (μ_c − m) + G_s (v_c − s)),  ∂/∂x_l = φ_l (G_m (R_μ − L m) + G_s (R_v − L s))
    ∂/∂a_c = x_c (∂/∂x_c − τ D),  D = Σ_c x_c ∂/∂x_c + x_l ∂/∂x_l                          (softmax vjp)
    ∂/∂q_c = a_c ∂/∂a_c (0 where q_c > 80),  and z, μ, σ, θ from there by the chain rule,

with v = μ² + σ², R = the window's total minus the nearby sum. Where even a bin's largest bound is below the
lumping threshold (onehot.ALL_LUMPED) every component is lumped: φ = 1/K, m = Σ_k μ_k / K and s likewise, so
:func:`lumped_moments` evaluates no component (but k*) and :func:`lumped_vjp` sums ∂/∂m / K into the totals.

Everything is on (width, n) columns, so the sums over c reduce along the first dimension, vectorised over the
weights. Against autograd through the same formula this takes 2.6× less time on the uncovered weights of a
trained 4096² layer (2.2 against 0.8 s for 2.7M weights of width 4) and, in float32, rounds less: its
gradients were 0.1% from a float64 evaluation where autograd's log-sum-exp chain was 4.5%.
``tests/core/test_onehot.py`` checks values and gradients against autograd on the full K-component formula at
every width.

The compiled path evaluates the same formula and gradient with the loop over c unrolled
(sqs_core._fused_nearby: inductor then emits one loop over the weights), with φ, the moments and the
gradient products in float64 (no subnormals); unrolled, eager torch would make width times as many calls.
Both paths gather from the same tables (μ, 1/σ and log π − log σ − ½ log 2π per component, each window's
Σ μ and Σ (μ² + σ²)), and both sum their column gradients into :class:`TableGradients`, which takes them to
(μ, log σ, mixing logits) once per backward, by hand, in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._index_add import index_add_all
from .mixture import HALF_LOG_2PI, PAPER_CLAMP, exp_floor

__all__ = [
    "NearbyTables",
    "TableGradients",
    "add_total_grads",
    "cotangents",
    "exp_floor",
    "level_sq_totals",
    "lumped_grads",
    "lumped_moments",
    "lumped_vjp",
    "nearby_grads",
    "nearby_moments",
    "nearby_tables",
    "nearby_vjp",
]


def cotangents(grad_mean, grad_var, lam, m):
    """(G_m, G_s or None): ∂L/∂m = ∂L/∂θ^avg λ̃ − 2 ∂L/∂Var λ̃² m and ∂L/∂s = ∂L/∂Var λ̃ through θ^avg = λ̃ m and
    Var = λ̃ s − (λ̃ m)² + (1 − λ̃) σ_0², for ∂L/∂θ^avg = ``grad_mean`` and ∂L/∂Var = ``grad_var`` (None: Var unused).
    Every backward that recomputes m and s (eager, compiled, dense, autograd's all-K) starts from these."""
    grad_m = grad_mean * lam
    if grad_var is None:
        return grad_m, None
    grad_s = grad_var * lam
    return grad_m - 2 * grad_s * lam * m, grad_s


def nearby_tables(means, log_stds, log_mix):
    """μ, 1/σ and log π − log σ − ½ log 2π per component, (W, K) each: what a nearby evaluation gathers."""
    return means, torch.exp(-log_stds), log_mix - log_stds - HALF_LOG_2PI


def level_sq_totals(means, log_stds):
    """Σ_k (μ_k² + σ_k²) per window, (W,)."""
    return (means * means + torch.exp(2 * log_stds)).sum(-1)


@dataclass(frozen=True)
class NearbyTables:
    """The flat (W·K,) :func:`nearby_tables`, the (W,) Σ_k μ_k and Σ_k (μ_k² + σ_k²) (None: no s), and K."""

    columns: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    total_mu: torch.Tensor
    total_sq: torch.Tensor | None
    k: int

    @classmethod
    def build(cls, means, log_stds, log_mix, second: bool) -> NearbyTables:
        means, log_stds, log_mix = means.detach(), log_stds.detach(), log_mix.detach()
        mu, inv_std, const = (t.reshape(-1) for t in nearby_tables(means, log_stds, log_mix))
        total_sq = level_sq_totals(means, log_stds) if second else None
        return cls((mu, inv_std, const), means.sum(-1), total_sq, means.shape[1])


@dataclass
class _State:
    """A forward's intermediates, (width, n) columns and (n,) rows, for :func:`nearby_vjp`."""

    mu: torch.Tensor
    inv_std: torch.Tensor
    offset: torch.Tensor  # θ − μ_c
    z: torch.Tensor
    q: torch.Tensor | None  # log π N, kept for k* (nearby_moments); None in backward
    a: torch.Tensor  # π N (clamped)
    clamped: torch.Tensor | None  # q_c outside [exp_floor, 80], where ∂a/∂q = 0 (None: not asked for)
    x: torch.Tensor  # φ'/τ
    x_l: torch.Tensor
    phi: torch.Tensor
    phi_l: torch.Tensor
    m: torch.Tensor
    rest_mu: torch.Tensor  # Σ_k μ_k − Σ_c μ_c of each weight's window
    second: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # s, μ_c² + σ_c², the rest's Σ: with s


def _evaluate(th, wid, flat, tables: NearbyTables, temperature: float, keep_q: bool = False) -> _State:
    """The forward of the module docstring for weights ``th`` (n,) of windows ``wid`` (int64) on the (width, n)
    flat component indices ``flat``; ``keep_q``: keep q apart from a (one more (width, n) tensor)."""
    lumped = float(tables.k - flat.shape[0])
    mu, inv_std, const = (t.index_select(0, flat.reshape(-1)).view(flat.shape) for t in tables.columns)
    offset = th - mu
    z = offset * inv_std
    q = torch.addcmul(const, z, z, value=-0.5)
    floor = exp_floor(q.dtype)  # every exp below takes its argument clamped here (exp_floor)
    clamped = None if keep_q else (q < floor).logical_or_(q > PAPER_CLAMP)  # for the backward only
    a = (q.clamp(floor, PAPER_CLAMP) if keep_q else q.clamp_(floor, PAPER_CLAMP)).exp_()
    top = a.amax(0).clamp_(min=0.0)  # the lumped components' π N is 0
    e, e_l = (a - top).clamp_(min=floor).exp_(), torch.exp((-top).clamp_(min=floor))
    scale = e.sum(0).add_(e_l, alpha=lumped).mul_(temperature).reciprocal_()
    x, x_l = e.mul_(scale), e_l.mul_(scale)
    top2 = torch.maximum(x.amax(0), x_l)
    phi, phi_l = (x - top2).clamp_(min=floor).exp_(), (x_l - top2).clamp_(min=floor).exp_()
    norm = phi.sum(0).add_(phi_l, alpha=lumped).reciprocal_()
    phi, phi_l = phi.mul_(norm), phi_l.mul_(norm)
    rest_mu = tables.total_mu.index_select(0, wid) - mu.sum(0)
    m = torch.linalg.vecdot(phi, mu, dim=0).addcmul_(phi_l, rest_mu)
    state = _State(mu, inv_std, offset, z, q if keep_q else None, a, clamped, x, x_l, phi, phi_l, m, rest_mu)
    if tables.total_sq is not None:
        level_sq = torch.addcmul(inv_std.reciprocal().square_(), mu, mu)
        rest_sq = tables.total_sq.index_select(0, wid) - level_sq.sum(0)
        state.second = (torch.linalg.vecdot(phi, level_sq, dim=0).addcmul_(phi_l, rest_sq), level_sq, rest_sq)
    return state


@torch.no_grad()
def nearby_moments(th, wid, flat, tables: NearbyTables, temperature: float):
    """(m, s or None, k* uint8 within the window) of weights ``th`` (windows ``wid``, int64) on the (width, n)
    flat component indices ``flat`` (int64); k* = argmax_c log(π_c N_c), the first of ties as torch.argmax: φ_c
    increases with π_c N_c, but where every e^{π_c N_c} rounds to 1 (a weight far from all of them) φ ties,
    and its first (the largest bound) need not be the largest π_c N_c. The argmax is over the nearby
    components, the bin's largest bounds Q_bk (sqs_core.onehot); a lumped one's π N lies below its own bound,
    which is below theirs, though not necessarily below their values at θ."""
    state = _evaluate(th, wid, flat, tables, temperature, keep_q=True)
    assert state.q is not None
    position = state.q.max(0, keepdim=True).indices  # 12× faster here than argmax(0), the same ties
    best = flat.gather(0, position).squeeze(0)
    return state.m, (None if state.second is None else state.second[0]), (best - wid * tables.k).to(torch.uint8)


@torch.no_grad()
def lumped_moments(th, wid, flat, tables: NearbyTables, temperature: float):
    """:func:`nearby_moments` of weights in bins where every component is lumped (onehot.ALL_LUMPED): every
    e^{π_k N_k} rounds to 1, so φ_k = 1/K exactly (the full formula in θ's dtype gives the same) and
    m = Σ_k μ_k / K, s = Σ_k (μ_k² + σ_k²) / K; no exponential is taken. k* as :func:`nearby_moments` gives
    it, the argmax of log π_c N_c over the (columns, n) flat indices ``flat``. ``temperature``: unused."""
    mu, inv_std, const = (t.index_select(0, flat.reshape(-1)).view(flat.shape) for t in tables.columns)
    z = (th - mu).mul_(inv_std)
    best = flat.gather(0, torch.addcmul(const, z, z, value=-0.5).max(0, keepdim=True).indices).squeeze(0)
    m, s = _lumped_levels(wid, tables)
    return m, s, (best - wid * tables.k).to(torch.uint8)


def _lumped_levels(wid, tables: NearbyTables):
    """(Σ_k μ_k / K, Σ_k (μ_k² + σ_k²) / K or None) of each weight's window ``wid``."""
    total_sq = tables.total_sq
    return tables.total_mu.index_select(0, wid) / tables.k, (
        None if total_sq is None else total_sq.index_select(0, wid) / tables.k
    )


@torch.no_grad()
def lumped_vjp(wid, tables: NearbyTables, grad_mean, grad_var, lam):
    """:func:`nearby_vjp` of weights in all-lumped bins: (m, s or None, [∂/∂Σμ, and with Var ∂/∂Σ(μ²+σ²)]).
    m and s depend on the window's totals alone (∂/∂θ = 0): the terms :func:`nearby_vjp` would form through
    ∂(π N)/∂q = π N ≤ e^{lump_log_density} are dropped, as for the lumped components of every nearby bin. On
    the 4096² layer's step-350 state (float32) this moved ∂/∂(μ, log σ, mixing logits) by ≤ 4e-8 and ∂/∂s̃
    by ≤ 2e-6 relative (L2) against evaluating those bins at width 4 (docs/method.md, "Session 34")."""
    m, s = _lumped_levels(wid, tables)
    grad_m, grad_s = cotangents(grad_mean, grad_var, lam, m)
    return m, s, [g / tables.k for g in (grad_m, grad_s) if g is not None]


@torch.no_grad()
def nearby_vjp(th, wid, flat, tables: NearbyTables, temperature: float, grad_mean, grad_var, lam):
    """Recompute weights as :func:`nearby_moments` and pull back ∂L/∂θ^avg = ``grad_mean`` and ∂L/∂Var =
    ``grad_var`` (None: Var unused) through θ^avg = λ̃ m and Var = λ̃ s − (λ̃ m)² + ... (λ̃ = ``lam``), all (n,):
    the cotangents G_m = ∂L/∂θ^avg λ̃ − 2 ∂L/∂Var λ̃² m and G_s = ∂L/∂Var λ̃ of the module docstring. Returns
    (m, s or None, ∂/∂θ (n,), [∂/∂μ_c, ∂/∂(1/σ_c), ∂/∂const_c] (width, n) each, [∂/∂Σμ, and with Var
    ∂/∂Σ(μ²+σ²)] (n,) each)."""
    st = _evaluate(th, wid, flat, tables, temperature)
    lumped = float(tables.k - flat.shape[0])
    grad_m, grad_s = cotangents(grad_mean, grad_var, lam, st.m)
    g_x = (st.mu - st.m).mul_(grad_m)
    g_x_l = (st.rest_mu - lumped * st.m).mul_(grad_m)
    if grad_s is not None and st.second is not None:
        s, level_sq, rest_sq = st.second
        g_x.add_((level_sq - s).mul_(grad_s))
        g_x_l.add_((rest_sq - lumped * s).mul_(grad_s))
    g_x.mul_(st.phi)
    g_x_l.mul_(st.phi_l)
    total = torch.linalg.vecdot(st.x, g_x, dim=0).addcmul_(st.x_l, g_x_l).mul_(temperature)  # τ D
    g_q = g_x.sub_(total).mul_(st.x).mul_(st.a)  # ∂/∂q_c
    assert st.clamped is not None  # asked for: keep_q is False
    g_q.masked_fill_(st.clamped, 0.0)
    g_qz = g_q * st.z  # −∂/∂z_c
    g_offset = g_qz * st.inv_std  # −∂/∂(θ − μ_c)
    g_th = g_offset.sum(0).neg_()
    spread = st.phi - st.phi_l  # ∂m/∂μ_c, directly
    g_mu = g_offset.addcmul_(spread, grad_m)
    g_inv = g_qz.mul_(st.offset).neg_()
    totals = [grad_m * st.phi_l]
    if grad_s is not None:
        g_mu.addcmul_(spread, 2 * st.mu * grad_s)
        g_inv.addcmul_(spread, st.inv_std.pow(-3).mul_(-2 * grad_s))  # ∂σ²/∂(1/σ) = −2σ³
        totals.append(grad_s * st.phi_l)
    return st.m, (None if st.second is None else st.second[0]), g_th, [g_mu, g_inv, g_q], totals


class TableGradients:
    """Column gradients of :func:`nearby_vjp` summed into the (W, K) tables and the (W,) totals (float64,
    deterministic ``index_add_``), then taken to ∂/∂(μ, log σ, mixing logits) once: :meth:`into`. ``leaves``:
    the (W, K) means, log σ and mixing logits; ``tables``: the :class:`NearbyTables` made from them."""

    def __init__(self, leaves, second: bool) -> None:
        self.leaves, self.second, self.used = leaves, second, False
        means, log_stds, mixing_logits = (t.detach() for t in leaves)
        log_mix = torch.log_softmax(mixing_logits, dim=-1)
        self.tables = NearbyTables.build(means, log_stds, log_mix, second)
        self.columns = [torch.zeros(means.numel(), dtype=torch.float64, device=means.device) for _ in range(3)]
        self.totals = [torch.zeros(means.shape[0], dtype=torch.float64, device=means.device) for _ in range(1 + second)]

    def add(self, flat, wid, column_grads, total_grads) -> None:
        """Sum (width, n) ``column_grads`` at the flat component indices ``flat`` and (n,) ``total_grads`` at the
        windows ``wid`` (both int64). Columns of another dtype go through one float64 buffer in turn, not three
        float64 copies at once (24 MiB for a block of 2^20 entries); float64 ones (the compiled kernels') are summed
        as they are (copied through the buffer, they cost the compiled 4096² step ~9 ms, session 51)."""
        flat, self.used, source = flat.reshape(-1), True, None
        for acc, g in zip(self.columns, column_grads, strict=True):
            g = g.reshape(-1)
            if g.dtype != torch.float64:
                g = source = g.double() if source is None else source.copy_(g)
            index_add_all([(acc, flat, g)])
        index_add_all(self._total_jobs(wid, total_grads))

    def add_totals(self, wid, total_grads) -> None:
        """Sum (n,) ``total_grads`` at the windows ``wid`` (int64): weights with no column (all lumped)."""
        self.used = True
        index_add_all(self._total_jobs(wid, total_grads))

    def _total_jobs(self, wid, total_grads):
        return [(acc, wid, g.double()) for acc, g in zip(self.totals, total_grads, strict=True)]

    def into(self, param_grads) -> None:
        """Add ∂/∂(μ, log σ, mixing logits) to the float64 flat ``param_grads``, in float64: the tables are
        μ, e^{−log σ}, log softmax(mixing logits) − log σ − ½ log 2π, Σ_k μ_k and Σ_k (μ_k² + e^{2 log σ_k})."""
        if not self.used:
            return
        means, log_stds, mixing_logits = (t.detach().double() for t in self.leaves)
        g_mu, g_inv, g_const = (c.view(means.shape) for c in self.columns)
        g_means = g_mu.clone()
        g_log_stds = -(g_inv * torch.exp(-log_stds)) - g_const
        add_total_grads(g_means, g_log_stds, means, log_stds, self.totals[0], self.totals[1] if self.second else None)
        g_logits = g_const - torch.softmax(mixing_logits, dim=-1) * g_const.sum(-1, keepdim=True)
        for acc, g in zip(param_grads, (g_means, g_log_stds, g_logits), strict=True):
            acc += g.reshape(-1)


def add_total_grads(g_means, g_log_stds, means, log_stds, g_total_mu, g_total_sq) -> None:
    """In place, (W, K) float64: add to ∂/∂μ and ∂/∂log σ what the (W,) gradients ``g_total_mu`` of Σ_k μ_k and
    ``g_total_sq`` of Σ_k (μ_k² + e^{2 log σ_k}) (None: no Var) give, at the float64 ``means``, ``log_stds``."""
    g_means += g_total_mu[:, None]
    if g_total_sq is not None:
        g_sq = g_total_sq[:, None]
        g_means += 2 * means * g_sq
        g_log_stds += 2 * torch.exp(2 * log_stds) * g_sq


@dataclass(frozen=True)
class _Uncovered:
    """Weights of a chunk the certificate did not cover: local indices ``u`` of the chunk starting at ``a``,
    their int64 windows, θ, ∂L/∂θ^avg, ∂L/∂Var (None: Var unused) and masked λ̃."""

    a: int
    u: torch.Tensor
    wid: torch.Tensor
    theta: torch.Tensor
    grad_mean: torch.Tensor
    grad_var: torch.Tensor | None
    lam: torch.Tensor

    @classmethod
    def gather(cls, a, u, wid, theta, grad_mean, grad_var, lam) -> _Uncovered:
        """The block of local indices ``u`` (int64) of the chunk from ``a`` whose (n,) tensors are given, gathered
        by ``index_select`` (3× faster than ``x[u]`` on 1-D tensors)."""
        th, gm, lm = (t.index_select(0, u) for t in (theta, grad_mean, lam))
        gv = None if grad_var is None else grad_var.index_select(0, u)
        return cls(a, u, wid.index_select(0, u).long(), th, gm, gv, lm)


def nearby_grads(g_theta, block: _Uncovered, flat, nearby: TableGradients, spec):
    """The uncovered weights of ``block`` on their nearby components, the (width, n) flat indices ``flat``
    (sqs_core._nearby), their gradients by hand: summed into ``nearby``, ∂/∂θ into ``g_theta`` (or None). Returns
    their (m, s) values."""
    args = (block.theta, block.wid, flat, nearby.tables, spec.temperature, block.grad_mean, block.grad_var, block.lam)
    m, s, g_th, column_grads, total_grads = nearby_vjp(*args)
    nearby.add(flat, block.wid, column_grads, total_grads)
    if g_theta is not None:
        g_theta[block.a :].index_copy_(0, block.u, g_th.to(g_theta.dtype))
    return m, s


def lumped_grads(block: _Uncovered, nearby: TableGradients):
    """:func:`nearby_grads` of a block of all-lumped weights (sqs_core._nearby.lumped_vjp): their gradients
    summed into ``nearby``'s window totals (∂/∂θ is 0). Returns their (m, s) values."""
    m, s, total_grads = lumped_vjp(block.wid, nearby.tables, block.grad_mean, block.grad_var, block.lam)
    nearby.add_totals(block.wid, total_grads)
    return m, s
