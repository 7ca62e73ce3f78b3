"""The library on a CUDA device against the same model on the CPU (skipped where torch sees no GPU).

CI has no GPU; these run wherever one is present (packages/sqs-core/benchmarks/gpu_checks.sh on a lent GPU
machine). float64 throughout, so the two devices may differ only by the order of floating-point sums.
First run in session 30 on an H200 (docs/results/test_cuda_h200_s30*.log), which found the two device bugs of
prepare_ that the prepared-on-gpu cases catch; the schedules and moment-matched tests were added after it.
"""

import copy

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from torch import nn

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch"),
    # inductor's own use of torch.jit.script_method, not ours (its numpy warning: pyproject.toml)
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]
CUDA = torch.device("cuda")


def _net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 6 * 6, 40),
        nn.ReLU(),
        nn.Linear(40, 5),
    ).double()


def _data(device):
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 3, 6, 6, generator=g, dtype=torch.float64).to(device), torch.arange(16).remainder(5).to(
        device
    )


def _prepared(compiled, device, prepare_on_device):
    config = sqs.SQSConfig(num_components=8, compile_kernels=compiled, temperature=0.05)
    model = _net()
    if prepare_on_device:
        model.to(device)
    sqs.prepare_(model, config)
    return model.to(device)


def _train(model, device, steps, schedules=()):
    """``steps`` AdamW steps of the SQS objective, each ``schedules``' ``step(i)`` first; the last step's loss
    and gradients (on the CPU)."""
    x, y = _data(device)
    objective = sqs.Objective(model, num_data=1000)
    opt = torch.optim.AdamW(sqs.param_groups(model, other_lr=1e-3))
    for step in range(steps):
        for schedule in schedules:
            schedule.step(step)
        opt.zero_grad()
        loss = objective(F.cross_entropy(model(x), y))
        loss.backward()
        grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
    return loss.detach().cpu(), grads


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("prepare_on_device", [False, True], ids=["moved", "prepared-on-gpu"])
def test_training_steps_match_the_cpu(compiled, prepare_on_device):
    """prepare_ (on the GPU, or on the CPU and moved), three AdamW steps: the loss and every gradient of
    the last step agree with the CPU's to float64 summation-order error."""
    cpu_loss, cpu_grads = _train(_prepared(compiled, torch.device("cpu"), False), torch.device("cpu"), 3)
    gpu_loss, gpu_grads = _train(_prepared(compiled, CUDA, prepare_on_device), CUDA, 3)
    torch.testing.assert_close(gpu_loss, cpu_loss, rtol=1e-9, atol=1e-12)
    assert gpu_grads.keys() == cpu_grads.keys()
    for name, grad in cpu_grads.items():
        torch.testing.assert_close(gpu_grads[name], grad, rtol=1e-7, atol=1e-10, msg=name)


def test_inference_and_artifact_match_the_cpu(tmp_path):
    """greedy_, sample_ (a CPU generator), BayesianAverage and an artifact saved from the GPU model agree
    with the CPU model's."""
    cpu = _prepared(False, torch.device("cpu"), False)
    _train(cpu, torch.device("cpu"), 2)
    cpu.eval()
    gpu = copy.deepcopy(cpu).to(CUDA)
    x, _ = _data(torch.device("cpu"))
    average = sqs.BayesianAverage(cpu, samples=3, generator=torch.Generator().manual_seed(5))
    gpu_average = sqs.BayesianAverage(gpu, samples=3, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(gpu_average(x.to(CUDA)).cpu(), average(x), rtol=1e-9, atol=1e-12)
    sqs.save(gpu, tmp_path / "gpu.sqs")
    sqs.save(cpu, tmp_path / "cpu.sqs")
    assert (tmp_path / "gpu.sqs").read_bytes() == (tmp_path / "cpu.sqs").read_bytes()
    for infer in (sqs.greedy_, lambda m: sqs.sample_(m, generator=torch.Generator().manual_seed(3))):
        want = copy.deepcopy(cpu)
        got = copy.deepcopy(gpu)
        infer(want)
        infer(got)
        for (name, a), (_, b) in zip(want.state_dict().items(), got.state_dict().items(), strict=True):
            torch.testing.assert_close(b.cpu(), a, rtol=0, atol=0, msg=name)
    loaded = sqs.load(tmp_path / "gpu.sqs", _net().to(CUDA)).eval()
    greedy = sqs.greedy_(copy.deepcopy(cpu)).eval()
    torch.testing.assert_close(loaded(x.to(CUDA)).cpu(), greedy(x), rtol=1e-9, atol=1e-12)


def test_a_cuda_generator_draws_alike_from_the_model_and_its_file(tmp_path):
    """sample_ and load(mode="sample") with a CUDA generator (draws on the GPU) give the same weights; before,
    both failed with torch's device error (the uniforms were drawn on the CPU)."""
    gpu = _prepared(False, CUDA, True)
    _train(gpu, CUDA, 2)
    sqs.save(gpu, tmp_path / "gpu.sqs")
    sqs.sample_(gpu, generator=torch.Generator(device=CUDA).manual_seed(3))
    loaded = sqs.load(
        tmp_path / "gpu.sqs", _net().to(CUDA), mode="sample", generator=torch.Generator(device=CUDA).manual_seed(3)
    )
    for name, layer in sqs.sqs_layers(gpu).items():
        torch.testing.assert_close(loaded.get_submodule(name).weight, layer.weight, rtol=0, atol=0, msg=name)


def _scheduled_run(device, steps=6):
    """The README's loop on ``device``: both schedules (global cubic pruning to 50%, τ' halved at half the
    steps), then greedy_ and sample_ at nonzero=0.5, global and per layer; the masks and weights on the CPU."""
    model = _prepared(False, device, device.type == "cuda")
    pruning = sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=steps)
    _train(model, device, steps, schedules=(pruning, sqs.GateTemperatureSchedule(model, total_steps=steps)))
    masks = {name: p.mask.cpu() for name, p in sqs.posteriors(model).items()}
    weights = {}
    for per_layer in (False, True):
        greedy = sqs.greedy_(copy.deepcopy(model), nonzero=0.5, per_layer=per_layer)
        sampled = sqs.sample_(
            copy.deepcopy(model), nonzero=0.5, per_layer=per_layer, generator=torch.Generator().manual_seed(4)
        )
        for label, net in (("greedy", greedy), ("sample", sampled)):
            for name in masks:
                weights[(label, per_layer, name)] = net.get_submodule(name).weight.detach().cpu()
    return masks, weights


def test_the_schedules_and_pruned_inference_match_the_cpu():
    """PruningSchedule and GateTemperatureSchedule on a model prepared on the GPU, then greedy_ and sample_ with
    nonzero (global and per layer): the same hard masks as on the CPU, and the same weights to float64
    summation-order error (a pruned weight is exactly 0 on both)."""
    cpu_masks, cpu_weights = _scheduled_run(torch.device("cpu"))
    gpu_masks, gpu_weights = _scheduled_run(CUDA)
    assert gpu_masks.keys() == cpu_masks.keys()
    for name, mask in cpu_masks.items():
        assert torch.equal(gpu_masks[name], mask), name
        assert 0 < int(mask.sum()) < mask.numel(), name  # the schedule pruned some gates, not all
    for key, weight in cpu_weights.items():
        torch.testing.assert_close(gpu_weights[key], weight, rtol=1e-9, atol=1e-12, msg=str(key))
        assert torch.equal(gpu_weights[key] == 0, weight == 0), str(key)


def test_the_moment_matched_variance_and_its_gradients_match_the_cpu():
    """θ^avg and Var_q (the moment-matched likelihood's second moment, eager) of each posterior, and the
    gradients of a weighted sum of both, on the GPU (prepared there) and on the CPU."""
    results = []
    for device in (torch.device("cpu"), CUDA):
        model = _prepared(False, device, device.type == "cuda")
        out = {}
        for name, p in sqs.posteriors(model).items():
            mean, var = p.moments(second=True)
            weights = torch.randn(mean.shape, generator=torch.Generator().manual_seed(2), dtype=mean.dtype)
            loss = (mean * weights.to(device)).sum() + var.sum()
            params = [p.means, p.log_stds, p.mixing_logits, p.gate_logits]
            grads = torch.autograd.grad(loss, params)
            out[name] = [t.detach().cpu() for t in (mean, var, *grads)]
        results.append(out)
    cpu, gpu = results
    assert gpu.keys() == cpu.keys()
    for name, tensors in cpu.items():
        for i, (want, got) in enumerate(zip(tensors, gpu[name], strict=True)):
            torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-12, msg=f"{name}[{i}]")


def test_long_gradient_sums_match_the_cpu():
    """sqs_core._index_add on the GPU: a long float64 job is summed in rows (fewer atomic adds per address) and
    gives index_add_'s sums on the CPU to float64 summation-order error."""
    from sqs_core._index_add import index_add_all, row_count

    g = torch.Generator().manual_seed(3)
    n, entries = (1 << 20) + 17, 128
    index = torch.randint(0, entries, (n,), generator=g)
    source = torch.randn(n, generator=g, dtype=torch.float64)
    want = torch.zeros(entries, dtype=torch.float64).index_add_(0, index, source)
    assert row_count("cuda", entries, n) > 1
    got = torch.zeros(entries, dtype=torch.float64, device=CUDA)
    index_add_all([(got, index.to(CUDA), source.to(CUDA))])
    bound = torch.zeros(entries, dtype=torch.float64).index_add_(0, index, source.abs())
    assert bool(((got.cpu() - want).abs() <= 4 * n * torch.finfo(torch.float64).eps * bound).all())


def _uncovered_posterior_outputs(device, compiled, log_std_shift):
    """θ^avg, Var, k* and the gradients of a random functional of them and the KL, on the CPU, for a K = 64
    posterior (the paper's formula) whose components are shifted by ``log_std_shift`` in log σ, on ``device``."""
    from sqs_core.posterior import SpikeGMMPosterior

    g = torch.Generator().manual_seed(3)
    w = torch.randn(60, 50, generator=g, dtype=torch.float64) * 0.1
    config = sqs.SQSConfig(num_components=64, windows="outlier", temperature=5e-4, compile_kernels=compiled)
    p = SpikeGMMPosterior(w, config, generator=torch.Generator().manual_seed(0)).double()
    with torch.no_grad():
        p.log_stds.add_(log_std_shift)
        p.mixing_logits.add_(torch.randn(p.mixing_logits.shape, generator=g, dtype=torch.float64))
    p = p.to(device)
    mean, var = p.moments(second=True)
    weights = torch.randn(mean.shape, generator=torch.Generator().manual_seed(1), dtype=mean.dtype).to(device)
    out = (mean * weights).sum() + var.sum() + 1e-3 * p.kl()
    grads = torch.autograd.grad(out, [p.means, p.log_stds, p.mixing_logits, p.gate_logits])
    return p._kstar.cpu(), [t.detach().cpu() for t in (mean, var, *grads)]


@pytest.mark.parametrize("route", ["eager", "certified", "dense"])
@pytest.mark.parametrize("log_std_shift", [0.8, -2.5], ids=["every-width", "all-lumped"])
def test_uncovered_weights_of_every_class_match_the_cpu(monkeypatch, route, log_std_shift):
    """Most weights uncovered (K = 64, the paper's formula): in bins of every nearby width (32: the compiled
    path's rolled kernels) or, with narrower components, where every component is lumped (onehot.ALL_LUMPED);
    θ^avg, Var, k* and the gradients on the GPU agree with the CPU's. ``route``: eager; compiled with the
    certified plan (sqs_core._fused) on both devices, or the dense one (sqs_core._dense; a GPU's default)."""
    from sqs_core import _dense

    monkeypatch.setattr(_dense, "dense_route", lambda device: route == "dense")
    compiled = route != "eager"
    want_kstar, want = _uncovered_posterior_outputs(torch.device("cpu"), compiled, log_std_shift)
    got_kstar, got = _uncovered_posterior_outputs(CUDA, compiled, log_std_shift)
    assert torch.equal(got_kstar, want_kstar)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10 * max(float(b.abs().max()), 1.0), msg=f"output {i}")
