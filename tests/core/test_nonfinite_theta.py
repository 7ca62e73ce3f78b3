"""Weights θ that hold NaN or inf (a diverged step with train_weight=True, a non-finite checkpoint) or that span more
than their dtype's range: a clear error naming the layer, never an out-of-bounds bin (the compiled kernels cast a
NaN bin to int32 and read out of bounds: a segfault)."""

import math

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from sqs_core.onehot import bin_count, bin_index, bin_table
from torch import nn


def _trained_theta_model(compiled: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    config = sqs.SQSConfig(num_components=4, train_weight=True, compile_kernels=compiled)
    return sqs.prepare_(model, config)


# compiled: the check comes before any kernel runs, so no compile is paid here
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_theta_is_named_in_the_forward(compiled, bad):
    model = _trained_theta_model(compiled)
    with torch.no_grad():
        sqs.posteriors(model)["2"].weight[1, 3] = bad
    with pytest.raises(FloatingPointError, match=r"layer '2': the weights θ hold NaN or inf"):
        model(torch.randn(3, 32))


def test_a_checkpoint_with_a_nan_theta_fails_at_the_first_forward_naming_the_layer():
    model = _trained_theta_model(False)
    state = model.state_dict()
    key = next(k for k in state if k.startswith("0.") and k.endswith("posterior.weight"))
    state[key] = state[key].clone()
    state[key][0, 0] = math.nan
    model.load_state_dict(state)
    with pytest.raises(FloatingPointError, match=r"layer '0'.*smallest nan"):
        model(torch.randn(2, 32))


def test_float64_weights_whose_range_overflows_get_bins_in_range():
    """max − min = 3e308 overflows float64: the width was inf, bins per unit 0 and (θ − low)·0 NaN."""
    theta = torch.randn(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    theta[0], theta[1] = 1.5e308, -1.5e308
    means = torch.tensor([[-1.0, 0.0, 1.0]], dtype=torch.float64)
    log_stds = torch.full_like(means, -1.0)
    log_mix = F.log_softmax(torch.zeros_like(means), dim=-1)
    wid = torch.zeros(theta.shape, dtype=torch.uint8)
    table = bin_table(theta, wid, means, log_stds, log_mix, "paper", 1.0)
    assert math.isfinite(table.inv_width) and table.inv_width > 0
    bins = bin_index(theta, table)
    assert int(bins.min()) == 0 and int(bins[1]) == 0 and int(bins[0]) == bin_count(theta.numel()) - 1
    assert bool((bins[theta.argsort()].diff() >= 0).all())  # bins follow θ's order


def test_weights_too_large_for_their_dtype_are_refused_at_prepare():
    model = nn.Sequential(nn.Linear(16, 16)).double()
    with torch.no_grad():
        model[0].weight.mul_(1e307)
        model[0].weight[0, 0], model[0].weight[0, 1] = 1.5e308, -1.5e308
    with pytest.raises(ValueError, match=r"layer '0': its weights \(largest magnitude 1.5e\+308\) overflow"):
        sqs.prepare_(model, sqs.SQSConfig(num_components=4, windows="none"))
    assert type(model[0]) is nn.Linear  # the model is left as it was


@pytest.mark.parametrize("turn", ["greedy", "average"])
def test_inference_names_the_layer_whose_theta_is_not_finite(turn):
    model = _trained_theta_model(False)
    with torch.no_grad():
        sqs.posteriors(model)["0"].weight[2, 2] = math.nan
    with pytest.raises(ValueError, match=r"layer '0' holds NaN or inf in weight"):
        sqs.greedy_(model) if turn == "greedy" else sqs.BayesianAverage(model, samples=2)


def test_the_dense_route_checks_theta_too(monkeypatch):
    """The compiled route of accelerators (sqs_core._dense) builds no bins: θ is checked before any route."""
    from sqs_core import _dense

    monkeypatch.setattr(_dense, "dense_route", lambda device: True)
    model = _trained_theta_model(True)
    with torch.no_grad():
        sqs.posteriors(model)["0"].weight[0, 1] = math.inf
    with pytest.raises(FloatingPointError, match=r"layer '0': the weights θ hold NaN or inf"):
        model(torch.randn(3, 32))


def test_a_posterior_pickled_before_layer_names_runs(tmp_path):
    """Models pickled before session 65 hold no layer_name: the class default stands in."""
    model = _trained_theta_model(False)
    for module in model.modules():
        module.__dict__.pop("layer_name", None)
        module.__dict__.pop("sqs_name", None)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert loaded(torch.randn(2, 32)).shape == (2, 4)
    with torch.no_grad():
        sqs.posteriors(loaded)["0"].weight[0, 0] = math.nan
    with pytest.raises(FloatingPointError, match=r"layer '\(unnamed\)'"):
        loaded(torch.randn(2, 32))
