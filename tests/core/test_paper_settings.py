"""The paper's settings as literals, not read back from sqs-core's constants: the schedules' defaults (Algorithm 1),
the appendix's learning rates, Objective's β and a layer's compression rate (session 66's mutation search)."""

import math

import sqs_core as sqs
import torch
from torch import nn


def _model():
    torch.manual_seed(0)
    return sqs.prepare_(nn.Sequential(nn.Linear(10, 20)), sqs.SQSConfig(num_components=2))


def test_cubic_ramp_ends_at_three_quarters_by_default():
    """The paper's schedules as defaults: the cubic ramp ends at 75% of the steps, τ' is halved from step T/2 on
    (steps 0..T/2−1 are the first half), and a ramp with start = end prunes to the target at once."""
    sched = sqs.PruningSchedule(_model(), target_nonzero=0.25, total_steps=100)
    assert sched.nonzero_at(75) == 0.25
    assert sched.nonzero_at(74) > 0.25
    assert math.isclose(sched.nonzero_at(50), 0.25 + 0.75 * (1 - 50 / 75) ** 3, rel_tol=1e-12)


def test_one_shot_ramp_prunes_at_its_start():
    sched = sqs.PruningSchedule(_model(), target_nonzero=0.25, total_steps=100, start_fraction=0.2, end_fraction=0.2)
    assert sched.nonzero_at(19) == 1.0
    assert sched.nonzero_at(20) == 0.25


def test_gate_temperature_halves_exactly_at_half_the_steps():
    model = _model()
    p = next(iter(sqs.posteriors(model).values()))
    tau0 = float(p.gate_temperature)
    sched = sqs.GateTemperatureSchedule(model, total_steps=10)
    assert sched.step(4) == 1.0 and float(p.gate_temperature) == tau0
    assert sched.step(5) == 0.5 and float(p.gate_temperature) == tau0 * 0.5


def test_default_learning_rates_are_the_appendix_values():
    """param_groups' default learning rates are the appendix's: quantization 5e-5, gates 0.012."""
    torch.manual_seed(0)
    model = sqs.prepare_(nn.Sequential(nn.Linear(6, 5)), sqs.SQSConfig(num_components=2))
    lrs = {g["name"]: g["lr"] for g in sqs.param_groups(model)}
    assert lrs == {"quantization": 5e-5, "gates": 0.012}


def test_objective_kl_weight_argument_overrides_the_config():
    """Objective(kl_weight=β) uses that β, not the config's: loss = NLL + β KL / num_data."""
    torch.manual_seed(0)
    model = sqs.prepare_(nn.Sequential(nn.Linear(6, 5)), sqs.SQSConfig(num_components=2, kl_weight=1.0))
    nll = torch.tensor(0.25)
    for beta in (0.0, 1e-3, 3.0):
        objective = sqs.Objective(model, num_data=40, kl_weight=beta)
        loss = objective(nll)
        kl = objective.last["kl"]
        assert kl > 0
        assert math.isclose(float(loss.detach()), 0.25 + beta * kl / 40, rel_tol=1e-6, abs_tol=1e-9)


def test_per_layer_paper_rate_counts_every_stored_window():
    """A layer's paper rate (eq. compression-rate for that layer): 32 T / (log2 K · nnz + 32 · W · K), with W the
    windows that hold a kept weight (each stores its own K levels): outlier windows make W = 4 here."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 30))
    with torch.no_grad():
        model[0].weight.view(-1)[:4] = torch.tensor([3.0, -3.0, 2.5, -2.5])  # both tails hold weights
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, windows="outlier"))
    report = sqs.compression_report(model, nonzero=1.0)
    (layer,) = report.layers
    assert layer.windows == 4
    t, k = 1200, 4
    assert math.isclose(layer.paper_rate, 32 * t / (math.log2(k) * layer.nnz + 32 * 4 * k), rel_tol=1e-12)
