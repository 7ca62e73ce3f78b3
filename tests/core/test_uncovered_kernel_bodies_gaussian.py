"""The compiled path's backward kernel bodies for uncovered weights (sqs_core._fused_uncovered: the unrolled
_nearby_vjp, the rolled _rolled_vjp of blocks wider than UNROLLED_MAX, _lumped_backward of all-lumped bins), run
eagerly here (no compile), under the Gaussian prior's spike variance σ_0² ≠ 0 and with Var used, against a float64
autograd reference over all K components of the paper's formulas:

    φ' = softmax_k(π_k N_k(θ)),  φ = softmax_k(φ'/τ),  m = Σ φ μ,  s = Σ φ (μ² + σ²),  λ̃ = sigmoid(s̃/τ') · mask,
    θ^avg = λ̃ m,  Var = λ̃ s − (λ̃ m)² + (1 − λ̃) σ_0².

test_fused's compiled-vs-eager comparisons run wide (rolled) and all-lumped blocks only with σ_0² = 0, so the
σ_0² of their ∂/∂s̃ went unchecked. The components left out of the nearby evaluation lie ≥ 10⁴σ away (π N = 0, its
e^{π N} exactly 1), so the nearby formula is exact and any difference is a wrong formula."""

import pytest
import torch
import torch.nn.functional as F
from sqs_core import _fused_uncovered as fu
from sqs_core._compiled import _scalar
from sqs_core._nearby import TableGradients

K, N, TAU, GATE_TAU, SPIKE_VAR = 40, 96, 0.05, 0.5, 0.49


def _setup(near: int):
    """Two windows of K components: the first ``near`` of each about the weights (σ = 0.05), the rest at 5 + ...
    with σ = 1e-3 (π N = 0); all-lumped (``near`` = 0): every component far."""
    g = torch.Generator().manual_seed(7)
    means = 5.0 + torch.rand(2, K, generator=g, dtype=torch.float64)
    log_stds = torch.full((2, K), -6.9, dtype=torch.float64)
    means[:, :near] = torch.linspace(-0.1, 0.1, near, dtype=torch.float64) + torch.randn(2, near, generator=g) * 0.01
    log_stds[:, :near] = torch.log(torch.full((near,), 0.05, dtype=torch.float64))
    logits = torch.randn(2, K, generator=g, dtype=torch.float64)
    theta = torch.randn(N, generator=g, dtype=torch.float64) * 0.08
    wid = torch.randint(0, 2, (N,), generator=g)
    gate_logits = torch.randn(N, generator=g, dtype=torch.float64) * 0.5
    mask = torch.ones(N, dtype=torch.bool)
    mask[::5] = False
    gm, gv = (torch.randn(N, generator=g, dtype=torch.float64) for _ in range(2))
    return means, log_stds, logits, theta, wid, gate_logits, mask, gm, gv


def _reference(means, log_stds, logits, theta, wid, gate_logits, mask, gm, gv):
    """∂L/∂(s̃, μ, log σ, mixing logits) for L = Σ gm θ^avg + gv Var, autograd over all K in float64."""
    leaves = [t.clone().requires_grad_() for t in (gate_logits, means, log_stds, logits)]
    s_tilde, mu, log_std, logit = leaves
    mu_w, sd_w = mu[wid], torch.exp(log_std[wid])
    log_pi = F.log_softmax(logit, -1)[wid]
    q = log_pi - torch.log(sd_w) - 0.5 * torch.log(torch.tensor(2 * torch.pi, dtype=torch.float64))
    q = q - 0.5 * ((theta[:, None] - mu_w) / sd_w) ** 2
    phi = torch.softmax(torch.softmax(torch.exp(q), -1) / TAU, -1)
    m = (phi * mu_w).sum(-1)
    s = (phi * (mu_w**2 + sd_w**2)).sum(-1)
    lam = torch.sigmoid(s_tilde / GATE_TAU) * mask
    var = lam * s - (lam * m) ** 2 + (1 - lam) * SPIKE_VAR
    loss = (gm * lam * m + gv * var).sum()
    return torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("kernel", ["_nearby_vjp", "_rolled_vjp", "_lumped_backward"])
def test_backward_kernel_bodies_match_the_full_formula_under_a_gaussian_spike(kernel):
    near = {"_nearby_vjp": 8, "_rolled_vjp": fu.UNROLLED_MAX + 4, "_lumped_backward": 0}[kernel]
    means, log_stds, logits, theta, wid, gate_logits, mask, gm, gv = case = _setup(near)
    want = _reference(*case)
    leaves = [means, log_stds, logits]
    table_grads = TableGradients(leaves, second=True)
    tables = table_grads.tables
    columns, totals = list(tables.columns), [tables.total_mu, tables.total_sq]
    u = torch.arange(N)
    g_gate = torch.zeros(N, dtype=torch.float64)
    if kernel == "_lumped_backward":
        scalars = (_scalar(GATE_TAU), K, _scalar(SPIKE_VAR))
        w, *total_grads = fu._lumped_backward(u, gate_logits, mask, wid, gm, gv, columns, totals, scalars, g_gate)
        table_grads.add_totals(w, total_grads)
    elif kernel == "_rolled_vjp":
        table = torch.stack([torch.arange(near) + w * K for w in range(2)])  # (B, width): bin = window here
        scalars = (_scalar(TAU), _scalar(GATE_TAU), K, _scalar(SPIKE_VAR))
        args = (u, wid, theta, gate_logits, mask, wid, gm, gv, table, columns, totals, scalars, (g_gate, None))
        flat, w, column_grads, total_grads = fu._rolled_vjp(*args)
        table_grads.add(flat, w, column_grads, total_grads)
    else:
        flat = torch.arange(near)[:, None] + wid * K  # (width, n)
        scaled = gate_logits / GATE_TAU
        lam, drop = torch.sigmoid(scaled) * mask, torch.sigmoid(-scaled)
        scalars = (_scalar(float(K - near)), _scalar(TAU), _scalar(GATE_TAU), _scalar(SPIKE_VAR))
        args = (theta, flat, columns, totals, wid, gm, gv, lam, drop, scalars, u, (g_gate, None))
        *column_grads, g_total_mu, g_total_sq = fu._nearby_vjp(*args)
        table_grads.add(flat, wid, column_grads, [g_total_mu, g_total_sq])
    param_grads = [torch.zeros(t.numel(), dtype=torch.float64) for t in leaves]
    table_grads.into(param_grads)
    got = [g_gate, *(g.view(t.shape) for g, t in zip(param_grads, leaves, strict=True))]
    for name, a, b in zip(["gate logits", "means", "log stds", "mixing logits"], got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12 * max(float(b.abs().max()), 1.0), msg=name)
