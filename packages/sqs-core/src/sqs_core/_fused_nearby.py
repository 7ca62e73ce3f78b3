"""The nearby evaluation of uncovered weights (sqs_core._nearby's formula) as unrolled rows, for the compiled
kernels of sqs_core._fused_uncovered: the forward and its hand-derived backward.

Each of the ``width`` nearby components c is a list entry of (n,) rows, so that inductor emits one loop over
the weights with no reduction in it; the module docstring of sqs_core._nearby gives the formula and its
gradient, which this module follows step for step (with its exp floor: every exp argument is raised to
``exp_floor`` and the backward takes ∂π N/∂q as 0 where q was raised or clamped at 80).

**Float64 after the exponentials.** The exps run in the weights' dtype; φ, the moments and every gradient
product are formed in float64. In float32 they went subnormal for a few percent of a trained layer's
(weight, component) pairs (φ ~ 1e-40 of a far component times a mean, times a gradient), and on x86 CPUs
every arithmetic instruction that reads or writes a subnormal takes a microcode assist unless FTZ/DAZ are
set, which PyTorch leaves off. On the uncovered weights of the 4096² layer's step-50 state (2.45M, Intel Xeon,
2 threads) one backward's kernels took 156–159 ms as torch.func.vjp of the float32 forward (session 30's code),
109–114 ms with this gradient in float32 and 62–64 ms with this split (docs/step-benchmarks.md, "Session 31").
No float64 product here comes near float64's subnormal range, and the results are the more accurate for it.
"""

from __future__ import annotations

import torch

from . import _nearby
from .mixture import PAPER_CLAMP, exp_floor

__all__ = ["lumped_rows", "nearby_rows", "nearby_rows_vjp"]


def _fold(op, rows):
    """op(...op(op(rows[0], rows[1]), rows[2])...): a reduction over an unrolled list of rows."""
    out = rows[0]
    for row in rows[1:]:
        out = op(out, row)
    return out


def _total(rows):
    """Σ over an unrolled list of rows."""
    return _fold(torch.add, rows)


def _stages(th, mu, inv_std, const, lumped_count, temperature):
    """The two softmaxes of eq. compute-phi-k on nearby rows: (θ − μ_c, z_c, q_c = log π_c N_c, the mask of q_c
    outside [exp_floor, 80], a_c = π_c N_c, x_c = φ'_c/τ, x_l, φ_c, φ_l); φ in float64, the rest in θ's dtype."""
    floor = exp_floor(th.dtype)
    offset, z, q = _log_densities(th, mu, inv_std, const)
    clamped = [(v < floor) | (v > PAPER_CLAMP) for v in q]
    a = [torch.exp(v.clamp(floor, PAPER_CLAMP)) for v in q]
    top = _fold(torch.maximum, a).clamp(min=0.0)  # the lumped components' π N is 0
    e, e_l = [torch.exp((v - top).clamp(min=floor)) for v in a], torch.exp((-top).clamp(min=floor))
    scale = 1.0 / ((_total(e) + e_l * lumped_count) * temperature)
    x, x_l = [v * scale for v in e], e_l * scale
    top2 = torch.maximum(_fold(torch.maximum, x), x_l)
    f = [torch.exp((v - top2).clamp(min=floor)).double() for v in x]
    f_l = torch.exp((x_l - top2).clamp(min=floor)).double()
    norm = 1.0 / (_total(f) + f_l * lumped_count)
    return offset, z, q, clamped, a, x, x_l, [v * norm for v in f], f_l * norm


def _log_densities(th, mu, inv_std, const):
    """(θ − μ_c, z_c, q_c = log π_c N_c) on nearby rows."""
    offset = [th - m for m in mu]
    z = [o * i for o, i in zip(offset, inv_std, strict=True)]
    return offset, z, [c - 0.5 * v * v for c, v in zip(const, z, strict=True)]


def _first_argmax(q):
    """argmax_c q_c over rows (int32), the first of ties as torch.argmax."""
    best, top_q = torch.zeros_like(q[0], dtype=torch.int32), q[0]
    for c in range(1, len(q)):
        better = q[c] > top_q
        best, top_q = torch.where(better, c, best), torch.where(better, q[c], top_q)
    return best


def _moment(phi, phi_l, levels, total):
    """Σ_c φ_c v_c + φ_l (the window's total − Σ_c v_c), in float64; returns (it, the rest's total)."""
    rest = total.double() - _total(levels)
    return _total([p * v for p, v in zip(phi, levels, strict=True)]) + phi_l * rest, rest


def _level_sq(mu, inv_std):
    """μ_c² + σ_c² in float64."""
    return [v * v + 1.0 / (i.double() * i.double()) for v, i in zip(mu, inv_std, strict=True)]


def nearby_rows(th, mu, inv_std, const, total_mu, total_sq, lumped_count, temperature):
    """(m, s or None, argmax_c log π_c N_c) of n weights ``th`` on width rows (n,) each of μ_c, 1/σ_c and
    ``const`` = log π_c − log σ_c − ½ log 2π, plus one lumped term for the L = ``lumped_count`` others; ``total_mu``,
    ``total_sq``: Σ_k μ_k, Σ_k (μ_k² + σ_k²) of each weight's window (``total_sq`` None: no s). m and s in float64."""
    _, _, q, _, _, _, _, phi, phi_l = _stages(th, mu, inv_std, const, lumped_count, temperature)
    mu64 = [v.double() for v in mu]
    m = _moment(phi, phi_l, mu64, total_mu)[0]
    s = None if total_sq is None else _moment(phi, phi_l, _level_sq(mu64, inv_std), total_sq)[0]
    return m, s, _first_argmax(q)  # argmax_c log π_c N_c: nearby._evaluate's k*


def lumped_rows(th, mu, inv_std, const, total_mu, total_sq, k):
    """:func:`nearby_rows` of weights whose every component is lumped (sqs_core._nearby.lumped_moments): m and s
    are the window's ``total_mu`` and ``total_sq`` over K = ``k`` (float64), the rows serve k* only."""
    m, s = total_mu.double() / k, (None if total_sq is None else total_sq.double() / k)
    return m, s, _first_argmax(_log_densities(th, mu, inv_std, const)[2])


def nearby_rows_vjp(th, mu, inv_std, const, totals, lumped_count, temperature, cotangents):
    """:func:`nearby_rows` and the pullback through θ^avg = λ̃ m and Var = λ̃ s − (λ̃ m)² + ... of ``cotangents`` =
    (∂L/∂θ^avg, ∂L/∂Var or None (then s is unused and ``totals`` = (Σ μ, None)), λ̃), by sqs_core._nearby's
    hand-derived gradient: G_m = ∂L/∂θ^avg λ̃ − 2 ∂L/∂Var λ̃² m, G_s = ∂L/∂Var λ̃. Returns (m, s or None, ∂/∂θ,
    [∂/∂μ_c], [∂/∂(1/σ_c)], [∂/∂const_c], [∂/∂Σμ and, with s, ∂/∂Σ(μ²+σ²)]), all float64."""
    offset, z, _, clamped, a, x, x_l, phi, phi_l = _stages(th, mu, inv_std, const, lumped_count, temperature)
    mu64, (grad_mean, grad_var, lam) = [v.double() for v in mu], cotangents
    m, rest_mu = _moment(phi, phi_l, mu64, totals[0])
    gv64 = None if grad_var is None else grad_var.double()
    grad_m, grad_s = _nearby.cotangents(grad_mean.double(), gv64, lam.double(), m)
    s = None
    if grad_var is not None:
        level_sq = _level_sq(mu64, inv_std)
        s, rest_sq = _moment(phi, phi_l, level_sq, totals[1])
    g_x = [(v - m) * grad_m for v in mu64]
    g_x_l = (rest_mu - lumped_count * m) * grad_m
    if grad_s is not None:
        g_x = [g + (v - s) * grad_s for g, v in zip(g_x, level_sq, strict=True)]
        g_x_l = g_x_l + (rest_sq - lumped_count * s) * grad_s
    g_x, g_x_l = [g * p for g, p in zip(g_x, phi, strict=True)], g_x_l * phi_l  # ∂/∂x_c, ∂/∂x_l
    x64, x_l = [v.double() for v in x], x_l.double()
    total = (_total([v * g for v, g in zip(x64, g_x, strict=True)]) + x_l * g_x_l) * temperature  # τ D
    # ∂/∂q_c = a_c x_c (∂/∂x_c − τ D), 0 where q_c was clamped: a_c zeroed first, so no tiny product is formed
    a_open = [torch.where(cl, 0.0, v.double()) for cl, v in zip(clamped, a, strict=True)]
    g_q = [(g - total) * v * w for g, v, w in zip(g_x, x64, a_open, strict=True)]
    g_qz = [g * v.double() for g, v in zip(g_q, z, strict=True)]  # −∂/∂z_c
    g_offset = [g * i.double() for g, i in zip(g_qz, inv_std, strict=True)]  # −∂/∂(θ − μ_c)
    spread = [p - phi_l for p in phi]  # ∂m/∂μ_c, directly
    g_mu = [g + d * grad_m for g, d in zip(g_offset, spread, strict=True)]
    g_inv = [-(g * o.double()) for g, o in zip(g_qz, offset, strict=True)]
    total_grads = [grad_m * phi_l]
    if grad_s is not None:
        g_mu = [g + d * (2 * v * grad_s) for g, d, v in zip(g_mu, spread, mu64, strict=True)]
        g_inv = [  # ∂σ²/∂(1/σ) = −2σ³
            g - d * (2 * grad_s) / (i.double() ** 3) for g, d, i in zip(g_inv, spread, inv_std, strict=True)
        ]
        total_grads.append(grad_s * phi_l)
    return m, s, -_total(g_offset), g_mu, g_inv, g_q, total_grads
