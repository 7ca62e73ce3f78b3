"""The compiled path's dense route (sqs_core._dense, a GPU's default) against plain autograd and the eager path.

The route runs on the CPU here (``dense_route`` patched): inductor's C++ kernels evaluate the same graphs as its
Triton ones on a GPU. Chunks of 512 weights in tiles of 256 split the windows across chunks and reach the tiled
column sums; float64 throughout but for the float32 case.
"""

import pytest
import sqs_core as sqs
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sqs_core import _dense
from sqs_core._compiled import _Kernel, _known_option
from sqs_core.mixture import component_log_density
from sqs_core.posterior import SpikeGMMPosterior
from test_posterior import _reference

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


@pytest.fixture
def dense(monkeypatch):
    monkeypatch.setattr(_dense, "dense_route", lambda device: True)
    monkeypatch.setattr(_dense, "DENSE_CHUNK_WEIGHTS", 512)
    monkeypatch.setattr(_dense, "COLUMN_TILE", 256)


def _posterior(compiled, shape=(64, 40), seed=0, log_std_shift=0.5, **settings):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(*shape, generator=g) * 0.1
    w.view(-1)[:3] = torch.tensor([2.0, -1.5, 1.2])  # outliers, so the tail windows exist
    config = sqs.SQSConfig(compile_kernels=compiled, **settings)
    p = SpikeGMMPosterior(w, config, generator=torch.Generator().manual_seed(seed)).double()
    with torch.no_grad():
        p.gate_logits.add_(torch.randn(p.gate_logits.shape, generator=g, dtype=torch.float64) * 0.02)
        p.log_stds.add_(log_std_shift)
        p.mixing_logits.add_(torch.randn(p.mixing_logits.shape, generator=g, dtype=torch.float64))
        p.mask.view(-1)[::5] = False
    return p


def _outputs(p, second, with_kl=True):
    """θ^avg, Var, k* and the gradients of a random functional of them and the gate KL."""
    mean, var = p.moments(second=second)
    g = torch.Generator().manual_seed(1)
    out = (mean * torch.randn(mean.shape, generator=g, dtype=torch.float64).to(mean.dtype)).sum()
    if second:
        out = out + (var * torch.randn(var.shape, generator=g, dtype=torch.float64).to(var.dtype)).sum()
    if with_kl:
        out = out + 0.3 * p.kl()
    params = [p.means, p.log_stds, p.mixing_logits, p.gate_logits] + ([p.weight] if p.weight.requires_grad else [])
    return p._kstar.clone(), [mean.detach(), (var.detach() if second else None), *torch.autograd.grad(out, params)]


def _assert_close(got, want, rtol=1e-9):
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if b is not None:
            scale = max(float(b.abs().max()), 1e-300)
            torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * scale, msg=f"output {i}")


@pytest.mark.parametrize(
    "settings",
    [
        dict(num_components=4, windows="none", temperature=5e-3, train_weight=True),
        dict(num_components=16, windows="outlier", temperature=5e-4),
        dict(num_components=8, windows="equal", responsibility="standard", temperature=0.05, train_weight=True),
        dict(num_components=6, windows="outlier", prior=sqs.GaussianPrior(slab_std=0.7)),  # a Gaussian spike: σ_0² > 0
    ],
    ids=["paper-K4-none-theta", "paper-K16-outlier", "standard-K8-equal-theta", "paper-K6-gaussian-spike"],
)
@pytest.mark.parametrize("second", [False, True])
def test_dense_values_and_gradients_match_autograd_and_the_eager_path(dense, settings, second):
    """θ^avg and Var against autograd over (T, K) tensors; the gradients (with the gate KL's) and k* against the
    eager path, whose own agreement with autograd tests/core/test_posterior.py holds."""
    p = _posterior(True, **settings)
    kstar, got = _outputs(p, second)
    ref_mean, ref_var, _ = _reference(p, second)
    torch.testing.assert_close(got[0].reshape(-1), ref_mean.detach(), rtol=1e-10, atol=1e-12)
    if second:
        torch.testing.assert_close(got[1].reshape(-1), ref_var.detach().clamp_min(0), rtol=1e-10, atol=1e-12)
    want_kstar, want = _outputs(_posterior(False, **settings), second)
    kept = p.mask.reshape(-1)  # the eager path does not evaluate a pruned weight: its k* is its bin's best
    assert torch.equal(kstar[kept], want_kstar[kept])
    _assert_close(got, want)
    assert "DensePosteriorMoments" in type(_posterior_node(p.moments()[0])).__name__


def _posterior_node(tensor):
    """The autograd node of the posterior's Function behind ``tensor`` (past the reshape to θ's shape)."""
    node = tensor.grad_fn
    while "PosteriorMoments" not in type(node).__name__:
        node = node.next_functions[0][0]
    return node


def _log_densities(p):
    wid = p.window_ids.reshape(-1).long()
    log_mix = torch.log_softmax(p.mixing_logits, -1)
    rows = [
        component_log_density(p.weight.reshape(-1)[i : i + 1], p.means[w], p.log_stds[w], log_mix[w])
        for i, w in enumerate(wid.tolist())
    ]
    return torch.cat(rows).detach()


@settings(max_examples=6, deadline=None)
@given(
    k=st.sampled_from([2, 3, 7, 12]),
    log_std_shift=st.floats(-3.0, 1.0),
    temperature=st.sampled_from([5e-4, 0.05, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_dense_route_is_the_full_formula_for_any_mixture(k, log_std_shift, temperature, seed):
    """Any K, component widths from far narrower than the weights' spread (every component lumped on the
    certified route) to wider, any temperature: θ^avg and Var equal autograd over (T, K) tensors, and k* is the
    argmax of log π_k N_k(θ) over all K components."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_dense, "dense_route", lambda device: True)
        patch.setattr(_dense, "DENSE_CHUNK_WEIGHTS", 512)
        p = _posterior(
            True, shape=(40, 30), seed=seed, log_std_shift=log_std_shift, num_components=k, temperature=temperature
        )
        mean, var = p.moments(second=True)
    ref_mean, ref_var, _ = _reference(p, True)
    torch.testing.assert_close(mean.detach().reshape(-1), ref_mean.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(var.detach().reshape(-1), ref_var.detach().clamp_min(0), rtol=1e-10, atol=1e-12)
    assert torch.equal(p._kstar.long(), _log_densities(p).argmax(-1))


def test_dense_float32_is_near_float64(dense, monkeypatch):
    """In the float32 a posterior trains in, values and gradients are as near the float64 evaluation as the eager
    path's float32 ones (within 4× of their largest error, output by output, and 2e-4 of the largest entry)."""
    settings = dict(num_components=16, windows="outlier", temperature=5e-3)
    want = _outputs(_posterior(True, **settings), True)[1]
    got = _outputs(_posterior(True, **settings).float(), True)[1]
    monkeypatch.setattr(_dense, "dense_route", lambda device: False)
    eager = _outputs(_posterior(False, **settings).float(), True)[1]
    for i, (a, b, c) in enumerate(zip(got, want, eager, strict=True)):
        scale = float(b.abs().max())
        error, eager_error = float((a.double() - b).abs().max()), float((c.double() - b).abs().max())
        assert error <= 4 * eager_error + 1e-7 * scale and error <= 2e-4 * scale, f"output {i}"


def test_dense_route_saves_no_tensor_of_pairs(dense):
    """Backward recomputes: the autograd node keeps the inputs and k*, nothing of size T·K."""
    p = _posterior(True, num_components=16)
    mean, _ = p.moments(second=True)
    node = _posterior_node(mean)
    assert "DensePosteriorMoments" in type(node).__name__
    assert max(t.numel() for t in node.saved_tensors) <= p.weight.numel()


def test_dense_route_follows_the_device(monkeypatch):
    """An accelerator takes the dense route; the CPU keeps the certified one."""
    assert _dense.dense_route(torch.device("cuda")) and _dense.dense_route(torch.device("meta"))
    assert not _dense.dense_route(torch.device("cpu"))
    p = _posterior(True, num_components=4)
    assert "FusedPosteriorMoments" in type(_posterior_node(p.moments()[0])).__name__


def test_settings_this_torch_lacks_are_dropped():
    """Inductor settings come and go between torch versions (the lent GPU's torch 2.11 lacked one of 2.13's):
    a kernel's unknown settings are left out rather than failing the compile."""
    assert _known_option("realize_reads_threshold") and not _known_option("no_such_inductor_setting")
    kernel = _Kernel(lambda x: x * 2, dynamic=None, options={"no_such_inductor_setting": 1})
    torch.testing.assert_close(kernel(torch.arange(4.0)), torch.arange(4.0) * 2)
