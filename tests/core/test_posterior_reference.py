"""The posterior's formulas against references written out in float64, where the suite's other references read a
constant or a spec value back from the code under test (session 66's mutation search found each gap)."""

import math

import pytest
import sqs_core as sqs
import torch
from reference_moments import phi_m_s, posterior
from sqs_core._posterior_init import initial_gate_logits
from sqs_core.posterior import SAMPLING_FLOOR, sampling_probs


@pytest.mark.parametrize("slab_std", [0.3, 0.7, 2.0])
def test_gaussian_spike_variance_and_its_gradients(slab_std):
    """Var_q(θ̃) under the Gaussian-prior ablation, whose spike is N(0, σ_0²): the mixture
    q = λ̃ Σ_k φ_k N(μ_k, σ_k²) + (1 − λ̃) N(0, σ_0²) has E[θ̃²] = λ̃ s + (1 − λ̃) σ_0², so
    Var = λ̃ s − (λ̃ m)² + (1 − λ̃) σ_0² with σ_0² = slab_std² taken from the prior itself (not from the posterior's
    spec, which the suite's references read back). Value and gradients (∂/∂s̃ too: the hand-written backward's
    ∂Var/∂λ̃ = s − 2 λ̃ m² − σ_0²)."""
    p = posterior(prior=sqs.GaussianPrior(slab_std=slab_std), temperature=0.05)
    _, var = p.moments(second=True)
    _, m, s = phi_m_s(p)
    lam = torch.sigmoid(p.gate_logits.reshape(-1) / p.gate_temperature) * p.mask.reshape(-1)
    ref_var = lam * s - (lam * m) ** 2 + (1 - lam) * slab_std**2
    torch.testing.assert_close(var.reshape(-1), ref_var.clamp_min(0), rtol=1e-10, atol=1e-12)
    g = torch.randn(var.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    params = [p.gate_logits, p.means, p.log_stds, p.mixing_logits]
    got = torch.autograd.grad((var * g).sum(), params)
    want = torch.autograd.grad((ref_var.reshape(var.shape) * g).sum(), params)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)


def test_gates_above_two_to_the_minus_64_are_not_floored():
    """The documented training floor of the gates is λ̃ ≤ 2^-64 (ℓ = s̃/τ' ≤ −44.4), literally: a gate at ℓ = −30
    (λ̃ ≈ 9.4e-14) keeps θ^avg = λ̃ m and a non-zero gradient; one at ℓ = −50 (λ̃ ≈ 1.9e-22) is 0 with no gradient."""
    p = posterior(temperature=0.05)
    tau = float(p.gate_temperature)
    n = p.gate_logits.numel()
    ell = torch.where(torch.arange(n) % 2 == 0, -30.0, -50.0).double()
    with torch.no_grad():
        p.mask.fill_(True)
        p.gate_logits.copy_((ell * tau).reshape(p.gate_logits.shape))
    mean, _ = p.moments()
    _, m, _ = phi_m_s(p)
    m = m.detach()
    lam = torch.sigmoid(ell)
    above = ell == -30.0
    assert float(lam[above].min()) > 2.0**-64 and float(lam[~above].max()) <= 2.0**-64
    torch.testing.assert_close(mean.detach().reshape(-1)[above], lam[above] * m[above], rtol=1e-9, atol=0)
    assert bool((mean.detach().reshape(-1)[~above] == 0).all())
    (grad,) = torch.autograd.grad(mean.sum(), [p.gate_logits])
    grad = grad.reshape(-1)
    assert bool((grad[above] != 0).all()) and bool((grad[~above] == 0).all())


def test_magnitude_init_ranks_gates_by_weight_magnitude():
    """gate_init="magnitude": ℓ = s̃/τ' rises with |θ|, from logit(initial_keep_prob) − spread at the smallest |θ| to
    logit(initial_keep_prob) at the largest (the largest weights are the last to be pruned)."""
    config = sqs.SQSConfig(gate_init="magnitude", gate_init_spread=4.0)
    theta = torch.tensor([0.3, -2.0, 0.01, -0.5, 1.0])
    ell = initial_gate_logits(theta, config) / config.gate_temperature
    top = math.log(config.initial_keep_prob) - math.log1p(-config.initial_keep_prob)
    order = torch.argsort(theta.abs())
    assert bool((torch.diff(ell[order]) > 0).all())
    assert math.isclose(float(ell[1]), top, rel_tol=1e-5)
    assert math.isclose(float(ell[2]), top - 4.0, rel_tol=1e-5)


def test_probabilities_below_the_floor_are_zeroed():
    """sampling_probs zeroes φ below SAMPLING_FLOOR = 1e-3 (docs: sampling_alternatives), then rounds to float16."""
    assert SAMPLING_FLOOR == 1e-3
    phi = torch.tensor([[0.9995, 0.0005], [0.998, 0.002], [0.5, 0.5]])
    got = sampling_probs(phi)
    assert got.tolist() == [[float(torch.tensor(0.9995).half()), 0.0], phi[1].half().float().tolist(), [0.5, 0.5]]
