"""The compiled path (SQSConfig.compile_kernels=True, sqs_core._fused) against the eager one.

Compiling is slow (seconds per kernel variant), so the matrix below is chosen to reach every kernel
variant once (responsibility kind × second moments × grad of θ × prior) in float64, on small layers.
"""

import json
import math
import subprocess
import sys

import pytest
import sqs_core as sqs
import torch
from sqs_core import _fused, chunked
from sqs_core.onehot import ALL_LUMPED, NARROW, NARROW_WIDTHS
from sqs_core.posterior import SpikeGMMPosterior
from torch import nn
from uncovered import (
    evaluated_components,
    log_densities64,
    settled_count,
    spread_posterior,
    uncovered_counts,
    uncovered_mask,
)

# inductor's own use of torch.jit.script_method, not ours (its numpy warning: pyproject.toml)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

# name: (config settings, second moments, whether weights take the nearby-component path, at every width)
CASES = {
    "paper-K4-none-trained-theta": (
        dict(num_components=4, windows="none", temperature=5e-3, train_weight=True),
        False,
        False,
    ),
    "paper-K20-outlier-gaussian-trained-theta": (
        dict(num_components=20, prior=sqs.GaussianPrior(slab_std=0.7), train_weight=True),
        True,
        True,
    ),
    "standard-K6-outlier": (dict(num_components=6, responsibility="standard", temperature=0.05), True, False),
    "standard-K12-none-gaussian": (
        dict(num_components=12, windows="none", responsibility="standard", prior=sqs.GaussianPrior(slab_std=0.5)),
        False,
        False,
    ),
}


def _posterior(settings, compiled, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(24, 17, generator=g) * 0.1
    w.view(-1)[:3] = torch.tensor([2.0, -1.5, 1.2])  # outliers, so the tail windows exist
    config = sqs.SQSConfig(**settings, compile_kernels=compiled)
    p = SpikeGMMPosterior(w, config, generator=torch.Generator().manual_seed(seed)).double()
    with torch.no_grad():  # spread the gates and move the means off the weights: some weights uncovered
        p.gate_logits.add_(torch.randn(p.gate_logits.shape, generator=g, dtype=torch.float64) * 0.02)
        p.means.add_(torch.randn(p.means.shape, generator=g, dtype=torch.float64) * 0.01)
        p.mask.view(-1)[::5] = False
    return p


def _values_and_grads(p, second):
    """θ^avg, Var, k*, the KL and the gradients of a random linear functional of all three; the KL once as
    the forward summed it and once summed again on its own (sqs_core._gate_kl), which must agree."""
    mean, var = p.moments(second=second)
    kstar = p._kstar.clone()
    results = [mean.detach(), (var.detach() if second else mean.detach())]
    params = [p.means, p.log_stds, p.mixing_logits, p.gate_logits] + ([p.weight] if p.config.train_weight else [])
    for kl in (p.kl(), p.kl()):  # the first call hands out the forward's KL, the second sums it again
        g = torch.Generator().manual_seed(1)
        out = (mean * torch.randn(mean.shape, generator=g, dtype=mean.dtype)).sum() + 1e-3 * kl
        if second:
            out = out + (var * torch.randn(var.shape, generator=g, dtype=var.dtype)).sum()
        results += [kl.detach(), *torch.autograd.grad(out, params, retain_graph=True)]
    half = (len(results) - 2) // 2
    for index, (a, b) in enumerate(zip(results[2 : 2 + half], results[2 + half :], strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11 * max(float(b.abs().max()), 1.0), msg=f"KL {index}")
    return results, kstar


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 96)  # several chunks, the last one smaller


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_values_and_gradients_match_eager(small_chunks, case):
    settings, second, nearby = CASES[case]
    eager, compiled = _posterior(settings, False), _posterior(settings, True)
    fraction = compiled.certified_fraction()
    assert 0.2 < fraction < 1.0  # both the certified and the uncovered paths run
    widths = {w for w in NARROW_WIDTHS if w < settings["num_components"]}  # K = 20: no wide bins (K ≤ NEARBY)
    assert set(uncovered_counts(compiled)) == ({0, *widths} if nearby else {0})  # every kind of block runs
    before = {name: kernel.calls for name, kernel in _fused.KERNELS.items()}
    want, want_kstar = _values_and_grads(eager, second)
    got, got_kstar = _values_and_grads(compiled, second)
    calls = {name: kernel.calls - before[name] for name, kernel in _fused.KERNELS.items()}
    moments = "_moments_second" if second else "_moments_first"
    for name in ("_bin_bounds", moments, "_one_hot_backward", "_gate_kl_sum", "_gate_kl_backward"):
        assert calls[name] > 0, (name, calls)
    for name in ("_nearby_forward", "_nearby_inputs", "_nearby_vjp"):
        assert (calls[name] > 0) == nearby, (name, calls)
    assert calls["_full_columns"] > 0 or nearby, calls
    assert torch.equal(got_kstar, want_kstar)
    # ∂/∂θ (trained θ: the last gradient of each half) sums terms ~1/(τσ²) larger than itself, which eager's
    # log-sum-exps and the kernels' normalised sums round differently: K = 20 gives 1.6e-9 at a scale of 150,
    # the compiled value the nearer to a float64 evaluation of the full formula (2.5e-12 off)
    count = 4 + int(settings.get("train_weight", False))  # gradients per half: μ, log σ, π, s̃ (and θ)
    theta_grads = {2 + count, 3 + 2 * count} if settings.get("train_weight") else set()
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        atol = (1e-10 if index in theta_grads else 1e-11) * max(float(b.abs().max()), 1.0)
        torch.testing.assert_close(a, b, rtol=1e-9, atol=atol, msg=f"output {index}")


def _eager_and_compiled(k, log_std_shift):
    """An eager and a compiled float64 posterior, alike (uncovered.spread_posterior)."""
    return [spread_posterior(k, log_std_shift, compiled) for compiled in (False, True)]


def _assert_paths_agree(want, got):
    """The outputs of :func:`_values_and_grads` (values, k*) of the eager and the compiled path agree."""
    assert torch.equal(got[1], want[1])
    for index, (a, b) in enumerate(zip(got[0], want[0], strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11 * max(float(b.abs().max()), 1.0), msg=f"output {index}")


@pytest.mark.parametrize("widen", [0.8, -2.5])
@pytest.mark.parametrize("second", [False, True])
def test_compiled_matches_eager_on_bins_of_every_nearby_width(monkeypatch, second, widen):
    """Components about as wide as the gaps between them (K = 64, the paper's formula, log σ + ``widen`` = 0.8):
    most weights are uncovered, in bins of every narrow width and of several wide ones (above 16: those bins'
    components come from a topk of their own, onehot._nearby_table, their widths from sqs_core._wide; compiled,
    _fused_uncovered's rolled kernels, one graph for every width); narrow ones (−2.5):
    most in bins of width 4 or where every component is lumped (onehot.ALL_LUMPED). Values, k* and gradients
    of both paths agree."""
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 1024)  # several chunks, each with blocks of every width
    eager, compiled = _eager_and_compiled(64, widen)
    counts = uncovered_counts(compiled)
    kinds = NARROW_WIDTHS if widen > 0 else (4, ALL_LUMPED)
    assert all(counts.get(width, 0) > (10 if widen > 0 else 500) for width in kinds), counts
    wide = {width for width in counts if width > NARROW}  # widths chosen per table (sqs_core._wide)
    assert widen < 0 or (len(wide) > 1 and sum(counts[width] for width in wide) > 20), counts
    assert widen > 0 or settled_count(compiled) > 100  # compiled: settled all-lumped weights with the certified
    want = _values_and_grads(eager, second)
    before = {name: kernel.calls for name, kernel in _fused.KERNELS.items()}
    got = _values_and_grads(compiled, second)
    calls = {name: kernel.calls - before[name] for name, kernel in _fused.KERNELS.items()}
    special = ("_rolled_forward", "_rolled_vjp") if widen > 0 else ("_lumped_forward", "_lumped_backward")
    assert all(calls[name] > 0 for name in special), calls  # wide: rolled kernels; all lumped: their own
    _assert_paths_agree(want, got)


@pytest.mark.parametrize("second", [False, True])
def test_compiled_matches_eager_where_every_component_is_lumped_at_small_k(small_chunks, second):
    """K = 3 (no nearby width applies): narrow components leave most weights uncovered, in bins where every
    component is lumped (onehot.ALL_LUMPED, φ = 1/K) or on all K; both paths agree, k* included."""
    eager, compiled = _eager_and_compiled(3, -3.0)
    counts = uncovered_counts(compiled)
    assert counts[ALL_LUMPED] > 1000 and counts[0] > 100 and settled_count(compiled) > 500, counts
    _assert_paths_agree(_values_and_grads(eager, second), _values_and_grads(compiled, second))


def test_compiled_path_limits_match_eager(small_chunks):
    """λ̃ → 1 with every gate kept: θ^avg = μ_k* wherever φ is certified one-hot, on both paths."""
    settings = CASES["standard-K6-outlier"][0]
    eager, compiled = _posterior(settings, False), _posterior(settings, True)
    for p in (eager, compiled):
        with torch.no_grad():
            p.mask.fill_(True)
            p.gate_logits.fill_(1.0)  # λ̃ = sigmoid(1/τ') = 1 in float64
    want, got = eager.posterior_mean().detach(), compiled.posterior_mean().detach()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    assert torch.equal(compiled._kstar, eager._kstar)
    flat = compiled.weight.detach().reshape(-1), compiled.window_ids.reshape(-1)
    params = (compiled.means.detach(), compiled.log_stds.detach(), compiled.mixing_logits.detach(), "standard", 0.05)
    _, certified = chunked.certified_levels(*flat, *params)
    levels = compiled.level_values(compiled._kstar.reshape(compiled.weight.shape)).reshape(-1)
    assert 0 < int(certified.sum()) < certified.numel()
    assert torch.equal(got.reshape(-1)[certified], levels[certified])


def test_compiled_forward_takes_the_argmax_of_pi_n_where_phi_ties(small_chunks):
    """Narrow components: most weights are far from every one and their paper φ rounds to uniform; k* (the
    gate KL's component) is argmax log(π_k N_k) on both paths, on the nearby components and on all K."""
    settings = CASES["paper-K20-outlier-gaussian-trained-theta"][0]
    posteriors = [_posterior(settings, compiled) for compiled in (False, True)]
    for p in posteriors:
        with torch.no_grad():
            p.log_stds.fill_(-9.0)
        p.moments(second=True)
    eager, compiled = posteriors
    assert set(uncovered_counts(compiled)) >= {0, 4}  # the all-K and the nearby path both run
    assert torch.equal(compiled._kstar, eager._kstar)
    q = log_densities64(eager).masked_fill(~evaluated_components(eager), -math.inf)  # nearby: some left out
    kept = eager.mask.reshape(-1)  # a pruned weight is not evaluated: its k* is its bin's best
    assert 0 < int(kept.sum()) < kept.numel()
    assert torch.equal(eager._kstar.reshape(-1).long()[kept], q.argmax(-1)[kept])


def test_flag_reaches_the_layers_it_names():
    model = nn.Sequential(nn.Linear(17, 24), nn.Linear(24, 3))
    settings = CASES["paper-K4-none-trained-theta"][0]  # the same kernel variants as that case: no new compile
    config = sqs.SQSConfig(**settings, overrides={r"^0$": {"compile_kernels": True}})
    sqs.prepare_(model, config)
    model.double()
    first, second = sqs.posteriors(model).values()
    assert first.spec().compiled and not second.spec().compiled
    assert first.config.compile_kernels is True and second.config.compile_kernels == "auto"  # small: eager
    before = _fused.KERNELS["_moments_first"].calls
    model[1](torch.randn(2, 24, dtype=torch.float64))  # the eager layer: no compiled call
    assert _fused.KERNELS["_moments_first"].calls == before
    model(torch.randn(2, 17, dtype=torch.float64)).sum().backward()
    assert _fused.KERNELS["_moments_first"].calls == before + 1
    assert first.gate_logits.grad is not None and torch.isfinite(first.gate_logits.grad).all()


@pytest.mark.parametrize("value", ["yes", "AUTO", 1, 0, None])
def test_compile_kernels_must_be_a_bool_or_auto(value):
    with pytest.raises(ValueError, match="compile_kernels"):
        sqs.SQSConfig(compile_kernels=value)
    with pytest.raises(ValueError, match="compile_kernels"):
        sqs.SQSConfig(overrides={"fc": {"compile_kernels": value}})


def test_compile_kernels_in_the_dict_only_when_set():
    assert "compile_kernels" not in sqs.SQSConfig().to_dict()  # "auto": configs and artifacts written before it
    for value in (True, False):
        config = sqs.SQSConfig(compile_kernels=value)
        assert config.to_dict()["compile_kernels"] is value
        assert sqs.SQSConfig.from_dict(config.to_dict()) == config
    assert sqs.SQSConfig.from_dict(sqs.SQSConfig().to_dict()) == sqs.SQSConfig()


def test_import_compiles_nothing():
    script = (
        "import sys, json, sqs_core\n"
        "print(json.dumps([m in sys.modules for m in ('sqs_core._fused', 'torch._dynamo', 'torch._inductor')]))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [False, False, False]


def test_bernoulli_kl_rewrite_is_stable():
    """The compiled gate KL writes KL(Bern(λ̃)‖Bern(λ)) with one exp and one log1p; check it against the
    eager formula where |ℓ| is huge (λ̃ saturates) and where it is moderate."""
    from sqs_core.mixture import bernoulli_kl

    scaled = torch.tensor([-800.0, -40.0, -3.0, 0.0, 2.5, 35.0, 900.0], dtype=torch.float64)
    ones = torch.ones_like(scaled, dtype=torch.bool)
    zeros = torch.zeros_like(scaled, dtype=torch.uint8)
    keep = 0.3
    args = (torch.zeros(1, dtype=torch.float64), _fused._scalar(1.0), 1)
    logs = (_fused._scalar(math.log(keep)), _fused._scalar(math.log1p(-keep)))
    for i in range(scaled.numel()):  # the kernel's body, uncompiled: its formula
        one = scaled[i : i + 1]
        got = _fused._gate_kl_sum(one, ones[i : i + 1], zeros[i : i + 1], zeros[i : i + 1], *args, *logs)
        torch.testing.assert_close(got, bernoulli_kl(one, keep).sum(), rtol=1e-12, atol=1e-12)


def test_compile_failure_names_the_switch(no_compiler):
    kernel = _fused._Kernel(chunked._gate_probs)
    args = (torch.ones(1, dtype=torch.bool), _fused._scalar(1.0))
    _, _, lam = kernel(torch.zeros(1), *args)  # sizes 0 and 1 run the body eagerly: nothing compiled
    assert kernel.compiled is None and float(lam) == 0.5
    with pytest.raises(RuntimeError, match="compile_kernels=False"):
        kernel(torch.zeros(4), args[0].expand(4), args[1])


def test_one_graph_for_every_layer_shape():
    """Layers of other shapes and sizes reuse the compiled kernels: no recompile (views of a conv weight
    would otherwise make dynamo guard on the base's shape)."""
    from torch._dynamo.utils import counters

    settings = {**CASES["paper-K4-none-trained-theta"][0], "compile_kernels": True}

    def step(model, x):
        sqs.prepare_(model, sqs.SQSConfig(**settings))
        model.double()
        out = model(x.double())
        (out.square().mean() + 1e-3 * sqs.Objective(model, num_data=10).kl()).backward()

    torch.manual_seed(0)
    step(nn.Sequential(nn.Conv2d(3, 6, 3), nn.Flatten(), nn.Linear(6 * 4 * 4, 5)), torch.randn(2, 3, 6, 6))
    graphs = counters["stats"]["unique_graphs"]
    step(nn.Sequential(nn.Linear(40, 33), nn.Conv1d(1, 5, 4)), torch.randn(3, 1, 40))
    assert counters["stats"]["unique_graphs"] == graphs


def test_a_kernel_past_dynamos_recompile_limit_compiles_on():
    """A kernel needs more graphs than dynamo's limit (8 per function; set to 1 here): past it, a new variant
    compiles under _compiled.RECOMPILE_LIMIT instead of failing (fullgraph), and every variant stays right."""
    from sqs_core._compiled import _Kernel

    def shift(x, kind):
        return x + 1 if kind == "one" else (x + 2 if kind == "two" else x + 3)

    kernel, x = _Kernel(shift), torch.arange(4.0)
    with torch._dynamo.config.patch(recompile_limit=1):
        outs = {kind: kernel(x, kind) for kind in ("one", "two", "three", "two")}
    assert [float(outs[k][0]) for k in ("one", "two", "three")] == [1.0, 2.0, 3.0]
    assert kernel.compiled is not None and kernel.calls == 4


@pytest.mark.parametrize("compiled", [False, True])
def test_pruned_weights_are_not_evaluated(monkeypatch, small_chunks, compiled):
    """The mixture evaluates exactly the uncovered weights the mask keeps (onehot.classify's keep), on both paths:
    a pruned weight's λ̃ is 0, so its θ^avg, Var and gradients do not depend on φ (the values and gradients
    against autograd: test_posterior, test_compiled_values_and_gradients_match_eager, both with every fifth
    weight pruned). Both paths leave out the weights of settled all-lumped bins (onehot.LUMPED_SETTLED) too: they
    are evaluated with the certified ones (sqs_core._one_hot, the compiled certified kernels)."""
    p = _posterior(CASES["paper-K20-outlier-gaussian-trained-theta"][0], compiled)
    with torch.no_grad():
        p.log_stds.fill_(-9.0)  # narrow: most weights uncovered
    module = _fused if compiled else chunked
    blocks, evaluated, offset = module.uncovered_blocks, [], [0]

    def spy(classes, *args, **kwargs):  # eager: called chunk by chunk, indices within the chunk
        for indices, width in blocks(classes, *args, **kwargs):
            evaluated.append(indices.long() + offset[0])
            yield indices, width
        offset[0] += classes.numel()

    monkeypatch.setattr(module, "uncovered_blocks", spy)
    p.moments(second=True)
    kept, uncovered = p.mask.reshape(-1), uncovered_mask(p, settled_inline=True)
    assert offset[0] == kept.numel()
    assert settled_count(p) > 10
    assert int((uncovered & ~kept).sum()) > 20 and int((uncovered & kept).sum()) > 100
    seen = torch.zeros_like(kept)
    seen[torch.cat(evaluated)] = True
    assert torch.equal(seen, uncovered & kept)
