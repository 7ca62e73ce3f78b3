"""NumPy scalars as config values, rates and Non-zero rates: accepted as the real numbers they are and stored
as plain Python numbers (JSON round trip); NumPy's bool_ is not a flag. sqs-core does not depend on NumPy, so
these run only where it is installed (the dev environment; skipped in the core-only test environment)."""

from __future__ import annotations

import json

import pytest
import sqs_core as sqs
from hypothesis import given
from hypothesis import strategies as st
from sqs_core.selection import check_nonzero
from torch import nn

np = pytest.importorskip("numpy", reason="NumPy scalars are tested only where NumPy is installed")


def prepared():
    return sqs.prepare_(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))


def test_numpy_bool_is_not_a_flag():
    with pytest.raises(ValueError, match="train_weight must be True or False"):
        sqs.SQSConfig(train_weight=np.bool_(False))


def test_a_numpy_float_is_not_a_component_count():
    with pytest.raises(ValueError, match="num_components"):
        sqs.SQSConfig(num_components=np.float64(4.0))


@pytest.mark.parametrize("value", [np.float32(0.5), np.float64(0.5), np.int64(1)])
def test_nonzero_accepts_numpy_numbers(value):
    out = check_nonzero(value)
    assert type(out) is float and out == float(value)
    sqs.greedy_(prepared(), nonzero=value)


@pytest.mark.parametrize("bad", [np.float32(1.5), np.float32(0.0)])
def test_numpy_nonzero_out_of_range(bad):
    with pytest.raises(ValueError, match="nonzero"):
        check_nonzero(bad)


def test_numpy_learning_rates_are_stored_as_python_floats():
    groups = sqs.param_groups(prepared(), quant_lr=np.float32(1e-3), other_lr=np.int64(1))
    assert all(type(g["lr"]) is float for g in groups)


@given(
    temperature=st.one_of(st.floats(1e-6, 10.0), st.integers(1, 10)),
    seed=st.integers(0, 2**64 - 1),
    components=st.integers(2, 256),
)
def test_numpy_numbers_are_stored_as_plain_python_numbers(temperature, seed, components):
    temperature = np.float32(temperature) if isinstance(temperature, float) else np.int64(temperature)
    config = sqs.SQSConfig(
        temperature=temperature,
        kl_weight=np.float64(0.5),
        seed=np.uint64(seed),
        num_components=np.int16(components),
        prior=sqs.SpikeSlabPrior(keep_prob=np.float32(0.25)),
        overrides={"fc": {"temperature": temperature, "num_components": np.int16(components)}},
    )
    for value in (config.temperature, config.kl_weight, config.seed, config.num_components, config.prior.keep_prob):
        assert type(value) in (int, float)
    assert all(type(v) in (int, float) for v in config.overrides["fc"].values())
    assert sqs.SQSConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_objective_takes_a_numpy_integer_num_data():
    objective = sqs.Objective(prepared(), num_data=np.int64(60000))
    assert objective.num_data == 60000 and type(objective.num_data) is int
