"""The chunked posterior (forward and recomputed backward) against a plain autograd reference."""

import math

import pytest
import sqs_core as sqs
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_moments import phi_m_s
from reference_moments import posterior as _posterior
from sqs_core import _one_hot, chunked
from sqs_core.mixture import bernoulli_kl, gaussian_kl
from sqs_core.onehot import lump_log_density
from sqs_core.posterior import sampling_probs
from uncovered import evaluated_components, log_densities64


def _reference(p, second):
    """Every quantity with plain autograd over (T, K) tensors."""
    phi, m, s = phi_m_s(p)
    lam = torch.sigmoid(p.gate_logits.reshape(-1) / p.gate_temperature) * p.mask.reshape(-1)
    var = lam * s - (lam * m) ** 2 + (1 - lam) * p.spec().spike_variance
    return lam * m, var, phi


@pytest.mark.parametrize("kind", ["paper", "standard"])
@pytest.mark.parametrize("windows", ["none", "outlier"])
@pytest.mark.parametrize("second", [False, True])
@pytest.mark.parametrize("train_weight", [False, True])
@pytest.mark.parametrize("temperature", [0.05, 5e-4])  # 5e-4: most weights take the certified one-hot path
def test_chunked_forward_and_backward_match_autograd(monkeypatch, kind, windows, second, train_weight, temperature):
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 64)  # many chunks, windows split inside chunks
    p = _posterior(windows=windows, responsibility=kind, temperature=temperature, train_weight=train_weight)
    mean, var = p.moments(second=second)
    ref_mean, ref_var, _ = _reference(p, second)
    assert torch.allclose(mean.reshape(-1), ref_mean, atol=1e-10)
    g1 = torch.randn_like(mean)
    g2 = torch.randn_like(mean)
    params = [p.means, p.log_stds, p.mixing_logits, p.gate_logits] + ([p.weight] if train_weight else [])
    out = (mean * g1).sum() + ((var * g2).sum() if second else 0)
    ref = (ref_mean.reshape(mean.shape) * g1).sum() + ((ref_var.reshape(mean.shape) * g2).sum() if second else 0)
    if second:
        assert torch.allclose(var.reshape(-1), ref_var.clamp_min(0), atol=1e-10)
    for a, b in zip(torch.autograd.grad(out, params), torch.autograd.grad(ref, params), strict=True):
        assert torch.allclose(a, b, atol=1e-8, rtol=1e-6)


def test_the_chunk_size_follows_the_device(monkeypatch):
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 96)
    monkeypatch.setattr(chunked, "DEVICE_CHUNK_ELEMENTS", 640)
    assert chunked.chunk_elements(torch.device("cpu")) == 96
    assert chunked.chunk_elements(torch.device("cuda")) == 640  # a torch.device needs no GPU
    assert list(chunked._chunk_ranges(250, 1, torch.device("cpu"))) == [(0, 96), (96, 192), (192, 250)]
    assert list(chunked._chunk_ranges(250, 4, torch.device("meta"))) == [(0, 160), (160, 250)]


@pytest.mark.parametrize("gaussian", [False, True])
@pytest.mark.parametrize("source", ["forward", "alone"])  # summed by moments(), or again by sqs_core._gate_kl
def test_gate_kl_value_and_gradients_match_autograd(monkeypatch, gaussian, source):
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 50)
    prior = sqs.GaussianPrior(slab_std=0.7) if gaussian else sqs.SpikeSlabPrior(keep_prob=0.3, slab_std=0.7)
    p = _posterior(prior=prior, temperature=0.05)
    p.moments()
    kl = p.kl()
    if source == "alone":
        assert kl.grad_fn is not None and "PosteriorMoments" in type(kl.grad_fn).__name__
        kl = p.kl()  # the forward's KL is handed out once; this one is summed again
        assert "GateKL" in type(kl.grad_fn).__name__
    _, _, phi = _reference(p, False)
    kstar = phi.argmax(-1)
    wid = p.window_ids.reshape(-1).long()
    scaled = p.gate_logits.reshape(-1) / p.gate_temperature
    on = p.mask.reshape(-1)
    lam = torch.sigmoid(scaled) * on
    comp = gaussian_kl(p.means, p.log_stds, 0.7)[wid, kstar]
    ref = (lam * comp).sum()
    if not gaussian:
        ref = ref + torch.where(on, bernoulli_kl(scaled, 0.3), torch.full_like(scaled, -math.log(0.7))).sum()
    assert torch.allclose(kl, ref, rtol=1e-9)
    params = [p.gate_logits, p.means, p.log_stds]
    for a, b in zip(torch.autograd.grad(kl, params), torch.autograd.grad(ref, params), strict=True):
        assert torch.allclose(a, b, atol=1e-9, rtol=1e-6)


def test_forward_kl_is_not_reused_after_the_parameters_change():
    p = _posterior(temperature=0.05)
    p.moments()
    with torch.no_grad():
        peek = p.kl()  # without gradients: a look that leaves the forward's KL pending
        p.gate_logits.add_(0.5)  # say an optimizer step between the forward and kl(); k* stays
    assert "PosteriorMoments" in type(p._pending_kl[0].grad_fn).__name__
    current = p.kl()
    assert "GateKL" in type(current.grad_fn).__name__  # summed again, at the new gates
    assert not torch.allclose(current, peek)
    p.moments()
    fused = p.kl()
    assert "PosteriorMoments" in type(fused.grad_fn).__name__
    assert torch.allclose(fused, current, rtol=1e-12)


@settings(max_examples=15)
@given(seed=st.integers(0, 1000), k=st.integers(2, 6))
def test_posterior_mean_limits(seed, k):
    p = _posterior(seed=seed, k=k, temperature=1e-6, responsibility="standard")
    with torch.no_grad():
        p.mask.fill_(True)
        p.gate_logits.fill_(1.0)  # λ̃ = sigmoid(1/τ') = 1 in float64
    greedy = p.level_values(p.greedy_levels())
    assert torch.allclose(p.posterior_mean(), greedy, atol=1e-9)  # τ → 0, λ̃ → 1: θ^avg = μ_k*
    with torch.no_grad():
        p.gate_logits.fill_(-1.0)
    assert p.posterior_mean().abs().max() < 1e-30  # λ̃ → 0: the spike


def test_responsibilities_rows_and_greedy_agree():
    p = _posterior(temperature=0.1)
    phi = p.responsibilities()
    assert torch.allclose(phi.sum(-1), torch.ones_like(phi[:, 0]), atol=1e-5)
    assert torch.equal(phi.argmax(-1).to(torch.uint8), p.greedy_levels().reshape(-1))


@settings(max_examples=20)
@given(
    seed=st.integers(0, 1000), k=st.integers(2, 8), log_std=st.floats(-9.0, -3.0), dtype=st.sampled_from(["f32", "f64"])
)
def test_greedy_takes_the_exact_argmax_where_phi_rounds_to_uniform(seed, k, log_std, dtype):
    """Narrow components: the paper's φ of a weight far from every one rounds to exactly uniform, and argmax φ
    (the first of ties) took the window's first level however far; k* is argmax log(π_k N_k), which φ increases
    with, computed by the reference in float64."""
    p = _posterior(seed=seed, k=k)
    p = p.float() if dtype == "f32" else p
    with torch.no_grad():
        p.log_stds.fill_(log_std)
    phi = p.responsibilities()
    q = log_densities64(p)
    levels = p.greedy_levels().reshape(-1).long()
    assert torch.equal(levels, q.argmax(-1))  # K-means' distinct means: no exact tie in float64 here
    chosen = phi.gather(1, levels[:, None]).squeeze(1)
    assert torch.equal(chosen, phi.max(-1).values)  # one of φ's argmaxes


@settings(max_examples=20)
@given(
    seed=st.integers(0, 1000),
    k=st.sampled_from([3, 6, 20]),  # 20: the bins' nearby components and a lumped term, at every width
    log_std=st.floats(-9.0, -3.0),
    shift=st.floats(-0.02, 0.02),
    dtype=st.sampled_from(["f32", "f64"]),
)
def test_training_forward_takes_the_argmax_of_pi_n_where_phi_ties(seed, k, log_std, shift, dtype):
    """The training forward's k* (the gate KL's component) on narrow components moved off the weights: most
    weights are far from every one, their paper φ rounds to uniform, and k* is argmax log(π_k N_k) (which φ
    increases with) over the components the weight is evaluated on, not the first of the tied φ. That is the
    argmax over all K wherever some π_k N_k is above the lumping level: the nearby path leaves out only
    components whose π N stays below it over the whole bin. Pruned weights (every fifth) are not evaluated
    (onehot.classify's keep): they are left out here."""
    p = _posterior(seed=seed, k=k)
    p = p.float() if dtype == "f32" else p
    with torch.no_grad():
        p.log_stds.fill_(log_std)
        p.means.add_(shift)
    p.moments()
    kept = p.mask.reshape(-1)
    q = log_densities64(p)[kept]
    chosen = q.gather(1, p._kstar.reshape(-1, 1)[kept].long()).squeeze(1)
    best_evaluated = q.masked_fill(~evaluated_components(p)[kept], -math.inf).max(-1).values
    best = q.max(-1).values
    distinguished = best > lump_log_density(p.weight.dtype)
    if dtype == "f64":
        assert torch.equal(chosen, best_evaluated)
        assert torch.equal(chosen[distinguished], best[distinguished])
    else:  # float32 q rounds at |q|·2^-24; the largest q can be ~1e8 here
        assert bool((chosen >= best_evaluated - 1e-6 * best_evaluated.abs() - 1e-4).all())
        assert bool((chosen >= best - 1e-6 * best.abs() - 1e-4)[distinguished].all())


def test_a_weight_far_from_every_level_gets_the_nearest_not_the_first():
    lin = torch.nn.Linear(16, 4, bias=False)
    model = sqs.prepare_(torch.nn.Sequential(lin), sqs.SQSConfig(num_components=16, windows="none"))
    p = sqs.posteriors(model)["0"]
    with torch.no_grad():
        p.means.copy_(torch.linspace(-0.3, 0.5, 16)[None])
        p.log_stds.fill_(math.log(0.005))
        p.weight[0, 0] = 0.58  # 16σ above the top level: every π N underflows, φ is exactly uniform
    assert bool((p.responsibilities()[0] == 1 / 16).all())
    assert float(p.level_values(p.greedy_levels())[0, 0]) == pytest.approx(0.5)  # was −0.3, the first level
    objective = sqs.Objective(model, num_data=1)
    without_forward = objective.kl().item()
    model(torch.randn(2, 16))
    assert objective.kl().item() == without_forward  # the training forward's k* is argmax log π N too


def test_levels_and_alternatives_in_one_pass_match_the_two_methods():
    """discrete_posteriors and save take both from one evaluation; greedy_ asks for the levels only."""
    p = _posterior(temperature=0.1)  # a soft φ: many weights have alternatives
    levels, (index, rows) = p.levels_and_alternatives()
    expected_index, expected_rows = p.sampling_alternatives()
    assert index.numel() > 0 and torch.equal(index, expected_index) and torch.equal(rows, expected_rows)
    assert torch.equal(levels, p.greedy_levels())
    probs = sampling_probs(p.responsibilities())  # every weight's φ, floored and rounded as the artifact stores it
    several = ((probs > 0).sum(-1) >= 2).nonzero().squeeze(1)
    assert torch.equal(index, several) and torch.equal(rows, probs[several])
    only_levels, (no_index, no_rows) = p.levels_and_alternatives(alternatives=False)
    assert torch.equal(only_levels, levels) and no_index.numel() == 0 and no_rows.shape == (0, p.num_components)


@pytest.mark.parametrize(("log_std", "shift"), [(-7.0, 0.003), (-4.0, 0.02)])
def test_a_weight_the_schedule_returns_gets_its_own_k_star_in_the_kl(log_std, shift):
    """A pruned weight is not evaluated (onehot.classify's keep): its forward k* is its bin's best, not its argmax.
    ``set_mask_`` keeps the forward's k* while no weight returns and drops it when one does, so the next
    ``kl()`` without a forward sums at the weights' own k* (what a fresh forward gives), not the stale one."""
    p = _posterior(seed=1, k=6)
    with torch.no_grad():
        p.log_stds.fill_(log_std)
        p.means.add_(shift)
        p.moments()
    stale = p._kstar
    p.set_mask_(p.mask.clone() & (torch.arange(p.mask.numel()).reshape(p.mask.shape) % 7 != 0))
    assert p._kstar is stale  # only more pruned: every kept weight's k* is still its own
    p.set_mask_(True)
    assert p._kstar is None
    with torch.no_grad():
        after_return = p.kl().item()
        p._kstar = stale
        with_stale = p.kl().item()
        p.moments()
        fresh = p.kl().item()
    assert after_return == fresh
    assert with_stale != fresh  # the case would not tell otherwise


def test_kl_after_a_state_dict_load_sums_at_the_loaded_parameters():
    """A posterior that ran a forward and then loads another state (a checkpoint whose mask keeps weights this
    one pruned) sums the next ``kl()`` at the loaded parameters' own k*, as a fresh forward would."""
    source, target = _posterior(seed=1, k=6), _posterior(seed=1, k=6)
    with torch.no_grad():
        for p in (source, target):
            p.log_stds.fill_(-7.0)
            p.means.add_(0.003)
        source.mask.fill_(True)
        target.moments()  # its k*: the bin's best for every fifth weight, which it prunes
        target.load_state_dict(source.state_dict())
        loaded = target.kl().item()
        source.moments()
        assert loaded == source.kl().item()


@given(
    ids_dtype=st.sampled_from([torch.uint8, torch.int16, torch.int32, torch.int64]),
    out_dtype=st.sampled_from([torch.int32, torch.int64]),
    levels_dtype=st.sampled_from([torch.uint8, torch.int64]),
    k=st.integers(2, 256),
    k_as_tensor=st.booleans(),
    n=st.integers(0, 300),
    seed=st.integers(0, 2**16),
)
def test_flat_index_is_window_times_k_plus_level_in_the_asked_dtype(
    ids_dtype, out_dtype, levels_dtype, k, k_as_tensor, n, seed
):
    """_one_hot._flat_index = w·K + k (int32 arithmetic, eager: one add with alpha = K for narrow ids)."""
    gen = torch.Generator().manual_seed(seed)
    windows = torch.randint(0, 120, (n,), generator=gen).to(ids_dtype)
    levels = torch.randint(0, k, (n,), generator=gen).to(levels_dtype)
    flat = _one_hot._flat_index(windows, levels, torch.tensor(k) if k_as_tensor else k, out_dtype)
    assert flat.dtype == out_dtype
    assert torch.equal(flat.long(), windows.long() * k + levels.long())
