"""Mixed-precision training (``torch.autocast``): the posterior is evaluated in its own precision, the layer's op
(F.linear, the convolution) in the autocast dtype, as the user asked.

Before sqs_core._autocast, the eager step under CPU bfloat16 autocast failed (``torch.linalg.vecdot``, on autocast's
lower-precision list, made the nearby components' moments bfloat16 and their ``index_copy_`` refused them).
"""

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from sqs_core import _fused_uncovered, chunked
from sqs_core.onehot import NARROW, NARROW_WIDTHS
from torch import nn
from uncovered import spread_posterior, uncovered_counts

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

AUTOCAST_DTYPES = [torch.bfloat16, torch.float16]


def _posterior(compiled):
    """A float32 posterior, K = 64, log σ + 1.3 (uncovered.spread_posterior): most weights uncovered, in bins of
    every nearby width, wide ones included."""
    return spread_posterior(64, 1.3, compiled, torch.float32)


def _values_and_grads(p, second):
    """θ^avg, Var, k*, the gate KL and the gradients of a random linear functional of them."""
    mean, var = p.moments(second=second)
    kl = p.kl()
    g = torch.Generator().manual_seed(1)
    out = (mean * torch.randn(mean.shape, generator=g).to(mean.device)).sum() + 1e-3 * kl
    if second:
        out = out + (var * torch.randn(var.shape, generator=g).to(var.device)).sum()
    grads = torch.autograd.grad(out, [p.means, p.log_stds, p.mixing_logits, p.gate_logits])
    return [mean.detach(), *([var.detach()] if second else []), p._kstar.clone(), kl.detach(), *grads]


@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
@pytest.mark.parametrize(
    ("compiled", "second"),
    # compiled, one variant: the kernels are entered the same way for both; each variant compiles its own
    # float32 graphs (minutes on a cold cache)
    [(False, False), (False, True), (True, True)],
    ids=["eager-plugin", "eager-second-moment", "compiled-second-moment"],
)
def test_posterior_under_autocast_is_the_float32_posterior(monkeypatch, compiled, second, dtype):
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 1024)  # several chunks, each with blocks of every width
    # compiled: widths 8 and 16 by the rolled kernels too (the ones that evaluate with torch.linalg.vecdot), which
    # compile once for every width: the unrolled width-8 and -16 float32 kernels would add minutes of compiling
    monkeypatch.setattr(_fused_uncovered, "UNROLLED_MAX", 4)
    p = _posterior(compiled)
    counts = uncovered_counts(p)
    assert all(counts.get(width, 0) > 10 for width in NARROW_WIDTHS), counts  # the nearby path runs
    assert sum(n for width, n in counts.items() if width > NARROW) > 20, counts  # wide bins: compiled, rolled kernels
    want = _values_and_grads(p, second)
    with torch.autocast("cpu", dtype=dtype):  # forward and backward both inside, the harder case
        got = _values_and_grads(p, second)
    assert [t.dtype for t in got] == [t.dtype for t in want]
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(a, b), index


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")
@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
def test_posterior_under_cuda_autocast_is_the_float32_posterior(dtype):
    """The same on a GPU, eager (packages/sqs-core/benchmarks/gpu_checks.sh runs it on a lent machine)."""
    p = _posterior(False).cuda()
    want = _values_and_grads(p, True)
    with torch.autocast("cuda", dtype=dtype):
        got = _values_and_grads(p, True)
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(a, b), index


def test_inference_and_schedule_under_autocast_match_full_precision():
    p = _posterior(False)
    want = (p.levels_and_alternatives(), p.certified_fraction(), p.responsibilities())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = (p.levels_and_alternatives(), p.certified_fraction(), p.responsibilities())
    (want_levels, (want_index, want_probs)), (got_levels, (got_index, got_probs)) = want[0], got[0]
    assert torch.equal(got_levels, want_levels) and torch.equal(got_index, want_index)
    assert torch.equal(got_probs, want_probs) and got[1] == want[1] and torch.equal(got[2], want[2])


def test_a_training_step_under_autocast_runs_the_layers_in_the_autocast_dtype():
    """prepare → schedule → Objective under bfloat16 autocast: the conv and linear outputs are bfloat16, the loss
    and every gradient finite, and the schedule's masks those of the same step without autocast."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
    config = sqs.SQSConfig(num_components=16, windows="outlier", compile_kernels=False)
    sqs.prepare_(model, config)
    masks = []
    for autocast in (False, True):
        schedule = sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=4, update_every=1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            schedule.step(3)
        masks.append([p.mask.clone() for p in sqs.posteriors(model).values()])
    assert all(torch.equal(a, b) for a, b in zip(*masks, strict=True))
    outputs = []
    model[0].register_forward_hook(lambda _m, _i, out: outputs.append(out.dtype))
    x, y = torch.randn(16, 3, 8, 8), torch.randint(0, 10, (16,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = sqs.Objective(model, num_data=100)(F.cross_entropy(model(x), y))
    loss.backward()
    assert outputs == [torch.bfloat16] and torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
