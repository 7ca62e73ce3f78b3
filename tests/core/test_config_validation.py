"""Argument validation of SQSConfig, the priors, the schedules, param_groups and check_nonzero: every bad value
is a ValueError naming the argument, every accepted value computes finitely in the float32 posterior, and
valid configs serialise exactly as before (artifact headers)."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest
import sqs_core as sqs
import torch
from hypothesis import given
from hypothesis import strategies as st
from sqs_core.selection import check_nonzero
from torch import nn

F32 = torch.finfo(torch.float32)
TAU_PRIME_MAX = F32.max / 5 * (1 - 2.0**-19)  # the largest τ' the default gate init (max |ℓ| = 5) leaves finite


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def prepared(config: sqs.SQSConfig | None = None) -> nn.Sequential:
    return sqs.prepare_(mlp(), config)


def assert_finite_training_step(config: sqs.SQSConfig) -> None:
    """Forward, KL and gradients of one step are finite (what a NaN-producing config breaks first)."""
    model = prepared(config)
    out = model(torch.randn(3, 4, generator=torch.Generator().manual_seed(1)))
    kl = sum(p.kl() for p in sqs.posteriors(model).values())
    (out.sum() + kl).backward()
    assert torch.isfinite(out).all() and math.isfinite(float(kl.detach()))
    for param in model.parameters():
        assert param.grad is None or torch.isfinite(param.grad).all()


# -- 1. GateTemperatureSchedule: τ' at step t is a function of t alone ------------------------------------------


def test_gate_temperature_after_resume_matches_an_uninterrupted_run():
    total = 10
    straight = prepared()
    schedule = sqs.GateTemperatureSchedule(straight, total_steps=total)
    for t in range(total):
        schedule.step(t)
    interrupted = prepared()
    first = sqs.GateTemperatureSchedule(interrupted, total_steps=total)
    for t in range(total // 2 + 1):  # past the halving
        first.step(t)
    resumed = prepared()
    resumed.load_state_dict(interrupted.state_dict())  # the checkpoint holds τ'_0/2
    second = sqs.GateTemperatureSchedule(resumed, total_steps=total)
    for t in range(total // 2 + 1, total):
        second.step(t)
    expected = sqs.SQSConfig().gate_temperature / 2
    for name, p in sqs.posteriors(resumed).items():
        assert float(p.gate_temperature) == float(sqs.posteriors(straight)[name].gate_temperature)
        assert math.isclose(float(p.gate_temperature), expected, rel_tol=1e-6)


@given(
    resume=st.integers(0, 12),
    steps=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    factor=st.floats(0.01, 1.0),
)
def test_a_new_schedule_sets_the_same_gate_temperature_as_the_first(resume, steps, factor):
    model = prepared()
    tau0 = sqs.SQSConfig().gate_temperature
    first = sqs.GateTemperatureSchedule(model, total_steps=12, factor=factor)
    first.step(resume)
    second = sqs.GateTemperatureSchedule(model, total_steps=12, factor=factor)  # built on the scaled buffer
    for t in steps:
        second.step(t)
        expected = torch.tensor(tau0 * (factor if t >= 6 else 1.0), dtype=torch.float32)
        for p in sqs.posteriors(model).values():
            assert float(p.gate_temperature) == float(expected)


# -- 2. flags are bools, not truthy values ----------------------------------------------------------------------

NOT_BOOLS = ["no", "False", 0, 1, None]  # and NumPy's bool_: test_config_validation_numpy.py


@pytest.mark.parametrize("bad", NOT_BOOLS)
def test_config_flags_must_be_bools(bad):
    with pytest.raises(ValueError, match="train_weight must be True or False"):
        sqs.SQSConfig(train_weight=bad)
    with pytest.raises(ValueError, match="compile_kernels must be True, False or 'auto'"):
        sqs.SQSConfig(compile_kernels=bad)
    with pytest.raises(ValueError, match=r"\['skip'\] must be True or False"):
        sqs.SQSConfig(overrides={"^0$": {"skip": bad}})


@pytest.mark.parametrize("bad", NOT_BOOLS)
def test_pruning_schedule_per_layer_must_be_a_bool(bad):
    with pytest.raises(ValueError, match="per_layer must be True or False"):
        sqs.PruningSchedule(prepared(), target_nonzero=0.5, total_steps=4, per_layer=bad)


def test_skip_false_keeps_the_layer():
    model = prepared(sqs.SQSConfig(overrides={"^0$": {"skip": False}}))
    assert sorted(sqs.sqs_layers(model)) == ["0", "2"]


# -- 3. clear errors instead of TypeErrors and silent acceptance ------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"seed": 1.5}, "seed must be an int"),
        ({"seed": "0"}, "seed must be an int"),
        ({"seed": -1}, "seed must be an int >= 0"),
        ({"seed": 2**64}, "seed must be an int in"),
        ({"gate_init_spread": "2"}, "gate_init_spread must be a real number"),
        ({"gate_init_spread": None}, "gate_init_spread must be a real number"),
        ({"gate_init_spread": -1.0}, "gate_init_spread"),
        ({"include": 5}, "include must be a regular expression"),
        ({"include": [None]}, "include patterns must be str"),
        ({"exclude": b"fc"}, "exclude must be a regular expression"),
        ({"exclude": [3]}, "exclude patterns must be str"),
        ({"overrides": {"0": {"temperature": "1"}}}, "temperature must be a real number"),
        ({"num_components": Fraction(4)}, "num_components"),
    ],
)
def test_bad_config_values_raise_value_errors(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        sqs.SQSConfig(**kwargs)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"prior": None}, "prior must be a mapping"),
        ({"prior": {"foo": 1}}, r"unknown spike_slab prior fields: \['foo'\]"),
        ({"prior": {"kind": "gaussian", "keep_prob": 0.5}}, r"unknown gaussian prior fields: \['keep_prob'\]"),
        ({"prior": {"kind": ["gaussian"]}}, "unknown prior kind"),
        ({"include": None}, "include must be a regular expression"),
        ({"bits": 3}, r"unknown SQSConfig fields: \['bits'\]"),
        ([], "needs a mapping"),
    ],
)
def test_from_dict_names_what_it_cannot_read(data, fragment):
    with pytest.raises(ValueError, match=fragment):
        sqs.SQSConfig.from_dict(data)


@pytest.mark.parametrize("name", ["quant_lr", "gate_lr", "weight_lr", "other_lr"])
@pytest.mark.parametrize("bad", ["1e-3", float("inf"), float("nan"), 0.0, -1e-3, True, torch.tensor(1e-3)])
def test_learning_rates_must_be_finite_positive_numbers(name, bad):
    model = prepared(sqs.SQSConfig(train_weight=True))
    kwargs = {"weight_lr": 1e-4, name: bad}
    with pytest.raises(ValueError, match=name):
        sqs.param_groups(model, **kwargs)


@pytest.mark.parametrize("bad", ["0", float("nan"), -0.1, True])
def test_other_weight_decay_must_be_a_number_at_least_zero(bad):
    with pytest.raises(ValueError, match="other_weight_decay"):
        sqs.param_groups(prepared(), other_lr=1e-3, other_weight_decay=bad)


def test_learning_rates_are_stored_as_python_floats():
    groups = sqs.param_groups(prepared(), quant_lr=Fraction(1, 1000), other_lr=1)
    assert all(type(g["lr"]) is float for g in groups)


@pytest.mark.parametrize("bad", ["0.5", True, 0.0, 1.5, float("nan"), None])
def test_gate_schedule_factor(bad):
    with pytest.raises(ValueError, match="factor"):
        sqs.GateTemperatureSchedule(prepared(), total_steps=4, factor=bad)


def test_gate_schedule_factor_may_not_push_tau_prime_below_float32():
    model = prepared(sqs.SQSConfig(gate_temperature=1e-37))
    with pytest.raises(ValueError, match="factor"):
        sqs.GateTemperatureSchedule(model, total_steps=4, factor=1e-3)


@pytest.mark.parametrize("bad", ["3", float("nan"), 1.5, -1, True, None])
def test_schedule_steps_must_be_ints(bad):
    model = prepared()
    pruning = sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=4)
    gate = sqs.GateTemperatureSchedule(model, total_steps=4)
    for call in (pruning.step, pruning.nonzero_at, gate.step):
        with pytest.raises(ValueError, match="step must be an int"):
            call(bad)


@pytest.mark.parametrize("name", ["start_fraction", "end_fraction"])
@pytest.mark.parametrize("bad", [True, "0.5", float("nan"), -0.1, 1.1])
def test_pruning_schedule_fractions_are_named(name, bad):
    with pytest.raises(ValueError, match=name):
        sqs.PruningSchedule(prepared(), target_nonzero=0.5, total_steps=4, **{name: bad})


@pytest.mark.parametrize("value", [Fraction(1, 2), 0.5, 1])
def test_nonzero_accepts_real_numbers(value):
    out = check_nonzero(value)
    assert type(out) is float and out == float(value)
    sqs.greedy_(prepared(), nonzero=value)


def test_nonzero_tensor_gets_a_clear_message():
    with pytest.raises(ValueError, match="Python number"):
        sqs.greedy_(prepared(), nonzero=torch.tensor(0.5))
    with pytest.raises(ValueError, match="target_nonzero"):
        sqs.PruningSchedule(prepared(), target_nonzero=torch.tensor(0.5), total_steps=4)


@pytest.mark.parametrize("bad", [Fraction(3, 2), Fraction(0), "0.5", True])
def test_nonzero_out_of_range_or_not_a_number(bad):
    with pytest.raises(ValueError, match="nonzero"):
        check_nonzero(bad)


# -- 4. values that would make the float32 posterior NaN --------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"temperature": 1e-40}, "temperature must be a normal float32"),
        ({"temperature": 1e39}, "temperature must be a normal float32"),
        ({"gate_temperature": 1e-46}, "gate_temperature must be a normal float32"),
        ({"gate_temperature": 1e-40}, "gate_temperature must be a normal float32"),
        ({"gate_temperature": 1e39}, "gate_temperature must be a normal float32"),
        ({"gate_temperature": 1e38}, "gate_temperature=1e\\+38 with gate_init_spread"),
        ({"gate_init_spread": 1e300}, "gate_init_spread=1e\\+300 overflows float32"),
        ({"gate_init_spread": 1e39}, "gate_init_spread=1e\\+39 overflows float32"),
        ({"overrides": {"0": {"temperature": 1e-40}}}, "temperature must be a normal float32"),
    ],
)
def test_values_that_overflow_float32_are_refused(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        sqs.SQSConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"temperature": F32.tiny},
        {"temperature": F32.tiny, "responsibility": "standard"},
        {"temperature": F32.max},
        {"gate_temperature": F32.tiny},
        {"gate_temperature": TAU_PRIME_MAX},
        {"gate_init_spread": F32.max * 0.999},
        {"gate_init": "constant", "gate_init_spread": 1e300},  # the spread is unused
    ],
)
def test_the_edges_of_the_accepted_range_compute_finitely(kwargs):
    assert_finite_training_step(sqs.SQSConfig(**kwargs))


@given(
    temperature=st.floats(1e-6, 10.0),
    gate_temperature=st.floats(1e-4, 10.0),
    responsibility=st.sampled_from(["paper", "standard"]),
)
def test_ordinary_temperatures_are_accepted(temperature, gate_temperature, responsibility):
    sqs.SQSConfig(temperature=temperature, gate_temperature=gate_temperature, responsibility=responsibility)


@given(
    temperature=st.floats(1e-45, 1e300),
    gate_temperature=st.floats(1e-45, 1e300),
    spread=st.floats(0.0, 1e300),
)
def test_every_accepted_config_computes_finitely(temperature, gate_temperature, spread):
    try:
        config = sqs.SQSConfig(temperature=temperature, gate_temperature=gate_temperature, gate_init_spread=spread)
    except ValueError:
        return
    assert_finite_training_step(config)


# -- 5. bools are not numbers -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: sqs.SQSConfig(temperature=True),
        lambda: sqs.SQSConfig(gate_temperature=True),
        lambda: sqs.SQSConfig(kmeans_iterations=True),
        lambda: sqs.SQSConfig(kl_weight=True),
        lambda: sqs.SQSConfig(initial_keep_prob=True),
        lambda: sqs.SQSConfig(num_components=True),
        lambda: sqs.SQSConfig(version=True),
        lambda: sqs.SQSConfig(version=1.0),
        lambda: sqs.SpikeSlabPrior(slab_std=True),
        lambda: sqs.SpikeSlabPrior(keep_prob=True),
        lambda: sqs.GaussianPrior(slab_std=True),
        lambda: sqs.GateTemperatureSchedule(prepared(), total_steps=4, factor=True),
        lambda: sqs.PruningSchedule(prepared(), target_nonzero=0.5, total_steps=True),
    ],
)
def test_bools_are_not_numbers(make):
    with pytest.raises(ValueError, match=r"True|1\.0"):
        make()


# -- serialisation: plain numbers, and to_dict unchanged for valid configs --------------------------------------

DEFAULT_DICT = (
    '{"num_components": 4, "windows": "outlier", "temperature": 0.0005, "gate_temperature": 0.0125, '
    '"responsibility": "paper", "include": [], "exclude": [], "overrides": {}, "train_weight": false, '
    '"likelihood": "plugin", "kl_weight": 0.001, "gate_init": "magnitude", "initial_keep_prob": 0.9933071490757153, '
    '"gate_init_spread": 2.0, "kmeans_iterations": 30, "seed": 0, "version": 1, '
    '"prior": {"kind": "spike_slab", "keep_prob": 0.5, "slab_std": 1.0}}'
)


def test_default_to_dict_is_unchanged():
    assert json.dumps(sqs.SQSConfig().to_dict()) == DEFAULT_DICT


def test_integers_stay_integers_in_to_dict():
    config = sqs.SQSConfig(
        temperature=1,
        kl_weight=0,
        prior=sqs.GaussianPrior(slab_std=2),
        include="fc",
        overrides={"fc": {"temperature": 1, "skip": False}},
    )
    out = config.to_dict()
    assert out["temperature"] == 1 and type(out["temperature"]) is int
    assert type(out["kl_weight"]) is int and type(out["prior"]["slab_std"]) is int
    assert out["overrides"] == {"fc": {"temperature": 1, "skip": False}}
    assert type(out["overrides"]["fc"]["temperature"]) is int
    assert out["include"] == ["fc"]


@given(
    temperature=st.one_of(st.floats(1e-6, 10.0), st.integers(1, 10)),
    as_fraction=st.booleans(),
    seed=st.integers(0, 2**64 - 1),
    components=st.integers(2, 256),
)
def test_numbers_are_stored_as_plain_python_numbers(temperature, as_fraction, seed, components):
    """Any real number (here fractions.Fraction; NumPy scalars in test_config_validation_numpy.py) is stored
    as a plain float or int, so the config serialises to JSON and back."""
    if as_fraction:
        temperature = Fraction(temperature)
    config = sqs.SQSConfig(
        temperature=temperature,
        kl_weight=Fraction(1, 2) if as_fraction else 0.5,
        seed=seed,
        num_components=components,
        prior=sqs.SpikeSlabPrior(keep_prob=Fraction(1, 4) if as_fraction else 0.25),
        overrides={"fc": {"temperature": temperature, "num_components": components}},
    )
    for value in (config.temperature, config.kl_weight, config.seed, config.num_components, config.prior.keep_prob):
        assert type(value) in (int, float)
    assert all(type(v) in (int, float) for v in config.overrides["fc"].values())
    text = json.dumps(config.to_dict())
    assert sqs.SQSConfig.from_dict(json.loads(text)) == config
