import pytest
import sqs_core as sqs
import torch
from hypothesis import given
from hypothesis import strategies as st
from sqs_core.mixture import gaussian_kl


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


@pytest.mark.parametrize("std", [1e-200, 1e-20, 2e19, 1e300])
def test_slab_std_must_square_to_a_normal_float32(std):
    """σ_0² = 0 (or subnormal, or overflowing) in the float32 KL made every weight's KL inf (found by hand:
    GaussianPrior(slab_std=1e-200) trained into a FloatingPointError at the first step)."""
    for prior in (sqs.SpikeSlabPrior, sqs.GaussianPrior):
        with pytest.raises(ValueError, match="normal float32"):
            prior(slab_std=std)


@pytest.mark.parametrize("std", [1.1e-19, 1.8e19])
def test_slab_std_at_the_edges_gives_a_finite_float32_kl(std):
    for prior in (sqs.SpikeSlabPrior(slab_std=std), sqs.GaussianPrior(slab_std=std)):
        kl = gaussian_kl(torch.tensor([0.0, 0.01]), torch.tensor([-5.0, -1.0]), prior.slab_std)
        assert torch.isfinite(kl).all()


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


def test_overrides_are_read_only_after_validation():
    """The config is frozen all the way down: an override cannot be added or changed past __post_init__'s checks
    (it could: a plain dict let K = 1 or an unknown key in)."""
    config = sqs.SQSConfig(overrides={"fc": {"num_components": 8}})
    with pytest.raises(TypeError):
        config.overrides["conv"] = {"skip": True}  # type: ignore[index]
    with pytest.raises(TypeError):
        config.overrides["fc"]["num_components"] = 1  # type: ignore[index]
    assert config.overrides == {"fc": {"num_components": 8}}
    assert config.for_layer("fc").num_components == 8


def test_the_caller_s_dict_is_not_shared():
    settings = {"num_components": 8}
    config = sqs.SQSConfig(overrides={"fc": settings})
    settings["num_components"] = 1
    assert config.for_layer("fc").num_components == 8


@given(k=st.integers(2, 256), skip=st.booleans(), temperature=st.floats(1e-4, 1.0))
def test_configs_hash_as_they_compare(k, skip, temperature):
    overrides = {"fc": {"skip": skip}, "conv": {"num_components": k, "temperature": temperature}}
    config = sqs.SQSConfig(num_components=k, overrides=overrides)
    same = sqs.SQSConfig(num_components=k, overrides=dict(reversed(list(overrides.items()))))
    assert config == same and hash(config) == hash(same)
    assert len({config, same, sqs.SQSConfig.from_dict(config.to_dict())}) == 1
    assert config != sqs.SQSConfig(num_components=k)
