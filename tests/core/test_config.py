import pytest
import sqs_core as sqs
from hypothesis import given
from hypothesis import strategies as st


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"num_components": 1}, "num_components"),
        ({"num_components": 257}, "num_components"),
        ({"num_components": 2.0}, "num_components"),
        ({"temperature": 0}, "temperature"),
        ({"temperature": -1e-3}, "temperature"),
        ({"gate_temperature": 0.0}, "gate_temperature"),
        ({"gate_temperature": float("nan")}, "gate_temperature"),
        ({"windows": "quantile"}, "windows"),
        ({"responsibility": "softmax"}, "responsibility"),
        ({"likelihood": "exact"}, "likelihood"),
        ({"gate_init": "random"}, "gate_init"),
        ({"kl_weight": -1.0}, "kl_weight"),
        ({"include": ("(",)}, "include"),
        ({"overrides": {"conv": {"bits": 3}}}, "bits"),
        ({"overrides": {"conv": {"num_components": 1}}}, "num_components"),
        ({"initial_keep_prob": 1.0}, "initial_keep_prob"),
    ],
)
def test_bad_config_values_are_named(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        sqs.SQSConfig(**kwargs)


@pytest.mark.parametrize("keep", [0.0, 1.0, -0.5, 1.5])
def test_keep_prob_outside_open_unit_interval(keep):
    with pytest.raises(ValueError, match="keep_prob"):
        sqs.SpikeSlabPrior(keep_prob=keep)


@pytest.mark.parametrize("std", [0.0, -1.0, float("inf")])
def test_slab_std_must_be_positive(std):
    with pytest.raises(ValueError, match="slab_std"):
        sqs.SpikeSlabPrior(slab_std=std)
    with pytest.raises(ValueError, match="slab_std"):
        sqs.GaussianPrior(slab_std=std)


@given(
    k=st.integers(2, 256),
    windows=st.sampled_from(["none", "equal", "outlier"]),
    gaussian=st.booleans(),
    beta=st.floats(0, 10),
)
def test_dict_round_trip(k, windows, gaussian, beta):
    prior = sqs.GaussianPrior(slab_std=0.3) if gaussian else sqs.SpikeSlabPrior(keep_prob=0.2, slab_std=0.3)
    config = sqs.SQSConfig(
        num_components=k, windows=windows, prior=prior, kl_weight=beta, overrides={"fc": {"skip": True}}
    )
    assert sqs.SQSConfig.from_dict(config.to_dict()) == config


def test_for_layer_applies_overrides_in_order():
    config = sqs.SQSConfig(overrides={"conv": {"num_components": 16}, "conv1$": {"skip": True}})
    assert config.for_layer("layer.conv2").num_components == 16
    assert config.for_layer("conv1") is None
    assert config.for_layer("fc") is config


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown SQSConfig fields"):
        sqs.SQSConfig.from_dict({"num_components": 4, "bitz": 2})
