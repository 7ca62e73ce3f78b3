"""No subnormal number leaves a posterior: θ^avg and Var_q are flushed (mixture.flush_subnormals), λ̃ at most
_gate_terms.GATE_FLOOR is 0 in training, and the gate KL's e^{−|ℓ|} is raised to mixture.exp_floor. Subnormal
weights made the forward matrix product of a 4096² layer 200× slower on x86 (docs/method.md, "Session 32")."""

import math

import pytest
import sqs_core as sqs
import torch
from hypothesis import given
from hypothesis import strategies as st
from sqs_core._gate_terms import GATE_FLOOR
from sqs_core.mixture import bernoulli_kl, flush_subnormals, flush_subnormals_
from torch import nn

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

FLOOR_LOGIT = math.log(2.0**-64) - math.log1p(-(2.0**-64))  # the documented floor: sigmoid(ℓ) = 2^-64 at ℓ = −44.36


def _subnormal(x: torch.Tensor) -> torch.Tensor:
    return (x != 0) & (x.abs() < torch.finfo(x.dtype).tiny)


@given(
    seed=st.integers(0, 10_000),
    n=st.integers(0, 300),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    in_place=st.booleans(),
)
def test_flushing_zeroes_the_subnormals_and_keeps_every_other_bit(seed, n, dtype, in_place):
    g = torch.Generator().manual_seed(seed)
    tiny = torch.finfo(dtype).tiny
    scales = torch.tensor([1.0, tiny, tiny / 2**10, tiny * 2**-20, 1e-30, 1e30], dtype=torch.float64)
    pick = torch.randint(0, len(scales), (n,), generator=g)
    x = (torch.randn(n, generator=g, dtype=torch.float64) * scales[pick]).to(dtype)
    if n >= 4:
        x[:4] = torch.tensor([math.nan, math.inf, -math.inf, -tiny], dtype=dtype)
    before = x.clone()
    out = flush_subnormals_(x) if in_place else flush_subnormals(x)
    if in_place:
        assert out is x
    else:
        torch.testing.assert_close(x, before, rtol=0, atol=0, equal_nan=True)  # the input is left alone
    small = before.abs() <= tiny  # the subnormals, ±tiny itself and zeros
    assert not bool(_subnormal(out).any())
    assert bool((out[small] == 0).all())
    kept = ~small
    assert torch.equal(out[kept].isnan(), before[kept].isnan())
    finite = kept & ~before.isnan()
    assert torch.equal(out[finite], before[finite])


@given(logit=st.floats(-300, 300), prior=st.floats(0.01, 0.99))
def test_the_gate_kl_in_float32_is_the_float64_one_within_rounding(logit, prior):
    """e^{−|ℓ|} raised to the exp floor moves the float32 KL by far less than its rounding, for any |ℓ|."""
    logit32 = torch.tensor(logit, dtype=torch.float32)
    value = bernoulli_kl(logit32, prior).item()
    reference = bernoulli_kl(logit32.double(), prior).item()
    assert math.isfinite(value)
    assert math.isclose(value, reference, rel_tol=2e-6, abs_tol=2e-6)


def _layer(compile_kernels: bool, scale: float = 1.0) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 40))
    with torch.no_grad():
        model[0].weight.mul_(scale)
    config = sqs.SQSConfig(num_components=4, windows="none", compile_kernels=compile_kernels)
    sqs.prepare_(model, config)
    return model


def _moments_at(posterior, logits, second):
    with torch.no_grad():
        posterior.gate_logits.copy_(logits * posterior.gate_temperature)
    return posterior.moments(second=second)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("second", [False, True], ids=["plugin", "with-var"])
@pytest.mark.parametrize("scale", [1.0, 1e-20], ids=["weights-1", "weights-1e-20"])
def test_theta_avg_has_no_subnormals_where_gates_pass_through_float32s_bottom(compiled, second, scale):
    """Gates at ℓ from −120 to +120: θ^avg and Var carry no subnormal, θ^avg is 0 where λ̃ ≤ GATE_FLOOR and
    sigmoid(ℓ) m elsewhere (m = θ^avg at λ̃ = 1), flushed where that is subnormal (weights ~1e-20: λ̃ m is
    subnormal above the floor too), and the gradients reach no gate at or below the floor."""
    model = _layer(compiled, scale)
    posterior = next(iter(sqs.posteriors(model).values()))
    numel = posterior.gate_logits.numel()
    m = _moments_at(posterior, torch.full((numel,), 20.0).reshape(posterior.gate_logits.shape), False)[0].detach()
    logits = torch.linspace(-120, 120, numel).reshape(m.shape)[
        torch.randperm(m.shape[0], generator=torch.Generator().manual_seed(1))
    ]
    mean, var = _moments_at(posterior, logits, second)
    for value in (mean, var) if second else (mean,):
        assert not bool(_subnormal(value).any())
    lam = torch.sigmoid(posterior.gate_logits.detach() / float(posterior.gate_temperature))  # ℓ as stored
    expected = torch.where(lam > GATE_FLOOR, lam * m, 0.0)
    expected = torch.where(expected.abs() <= torch.finfo(torch.float32).tiny, 0.0, expected)
    assert bool((mean[logits <= FLOOR_LOGIT] == 0).all())
    torch.testing.assert_close(mean.detach(), expected, rtol=1e-6, atol=2 * torch.finfo(torch.float32).tiny)
    loss = (mean * torch.randn(mean.shape, generator=torch.Generator().manual_seed(2))).sum()
    if second:
        loss = loss + var.sum()
    (grad,) = torch.autograd.grad(loss, [posterior.gate_logits])
    assert bool(grad.isfinite().all())
    assert bool((grad[logits <= FLOOR_LOGIT] == 0).all())
    assert bool((grad[(logits > -5) & (logits < 5)] != 0).all())


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_gate_kl_is_finite_and_floored_for_far_gates(compiled):
    """The objective's KL at gates up to |ℓ| = 10⁴: finite, and a gate at or below the floor adds the KL of
    λ̃ = 0 (−log(1 − λ) for the Bernoulli part, nothing for the slab's)."""
    model = _layer(compiled)
    posterior = next(iter(sqs.posteriors(model).values()))
    shape = posterior.gate_logits.shape
    numel = posterior.gate_logits.numel()
    far = torch.full((numel,), -1e4).reshape(shape)
    _moments_at(posterior, far, False)
    kl_far = posterior.kl().item()
    prior_keep = posterior.spec().prior_keep
    assert math.isclose(kl_far, -numel * math.log1p(-prior_keep), rel_tol=1e-6)
    at_floor = torch.full((numel,), FLOOR_LOGIT - 0.01).reshape(shape)
    _moments_at(posterior, at_floor, False)
    assert math.isclose(posterior.kl().item(), kl_far, rel_tol=1e-6)
    for logit in (90.0, -90.0, 1e4):
        _moments_at(posterior, torch.full(shape, logit), False)
        assert math.isfinite(posterior.kl().item()), logit
