"""The one-hot certificate (sqs_core.onehot): a certified weight really has a one-hot φ, and it fires."""

import math
from unittest import mock

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
import uncovered
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sqs_core import _nearby, chunked, onehot
from sqs_core.mixture import bernoulli_kl, component_log_density, gaussian_kl, log_responsibilities
from sqs_core.onehot import (
    ALL_LUMPED,
    CERTIFY_MARGIN,
    NARROW,
    NARROW_WIDTHS,
    NEARBY_WIDTHS,
    bin_table,
    certify_one_hot,
)
from sqs_core.posterior import SpikeGMMPosterior
from torch import nn
from uncovered import evaluated_components, log_densities64, uncovered_counts


def _full_log_phi(theta, means, log_stds, mixing_logits, kind, temperature):
    q = component_log_density(theta, means, log_stds, F.log_softmax(mixing_logits, -1))
    return log_responsibilities(q, kind, temperature)


@settings(max_examples=200)
@given(
    k=st.integers(1, 64),
    seed=st.integers(0, 10**6),
    kind=st.sampled_from(["paper", "standard"]),
    temperature=st.sampled_from([5e-4, 1e-2, 1.0]),
    spread=st.sampled_from([1e-3, 0.1, 3.0]),
    duplicate_means=st.booleans(),
    windows=st.sampled_from(["one", "intervals", "scattered"]),
)
def test_a_certified_weight_is_one_hot_at_its_argmax(k, seed, kind, temperature, spread, duplicate_means, windows):
    g = torch.Generator().manual_seed(seed)
    num_windows = 1 if windows == "one" else 2
    means = torch.randn(num_windows, k, generator=g, dtype=torch.float64) * spread
    if duplicate_means and k > 1:
        means[:, 1] = means[:, 0]  # a tie: never certified between these two
    log_stds = torch.randn(num_windows, k, generator=g, dtype=torch.float64) * 0.5 + math.log(spread / max(k, 2))
    log_mix = F.log_softmax(torch.randn(num_windows, k, generator=g, dtype=torch.float64), -1)
    theta = torch.cat([torch.randn(500, generator=g, dtype=torch.float64) * spread, means[0], means[-1] * 50])
    if windows == "intervals":  # the layout of sqs windows: value intervals
        wid = (theta > theta.median()).to(torch.uint8)
    else:  # overlapping ranges (θ trained after the windows were fixed): bins have no single owner
        wid = torch.randint(0, num_windows, theta.shape, generator=g).to(torch.uint8)
    table = bin_table(theta, wid, means, log_stds, log_mix, kind, temperature)
    kstar, level, certified = certify_one_hot(theta, wid, table)
    rows = wid.long()[certified]
    kstar = kstar.long()[certified]
    assert torch.equal(level[certified], means[rows, kstar])
    q = component_log_density(theta[certified], means[rows], log_stds[rows], log_mix[rows])
    log_phi = log_responsibilities(q, kind, temperature)
    assert torch.equal(kstar, log_phi.argmax(-1))
    log_phi[torch.arange(log_phi.shape[0]), kstar] = -math.inf
    assert (log_phi <= -CERTIFY_MARGIN + 1e-6).all()  # every other φ_j ≤ e^-40


@settings(max_examples=100)
@given(
    k=st.integers(2, 16),
    seed=st.integers(0, 10**6),
    kind=st.sampled_from(["paper", "standard"]),
    temperature=st.sampled_from([5e-4, 1e-2, 1e-9]),
    log_std=st.floats(-16.0, -11.0),
    duplicate=st.sampled_from(["means", "components"]),
)
def test_a_float32_certificate_holds_where_the_margin_is_below_the_resolution_of_the_bound(
    k, seed, kind, temperature, log_std, duplicate
):
    """Large log densities (σ ≈ 10^-7..10^-5, so e^{π N} up to ~10^6) put q_min − U below float32's resolution of
    U: q_min rounded to U, and a weight on two identical components (φ = ½, ½) was certified (session 63). The
    certificate must hold against the formula evaluated in float64 on the same float32 parameters."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(1, k, generator=g) * 1e-3
    log_stds = torch.full((1, k), log_std) + torch.rand(1, k, generator=g)
    log_mix = F.log_softmax(torch.randn(1, k, generator=g), -1)
    means[0, 1] = means[0, 0]
    if duplicate == "components":
        log_stds[0, 1], log_mix[0, 1] = log_stds[0, 0], log_mix[0, 0]
    near = means[0, 0] + torch.randn(200, generator=g) * log_stds.exp().max()
    theta = torch.cat([torch.randn(300, generator=g) * 1e-3, near, means[0]])
    wid = torch.zeros(theta.shape, dtype=torch.uint8)
    table = bin_table(theta, wid, means, log_stds, log_mix, kind, temperature)
    kstar, _, certified = certify_one_hot(theta, wid, table)
    if duplicate == "components":
        assert not bool(certified[-k]), "a weight on two identical components was certified"
    q = component_log_density(theta[certified].double(), means.double(), log_stds.double(), log_mix.double())
    log_phi = log_responsibilities(q, kind, temperature)
    log_phi[torch.arange(log_phi.shape[0]), kstar.long()[certified]] = -math.inf
    assert (log_phi <= -CERTIFY_MARGIN + 1.0).all()  # every other φ_j ≤ e^-39 (float32 bounds)


@pytest.mark.parametrize("kind", ["paper", "standard"])
@pytest.mark.parametrize("k", [4, 64])
def test_the_certificate_covers_almost_every_weight_at_the_papers_temperature(kind, k):
    w = torch.randn(512, 256, generator=torch.Generator().manual_seed(0)) * 0.05
    config = sqs.SQSConfig(num_components=k, windows="outlier", responsibility=kind)
    p = SpikeGMMPosterior(w, config, generator=torch.Generator().manual_seed(0))
    log_mix = F.log_softmax(p.mixing_logits.detach(), -1)
    theta, wid = p.weight.reshape(-1), p.window_ids.reshape(-1)
    table = bin_table(theta, wid, p.means, p.log_stds, log_mix, kind, config.temperature)
    _, _, certified = certify_one_hot(theta, wid, table)
    assert p.num_windows == 2 and certified.float().mean() > 0.95


def test_ties_take_the_full_path_and_still_match(monkeypatch):
    """Weights exactly between two equal components are not certified; values and gradients stay exact."""
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 32)
    w = torch.randn(40, 10, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 0.1
    config = sqs.SQSConfig(num_components=8, windows="none", responsibility="standard", temperature=5e-4)
    p = SpikeGMMPosterior(w, config, generator=torch.Generator().manual_seed(0)).double()
    with torch.no_grad():
        p.log_stds.fill_(math.log(0.02))
        p.mixing_logits.zero_()
        p.weight.view(-1)[:50] = 0.5 * (p.means[0, 2] + p.means[0, 3])  # φ = (½, ½) over components 2, 3
    mean = p.posterior_mean()
    params = [p.means, p.log_stds, p.mixing_logits, p.gate_logits]
    log_phi = _full_log_phi(p.weight.reshape(-1), p.means[0], p.log_stds[0], p.mixing_logits[0], "standard", 5e-4)
    lam = torch.sigmoid(p.gate_logits.reshape(-1) / p.gate_temperature)
    reference = lam * (log_phi.exp() * p.means[0]).sum(-1)
    assert torch.allclose(log_phi[:50, 2:4].exp(), torch.full((50, 2), 0.5, dtype=torch.float64))
    assert torch.allclose(mean.reshape(-1), reference, rtol=1e-12)
    g = torch.randn(mean.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ours = torch.autograd.grad((mean * g).sum(), params)
    theirs = torch.autograd.grad((reference * g.reshape(-1)).sum(), params)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("narrowing", [2.5, -0.8, -1.0])
@pytest.mark.parametrize("windows", ["none", "outlier"])
@pytest.mark.parametrize("second", [False, True])
@pytest.mark.parametrize("train_weight", [False, True])
def test_far_weights_on_nearby_components_match_the_full_formula(monkeypatch, windows, second, narrowing, train_weight):
    """Under the paper's formula a weight far from every component has a near-uniform φ (not certified);
    when all but 4, 8 or 16 (onehot.NARROW_WIDTHS), or up to 32 (wide bins, widths chosen per table:
    sqs_core._wide), components have e^{π N} = 1 in the working precision it is evaluated on those and one
    lumped term. Narrower components (``narrowing``: log σ shift) leave fewer
    that matter: 2.5 puts every such weight in a bin of width 4 or where every component is lumped
    (onehot.ALL_LUMPED: φ = 1/K, m = Σ_k μ_k / K); −0.8 (wider) spreads them over bins of
    every narrow width and several wide ones; −1.0 leaves more than 32 in some bins (all K) beside many wide
    ones. With ``train_weight``
    the gradient reaches θ too."""
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 256)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(60, 50, generator=g, dtype=torch.float64) * 0.1
    w.view(-1)[:3] = torch.tensor([1.5, -1.2, 1.1], dtype=torch.float64)
    config = sqs.SQSConfig(
        num_components=64, windows=windows, responsibility="paper", temperature=5e-4, train_weight=train_weight
    )
    p = SpikeGMMPosterior(w, config, generator=torch.Generator().manual_seed(0)).double()
    with torch.no_grad():
        p.log_stds.sub_(narrowing)  # narrower components: more weights lie ≥ 10σ from all of them
        p.mixing_logits.add_(torch.randn(p.mixing_logits.shape, generator=g, dtype=torch.float64))
        p.mask.view(-1)[::7] = False
    counts = uncovered_counts(p)
    near = {w: counts[w] for w in NEARBY_WIDTHS}
    wide = sum(counts[w] for w in NEARBY_WIDTHS if w > NARROW)  # in bins of widths chosen per table
    assert sum(near.values()) > 100  # the nearby path is exercised
    if narrowing == 2.5:
        assert counts[ALL_LUMPED] > 50, counts
    if narrowing == -0.8:
        assert all(near[w] > 10 for w in NARROW_WIDTHS) and wide > 10, counts  # at every narrow width, and wide
    if narrowing == -1.0:
        assert wide > 100 and counts[0] > 30, counts  # wide bins, and all K beside them
    _assert_matches_the_full_formula(p, second, g)


def _assert_matches_the_full_formula(p, second, g):
    """θ^avg (and Var) of the float64 posterior ``p`` and the gradients of a random functional of them (θ's
    too when it is trained) equal autograd through the paper's full K-component formula (τ = 5e-4)."""
    mean, var = p.moments(second=second)
    theta, rows = p.weight.reshape(-1), p.window_ids.reshape(-1).long()
    q = component_log_density(theta, p.means[rows], p.log_stds[rows], F.log_softmax(p.mixing_logits, -1)[rows])
    phi = log_responsibilities(q, "paper", 5e-4).exp()
    lam = torch.sigmoid(p.gate_logits.reshape(-1) / p.gate_temperature) * p.mask.reshape(-1)
    m = (phi * p.means[rows]).sum(-1)
    ref_mean = lam * m
    assert torch.allclose(mean.reshape(-1), ref_mean, rtol=1e-9, atol=1e-12)
    params = [p.means, p.log_stds, p.mixing_logits, p.gate_logits] + ([p.weight] if p.config.train_weight else [])
    weights = torch.randn(mean.shape, generator=g, dtype=torch.float64)
    ours, ref = (mean * weights).sum(), (ref_mean.reshape(mean.shape) * weights).sum()
    if second:
        s = (phi * (p.means[rows] ** 2 + torch.exp(2 * p.log_stds[rows]))).sum(-1)
        ref_var = lam * s - (lam * m) ** 2
        assert torch.allclose(var.reshape(-1), ref_var.clamp_min(0), rtol=1e-7, atol=1e-12)
        ours, ref = ours + var.sum(), ref + ref_var.sum()
    for a, b in zip(torch.autograd.grad(ours, params), torch.autograd.grad(ref, params), strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(2, 64),
    seed=st.integers(0, 10**6),
    narrowing=st.floats(2.0, 5.0),
    windows=st.sampled_from(["none", "outlier"]),
    second=st.booleans(),
    train_weight=st.booleans(),
)
def test_all_lumped_weights_match_the_full_formula(k, seed, narrowing, windows, second, train_weight):
    """Weights in bins where every component's e^{π N} rounds to 1 (onehot.ALL_LUMPED) take φ = 1/K, i.e.
    m = Σ_k μ_k / K with no component evaluated: values and gradients equal the full formula's, for any K."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(40, 30, generator=g, dtype=torch.float64) * 0.1
    w.view(-1)[:2] = torch.tensor([1.4, -1.1], dtype=torch.float64)
    config = sqs.SQSConfig(
        num_components=k, windows=windows, responsibility="paper", temperature=5e-4, train_weight=train_weight
    )
    p = SpikeGMMPosterior(w, config, generator=torch.Generator().manual_seed(seed)).double()
    with torch.no_grad():
        p.log_stds.sub_(narrowing)
        p.mixing_logits.add_(torch.randn(p.mixing_logits.shape, generator=g, dtype=torch.float64))
        p.gate_logits.add_(torch.randn(p.gate_logits.shape, generator=g, dtype=torch.float64) * 0.02)
    assume(uncovered_counts(p)[ALL_LUMPED] > 0)
    _assert_matches_the_full_formula(p, second, g)


@pytest.mark.parametrize("second", [False, True])
@pytest.mark.parametrize("narrowing", [2.5, 4.0])
def test_settled_weights_and_their_gate_kl_match_the_full_formula(monkeypatch, second, narrowing):
    """Weights of settled all-lumped bins (onehot.LUMPED_SETTLED: φ = 1/K, k* their bin's), which the eager step
    evaluates with the certified ones (sqs_core._one_hot): θ^avg = λ̃ Σ_k μ_k / K, Var from Σ_k (μ_k² + σ_k²) / K,
    the gate KL at their k*, and the gradients of all three (reaching every component of the window, its
    mixing logits and the gates) equal autograd through the paper's full formula, k* the argmax of log π_k N_k."""
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 256)
    g = torch.Generator().manual_seed(5)
    w = torch.randn(60, 50, generator=g, dtype=torch.float64) * 0.1
    w.view(-1)[:3] = torch.tensor([1.5, -1.2, 1.1], dtype=torch.float64)
    prior = sqs.SpikeSlabPrior(keep_prob=0.3, slab_std=0.7)
    config = sqs.SQSConfig(num_components=16, windows="outlier", responsibility="paper", temperature=5e-4, prior=prior)
    p = SpikeGMMPosterior(w, config, generator=torch.Generator().manual_seed(0)).double()
    with torch.no_grad():
        p.log_stds.sub_(narrowing)  # narrow components: most weights far from all of them
        p.mixing_logits.add_(torch.randn(p.mixing_logits.shape, generator=g, dtype=torch.float64))
        p.gate_logits.add_(torch.randn(p.gate_logits.shape, generator=g, dtype=torch.float64) * 0.02)
        p.mask.view(-1)[::7] = False
    assert uncovered.settled_count(p) > 200, uncovered_counts(p)  # beside all-lumped bins that do not settle
    mean, var = p.moments(second=second)
    kl = p.kl()
    theta, rows = p.weight.reshape(-1), p.window_ids.reshape(-1).long()
    q = component_log_density(theta, p.means[rows], p.log_stds[rows], F.log_softmax(p.mixing_logits, -1)[rows])
    phi = log_responsibilities(q, "paper", 5e-4).exp()
    scaled, kept = p.gate_logits.reshape(-1) / p.gate_temperature, p.mask.reshape(-1)
    lam = torch.sigmoid(scaled) * kept
    m = (phi * p.means[rows]).sum(-1)
    ref_kl = (lam * gaussian_kl(p.means, p.log_stds, 0.7)[rows, q.argmax(-1)]).sum()
    ref_kl = ref_kl + torch.where(kept, bernoulli_kl(scaled, 0.3), torch.full_like(scaled, -math.log(0.7))).sum()
    assert torch.allclose(mean.reshape(-1), lam * m, rtol=1e-9, atol=1e-12)
    assert torch.allclose(kl, ref_kl, rtol=1e-9)
    weights = torch.randn(mean.shape, generator=g, dtype=torch.float64)
    ours, ref = (mean * weights).sum() + 0.37 * kl, (lam * m * weights.reshape(-1)).sum() + 0.37 * ref_kl
    if second:
        s = (phi * (p.means[rows] ** 2 + torch.exp(2 * p.log_stds[rows]))).sum(-1)
        ref_var = lam * s - (lam * m) ** 2
        assert torch.allclose(var.reshape(-1), ref_var.clamp_min(0), rtol=1e-7, atol=1e-12)
        ours, ref = ours + var.sum(), ref + ref_var.sum()
    params = [p.means, p.log_stds, p.mixing_logits, p.gate_logits]
    for a, b in zip(torch.autograd.grad(ours, params), torch.autograd.grad(ref, params), strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-9)


def test_certified_fraction_is_a_share_of_one_hot_rows():
    """Certified weights are one-hot, so their share is at most that of rows with max φ = 1; at the
    default τ nearly all of a freshly prepared layer is covered, at τ = 0.5 none can be."""
    shares = {}
    for temperature in (5e-4, 0.5):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 64))
        sqs.prepare_(model, sqs.SQSConfig(num_components=4, temperature=temperature))
        (posterior,) = sqs.posteriors(model).values()
        shares[temperature] = posterior.certified_fraction()
        one_hot = float((posterior.responsibilities().max(1).values == 1).float().mean())
        assert 0.0 <= shares[temperature] <= one_hot
    assert shares[5e-4] > 0.9 and shares[0.5] == 0.0


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("k", [4, 8])
@pytest.mark.parametrize("extreme", ["tiny-sigma", "far-means"])
def test_bounds_that_overflow_float32_leave_no_padding_column_on_top(k, extreme, compiled):
    """In float32, dist²/σ² of the bin table overflows for σ ≈ 2e-22 (log σ = −50) or μ ≈ 1e30: every bound
    was −inf like the table's −inf padding (K < 17), topk could put a padding column first, and the training
    forward raised IndexError (index 8 out of bounds for dimension 1 with size K). Now the forward runs and
    matches the full K-component formula, with finite gradients."""
    w = torch.randn(16, 16, generator=torch.Generator().manual_seed(0)) * 0.1
    config = sqs.SQSConfig(num_components=k, windows="none", compile_kernels=compiled)
    p = SpikeGMMPosterior(w, config, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        if extreme == "tiny-sigma":
            p.log_stds.fill_(-50.0)
        else:
            p.means.fill_(1e30)
    mean, _ = p.moments()
    phi = _full_log_phi(p.weight.reshape(-1), p.means[0], p.log_stds[0], p.mixing_logits[0], "paper", 5e-4).exp()
    lam = torch.sigmoid(p.gate_logits.reshape(-1) / p.gate_temperature)
    reference = lam * (phi * p.means[0]).sum(-1)
    assert torch.allclose(mean.reshape(-1), reference, rtol=1e-6)
    kl = p.kl()  # μ = 1e30: KL(N(μ, σ²)‖N(0, 1)) is inf in float32 (Objective names the layer); σ = 2e-22: finite
    assert torch.isfinite(kl) == (extreme == "tiny-sigma")
    (mean.sum() + (kl if extreme == "tiny-sigma" else 0)).backward()
    assert torch.isfinite(p.gate_logits.grad).all() and torch.isfinite(p.log_stds.grad).all()


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10**6), narrowing=st.sampled_from([1.5, 2.5, 3.5]), second=st.booleans())
def test_the_exp_floor_changes_no_float32_moment_or_gradient(seed, narrowing, second):
    """The eager nearby evaluation raises exp arguments below _nearby.exp_floor (torch's CPU exp is ~100×
    slower below it) and zeroes ∂π N/∂q there. In float32, with narrow components (many π N far below the
    floor) and rows whose largest π N is large (the softmaxes' other terms below it), the moments and every
    gradient match the evaluation without the floor."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(80, 60, generator=g) * 0.1
    config = sqs.SQSConfig(num_components=16, windows="none", temperature=5e-4, train_weight=True)
    results = []
    for floor in (_nearby.exp_floor, lambda dtype: -math.inf):
        p = SpikeGMMPosterior(w, config, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            p.log_stds.sub_(narrowing)
            p.mixing_logits.add_(torch.randn(p.mixing_logits.shape, generator=torch.Generator().manual_seed(seed)))
        with mock.patch.object(_nearby, "exp_floor", floor):
            mean, var = p.moments(second=second)
            params = [p.means, p.log_stds, p.mixing_logits, p.gate_logits, p.weight]
            weights = torch.randn(mean.shape, generator=torch.Generator().manual_seed(1))
            grads = torch.autograd.grad((mean * weights).sum() + (var.sum() if second else 0), params)
        results.append((mean.detach(), var.detach() if second else mean.new_zeros(()), grads))
    evaluated = evaluated_components(p)
    nearby = evaluated.sum(1) < 16  # the weights of the nearby path, on their evaluated components
    q = log_densities64(p)[nearby]
    below = q[evaluated[nearby]] < _nearby.exp_floor(torch.float32)
    assert int(nearby.sum()) > 50 and int(below.sum()) > 100  # the floor is reached, many times
    (mean, var, ours), (mean_ref, var_ref, theirs) = results
    assert torch.allclose(mean, mean_ref, rtol=1e-6, atol=1e-30) and torch.allclose(var, var_ref, rtol=1e-6, atol=1e-30)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max()))


@pytest.mark.parametrize("k", [3, 5, 9, 16, 17, 33])
@pytest.mark.parametrize("narrowing", [0.0, -0.5])
def test_tables_hold_only_the_columns_k_can_use(k, narrowing):
    """A bin table keeps onehot.table_columns(K) nearby columns (the widest width below K, at least
    LUMPED_SCAN; none for the standard responsibility), not NEARBY for every K: the tables of all layers
    live from a training forward to its backward. Weights in bins of every width below K still match the
    full formula."""
    assert [onehot.table_columns(n) for n in (2, 4, 5, 8, 9, 16, 17, 32, 33, 64)] == [4, 4, 4, 4, 8, 8, 16, 16, 32, 32]
    assert onehot.table_columns(64, "standard") == 0
    g = torch.Generator().manual_seed(k)
    w = torch.randn(60, 50, generator=g, dtype=torch.float64) * 0.1
    config = sqs.SQSConfig(num_components=k, windows="outlier", responsibility="paper", temperature=5e-4)
    p = SpikeGMMPosterior(w, config, generator=torch.Generator().manual_seed(0)).double()
    with torch.no_grad():
        p.log_stds.sub_(narrowing)
        p.mixing_logits.add_(torch.randn(p.mixing_logits.shape, generator=g, dtype=torch.float64))
    table = uncovered._blocks(p)[1]
    assert table.nearby.shape[1] == onehot.table_columns(k)
    counts = uncovered_counts(p)
    if k > NEARBY_WIDTHS[0]:  # below, no width fits: uncovered weights take all K
        assert sum(n for width, n in counts.items() if width in NEARBY_WIDTHS) > 20, counts
    assert all(width < k for width in counts if width in NEARBY_WIDTHS), counts
    _assert_matches_the_full_formula(p, True, g)
    standard_config = sqs.SQSConfig(num_components=k, responsibility="standard")
    standard = SpikeGMMPosterior(w, standard_config, generator=torch.Generator().manual_seed(0))
    assert uncovered._blocks(standard)[1].nearby.shape[1] == 0
