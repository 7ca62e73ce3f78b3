"""All-lumped bins whose k* is one component for every weight in them (onehot.LUMPED_SETTLED).

In a bin where every component is lumped (onehot.ALL_LUMPED, the paper's formula) φ_k = 1/K exactly, so a weight's
θ^avg = λ̃ Σ_k μ_k / K and Var need no component at all; only its k* does, the argmax of
q_c(θ) = log π_c − log σ_c − ½ log 2π − ½ (θ − μ_c)²/σ_c² over the bin's first onehot.LUMPED_SCAN ``nearby`` columns
(sqs_core._nearby.lumped_moments), which the gate KL takes at k*. Where one column c wins at every θ of the
(padded) bin, by more than rounding can move the q's, every weight of the bin has that k*: the bin is *settled*,
and both training steps treat its weights like certified ones (one table lookup each, no index, no block;
eagerly sqs_core._one_hot, compiled sqs_core._fused), with m = Σ_k μ_k / K in place of μ_{k*} and their gradients
summed per window.

q_c − q_d is a quadratic in θ, concave or linear unless σ_d < σ_c; its smallest value over [lo, hi] is at an end
or, when convex, at its vertex clamped into the interval: the three points checked here. The margin: q is formed
in the weights' dtype as c − ½ ((θ − μ)/σ)², whose rounding error is below 4 eps (|q| + |c|); a difference of two
is trusted when it exceeds :data:`SETTLE_ULPS` eps (|q_c| + |q_d| + |c_c| + |c_d|), a fourfold reserve. A
column of the same component as c (a repeated flat index: K < onehot.LUMPED_SCAN) is no rival: either gives the
same k*. A bin whose winning q could overflow the dtype anywhere (far components: −inf ties) is not settled.
"""

from __future__ import annotations

import torch

from ._nearby import add_total_grads, level_sq_totals

__all__ = ["SETTLE_ULPS", "fold_settled", "level_tables", "settled_columns", "window_mean"]

SETTLE_ULPS = 16.0


def settled_columns(flat, tables, low, high, dtype) -> torch.Tensor:
    """(n,) int64: for n bins [``low``, ``high``] (float64) with (n, C) flat component indices ``flat`` (int64) into
    the flat ``tables`` (μ, 1/σ, log π − log σ − ½ log 2π, as sqs_core._nearby.nearby_tables, in ``dtype``), the
    flat index of the column whose q wins over the whole bin by the rounding margin, −1 where none does."""
    mu, inv_std, const = (t.reshape(-1).double()[flat] for t in tables)
    curvature = inv_std * inv_std
    low, high = low[:, None], high[:, None]
    choice = _log_density(0.5 * (low + high), mu, curvature, const).argmax(1, keepdim=True)
    mu_c, curv_c, const_c, flat_c = (t.gather(1, choice) for t in (mu, curvature, const, flat))
    convex = curvature > curv_c  # q_c − q_d convex: its least value may be inside the bin
    safe_gap = torch.where(convex, curvature - curv_c, torch.ones_like(curvature))
    vertex = torch.where(convex, (curvature * mu - curv_c * mu_c) / safe_gap, low.expand_as(mu))
    eps, huge = torch.finfo(dtype).eps, 0.25 * torch.finfo(dtype).max
    settled = torch.ones(flat.shape[0], dtype=torch.bool, device=flat.device)
    for theta in (low.expand_as(mu), high.expand_as(mu), torch.minimum(torch.maximum(vertex, low), high)):
        q_c = _log_density(theta, mu_c, curv_c, const_c)
        q_d = _log_density(theta, mu, curvature, const)
        margin = SETTLE_ULPS * eps * (q_c.abs() + q_d.abs() + const_c.abs() + const.abs())
        wins = (q_c - q_d > margin) | (flat == flat_c)
        settled &= wins.all(1) & (q_c > -huge).all(1)
    return torch.where(settled, flat_c.squeeze(1), torch.full_like(flat_c.squeeze(1), -1))


def _log_density(theta, mu, curvature, const):
    """q = const − ½ curvature (θ − μ)², float64."""
    offset = theta - mu
    return const - 0.5 * curvature * offset * offset


def level_tables(means, log_stds, second: bool):
    """The (2·W·K,) tables the compiled one-hot kernels (sqs_core._fused) read at w·K + k* + W·K·[settled]: m, the mean
    level (μ_k, then each window's Σ_k μ_k / K, K times), and with ``second`` s − m² where certified (σ_k²) and s
    where settled (each window's Σ_k (μ_k² + σ_k²) / K, K times), else None. No graph."""
    means, log_stds = means.detach(), log_stds.detach()
    levels = torch.cat([means.reshape(-1), window_mean(means)[:, None].expand_as(means).reshape(-1)])
    if not second:
        return levels, None
    settled_sq = (level_sq_totals(means, log_stds)[:, None] / means.shape[1]).expand_as(means)
    return levels, torch.cat([torch.exp(2 * log_stds).reshape(-1), settled_sq.reshape(-1)])


def window_mean(means):
    """(W,) Σ_k μ_k / K: every all-lumped weight's m (sqs_core._nearby.lumped_moments forms it alike); the settled
    bins' mean in the bin table (sqs_core.onehot) and the one-hot backward's table (:func:`level_tables`)."""
    return means.sum(-1) / means.shape[1]


def fold_settled(param_grads, accumulators, means, log_stds) -> None:
    """Add the (2·W·K,) float64 ``accumulators`` of the one-hot backward (∂/∂μ, ∂/∂log σ or None, Σ λ̃ or None),
    summed at :func:`level_tables`' entries, into ``param_grads`` = (∂/∂μ, ∂/∂log σ, Σ λ̃ per component or None):
    the first halves as they are; the second (settled weights: ∂L/∂m and ∂L/∂s of each, per window) through
    m = Σ_k μ_k / K and s = Σ_k (μ_k² + σ_k²) / K, as sqs_core._nearby.TableGradients.into takes the totals of
    all-lumped weights (:func:`sqs_core._nearby.add_total_grads`); the Σ λ̃ halves (the gate KL's, at k*) added."""
    (w, k), wk = means.shape, means.numel()
    mu_acc, spread_acc, kl_acc = accumulators
    g_means = mu_acc[:wk].view(w, k).clone()
    g_log_stds = None if spread_acc is None else spread_acc[:wk].view(w, k).clone()
    g_total_mu = mu_acc[wk:].view(w, k).sum(1) / k
    g_total_sq = None if spread_acc is None else spread_acc[wk:].view(w, k).sum(1) / k
    add_total_grads(g_means, g_log_stds, means.detach().double(), log_stds.detach().double(), g_total_mu, g_total_sq)
    param_grads[0].add_(g_means.reshape(-1))
    if g_log_stds is not None:
        param_grads[1].add_(g_log_stds.reshape(-1))
    if kl_acc is not None:
        param_grads[2].add_(kl_acc[:wk] + kl_acc[wk:])
