"""Closed forms of sqs_core.mixture against direct formulas, quadrature and Monte Carlo."""

import math

import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from sqs_core.mixture import (
    PAPER_CLAMP,
    _paper_first_stage,
    bernoulli_kl,
    component_log_density,
    exp_floor,
    gaussian_kl,
    log_responsibilities,
)
from strategies import components, finite_floats, log_stds, probabilities, stds


def _params(k, seed):
    g = torch.Generator().manual_seed(seed)
    means = torch.sort(torch.randn(k, generator=g, dtype=torch.float64)).values
    log_s = torch.rand(k, generator=g, dtype=torch.float64) - 2.0
    log_mix = torch.log_softmax(torch.randn(k, generator=g, dtype=torch.float64), 0)
    return means, log_s, log_mix


@given(mu=finite_floats, log_s=log_stds, s0=stds)
@example(mu=0.0, log_s=0.0, s0=0.9771674446626798)  # failed with float32 reference parameters
def test_gaussian_kl_matches_quadrature(mu, log_s, s0):
    s = math.exp(log_s)
    x = torch.linspace(mu - 12 * s, mu + 12 * s, 200001, dtype=torch.float64)
    # float64 parameters: Normal(mu, s) from Python floats holds float32 ones, whose rounding (~5e-6 in log q
    # at s0 = 0.977) exceeded the tolerance under a random hypothesis profile
    p, q = (torch.distributions.Normal(*torch.tensor([m, sd], dtype=torch.float64)) for m, sd in ((mu, s), (0.0, s0)))
    integrand = p.log_prob(x).exp() * (p.log_prob(x) - q.log_prob(x))
    reference = torch.trapezoid(integrand, x).item()
    value = gaussian_kl(torch.tensor(mu, dtype=torch.float64), torch.tensor(log_s, dtype=torch.float64), s0)
    assert math.isclose(value.item(), reference, rel_tol=1e-6, abs_tol=1e-8)


@given(lam_logit=st.floats(-30, 30), prior=probabilities)
def test_bernoulli_kl_matches_definition_and_is_nonnegative(lam_logit, prior):
    value = bernoulli_kl(torch.tensor(lam_logit, dtype=torch.float64), prior).item()
    lam = 1 / (1 + math.exp(-lam_logit))
    direct = sum(p * math.log(p / q) for p, q in ((lam, prior), (1 - lam, 1 - prior)) if p > 0)
    assert value >= -1e-12
    assert math.isclose(value, direct, rel_tol=1e-9, abs_tol=1e-9)


def test_bernoulli_kl_limits():
    prior = 0.3
    assert math.isclose(bernoulli_kl(torch.tensor(-1e4), prior).item(), -math.log(0.7), rel_tol=1e-6)
    assert math.isclose(bernoulli_kl(torch.tensor(1e4), prior).item(), -math.log(0.3), rel_tol=1e-6)
    assert abs(bernoulli_kl(torch.tensor(math.log(0.3 / 0.7)), prior).item()) < 1e-7


@given(
    k=components,
    seed=st.integers(0, 10_000),
    tau=st.floats(1e-4, 10),
    kind=st.sampled_from(["paper", "standard"]),
)
def test_responsibilities_are_a_distribution(k, seed, tau, kind):
    means, log_s, log_mix = _params(k, seed)
    theta = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 2
    log_phi = log_responsibilities(component_log_density(theta, means, log_s, log_mix), kind, tau)
    assert torch.isfinite(log_phi).all()
    assert torch.allclose(log_phi.exp().sum(-1), torch.ones(64, dtype=torch.float64), atol=1e-9)


@given(k=components, seed=st.integers(0, 10_000))
def test_standard_at_unit_temperature_is_the_gmm_responsibility(k, seed):
    means, log_s, log_mix = _params(k, seed)
    theta = torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    dens = log_mix.exp() * torch.distributions.Normal(means, log_s.exp()).log_prob(theta[:, None]).exp()
    expected = dens / dens.sum(-1, keepdim=True)
    got = log_responsibilities(component_log_density(theta, means, log_s, log_mix), "standard", 1.0).exp()
    assert torch.allclose(got, expected, atol=1e-10)


@given(k=components, seed=st.integers(0, 10_000), tau=st.floats(0.05, 5))
def test_paper_formula_matches_its_direct_form_where_that_does_not_overflow(k, seed, tau):
    means, _, log_mix = _params(k, seed)
    log_s = torch.zeros(k, dtype=torch.float64)  # σ = 1: π N ≤ 0.4, exp(π N) is safe
    theta = torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    a = log_mix.exp() * torch.distributions.Normal(means, 1.0).log_prob(theta[:, None]).exp()
    first = torch.exp(a) / torch.exp(a).sum(-1, keepdim=True)
    expected = torch.exp(first / tau) / torch.exp(first / tau).sum(-1, keepdim=True)
    got = log_responsibilities(component_log_density(theta, means, log_s, log_mix), "paper", tau).exp()
    assert torch.allclose(got, expected, atol=1e-10)


def test_paper_formula_is_finite_where_the_direct_form_overflows():
    means = torch.tensor([-0.1, 0.0, 0.1])
    log_s = torch.full((3,), math.log(1e-4))  # N(θ|μ,σ²) ~ 4e3: exp(π N) overflows float32
    log_mix = torch.log(torch.full((3,), 1 / 3))
    theta = torch.tensor([-0.1, 0.00001, 0.0999])
    direct = torch.exp(log_mix.exp() * torch.exp(component_log_density(theta, means, log_s, torch.zeros(3))))
    assert not torch.isfinite(direct).all()
    phi = log_responsibilities(component_log_density(theta, means, log_s, log_mix), "paper", 5e-4).exp()
    assert torch.isfinite(phi).all()
    assert torch.equal(phi.argmax(-1), torch.tensor([0, 1, 2]))


@given(k=components, seed=st.integers(0, 10_000), kind=st.sampled_from(["paper", "standard"]))
def test_responsibilities_become_one_hot_as_temperature_vanishes(k, seed, kind):
    means, log_s, log_mix = _params(k, seed)
    log_s = torch.zeros(k, dtype=torch.float64) + 0.5  # wide components: every weight is "near" one
    theta = means[:, None].repeat(1, 3).reshape(-1) + 0.01
    q = component_log_density(theta, means, log_s, log_mix)
    sharp = log_responsibilities(q, kind, 1e-9).exp()
    assert torch.allclose(sharp.max(-1).values, torch.ones_like(theta), atol=1e-6)
    assert torch.equal(sharp.argmax(-1), q.argmax(-1))


def test_paper_formula_is_uniform_far_from_every_component():
    """A property of the paper's formula, documented in mixture.py: π_k N_k ≈ 0 for all k ⇒ φ uniform."""
    means = torch.tensor([-0.1, 0.1], dtype=torch.float64)
    log_s = torch.log(torch.tensor([0.01, 0.01], dtype=torch.float64))
    log_mix = torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64))
    q = component_log_density(torch.tensor([3.0], dtype=torch.float64), means, log_s, log_mix)
    assert torch.allclose(log_responsibilities(q, "paper", 5e-4).exp(), torch.full((1, 2), 0.5, dtype=torch.float64))
    assert log_responsibilities(q, "standard", 5e-4).exp()[0, 1] > 0.999


# rows of q = log π_k N_k with values in each regime of the paper's first stage: π N subnormal or 0 (below
# exp_floor), just above it, tiny row maxima, order one, and clamped at 80
_Q_VALUES = st.one_of(
    st.floats(-2000, -87.4),
    st.floats(-110, -60),
    st.floats(-86.5, -86.2),
    st.floats(-30, 85),
    st.sampled_from([-1e30, -745.2, -708.0, -103.98, 0.0, 80.0]),
)


def _unfloored_first_stage(q):
    """The paper's first stage as it was before the exp floor: softmax_k(exp(min(q_k, 80)))."""
    return torch.softmax(torch.exp(q.clamp(max=PAPER_CLAMP)), dim=-1)


@given(rows=st.lists(st.lists(_Q_VALUES, min_size=6, max_size=6), min_size=1, max_size=12), f64=st.booleans())
@example(rows=[[-90.0] * 6, [-86.0, -95.0, -2000.0, -100.0, -88.0, -87.0]], f64=False)  # every π N tiny
def test_the_exp_floor_keeps_every_bit_of_the_paper_responsibilities(rows, f64):
    """q raised to exp_floor before π N = e^q (torch's eager CPU exp is slow below it) leaves φ' and log φ
    bit for bit as they were, in float32 and float64, and ∂/∂q within 3.2e-38 of a unit cotangent."""
    dtype = torch.float64 if f64 else torch.float32
    q = torch.tensor(rows, dtype=dtype)
    if f64:  # float64's floor is log(2.2e-308) + 1 = −707.4: move the rows' regimes there
        q = torch.where(q < -60, q * (707.4 / 86.34), q)
    assert torch.equal(_paper_first_stage(q), _unfloored_first_stage(q))
    assert torch.equal(log_responsibilities(q, "paper", 5e-4), F.log_softmax(_unfloored_first_stage(q) / 5e-4, -1))
    leaf = q.clone().requires_grad_()
    cotangent = torch.randn(q.shape, generator=torch.Generator().manual_seed(0), dtype=dtype)
    (ours,) = torch.autograd.grad((_paper_first_stage(leaf) * cotangent).sum(), leaf)
    (theirs,) = torch.autograd.grad((_unfloored_first_stage(leaf) * cotangent).sum(), leaf)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=4 * math.exp(exp_floor(dtype)))
