"""Bad input gets a clear error and changes nothing."""

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
import torch.nn.utils.prune
from sqs_core import layers
from torch import nn
from torch.nn.utils import parametrizations
from torch.nn.utils import weight_norm as old_weight_norm


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, repr(model)


def _unchanged(model, snap):
    state, text = snap
    assert repr(model) == text
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


def test_nan_weight_is_refused_and_model_is_untouched():
    model = mlp()
    with torch.no_grad():
        model[2].weight[0, 0] = float("nan")
    snap = _snapshot(model)
    with pytest.raises(ValueError, match=r"'2'.*NaN"):
        sqs.prepare_(model)
    _, text = snap
    assert repr(model) == text and not sqs.is_prepared(model)


def test_inf_weight_is_refused():
    model = mlp()
    with torch.no_grad():
        model[0].weight[1, 1] = float("inf")
    with pytest.raises(ValueError, match="NaN or infinite"):
        sqs.prepare_(model)


@pytest.mark.parametrize(
    ("make_layer", "fragment"),
    [
        (lambda: parametrizations.weight_norm(nn.Linear(4, 4)), "parametrized weight.*plain_weights_"),
        (lambda: parametrizations.spectral_norm(nn.Linear(4, 4)), "parametrized weight"),
        (lambda: nn.LazyLinear(4), "lazy module.*not initialised"),
        (lambda: old_weight_norm(nn.Linear(4, 4)), "computes its weight.*plain_weights_"),
        (lambda: _pruned(nn.Linear(4, 4)), "computes its weight.*prune.*plain_weights_"),
        (lambda: _patched(nn.Linear(4, 4)), "forward set on the instance"),
        (lambda: _hooked(nn.Linear(4, 4), "register_forward_hook"), "hooks \\(_forward_hooks\\)"),
        (lambda: _hooked(nn.Linear(4, 4), "register_forward_pre_hook"), "hooks \\(_forward_pre_hooks\\)"),
        (lambda: _hooked(nn.Linear(4, 4), "register_full_backward_hook"), "_backward_hooks"),
    ],
    ids=[
        "weight_norm",
        "spectral_norm",
        "lazy",
        "old_weight_norm",
        "pruned",
        "patched",
        "hook",
        "pre_hook",
        "backward_hook",
    ],
)
@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")
def test_weights_sqs_cannot_take_over_are_refused_and_model_is_untouched(make_layer, fragment):
    model = nn.Sequential(nn.Linear(4, 4), make_layer(), nn.Linear(4, 2))
    text = repr(model)
    with pytest.raises(ValueError, match=rf"'1'.*{fragment}"):
        sqs.prepare_(model)
    assert repr(model) == text and not sqs.is_prepared(model)


def _pruned(layer):
    torch.nn.utils.prune.l1_unstructured(layer, "weight", amount=0.5)
    return layer


def _patched(layer):  # as accelerate's hooks patch a module: a forward on the instance
    plain = layer.forward
    layer.forward = lambda x: plain(x) * 2.0
    return layer


def _hooked(layer, register):
    getattr(layer, register)(lambda module, *args: None)
    return layer


def test_a_registered_subclass_with_its_own_forward_is_compressed_with_its_adapter():
    class Doubled(nn.Linear):
        def forward(self, x):
            return 2.0 * super().forward(x)

    adapter = sqs.LayerAdapter(
        forward=lambda base, x, w: 2.0 * F.linear(x, w, base.bias),
        forward_no_bias=lambda base, x, w: 2.0 * F.linear(x, w),
    )
    sqs.register_layer_type(Doubled, adapter)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(Doubled(4, 4), nn.ReLU(), nn.Linear(4, 2))
        sqs.prepare_(model)
        assert sorted(sqs.sqs_layers(model)) == ["0", "2"]
    finally:
        layers._REGISTRY.pop(Doubled)


def test_meta_weights_are_refused():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"'0'.*meta device"):
        sqs.prepare_(model)


def test_prepare_twice():
    model = mlp()
    sqs.prepare_(model)
    with pytest.raises(ValueError, match="twice"):
        sqs.prepare_(model)


def test_no_eligible_layer():
    with pytest.raises(ValueError, match="no layer SQS can compress"):
        sqs.prepare_(nn.Sequential(nn.ReLU(), nn.BatchNorm1d(3)))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"include": ("^encoder",)}, "include pattern"),
        ({"exclude": ("decoder",)}, "exclude pattern"),
        ({"overrides": {"attn": {"num_components": 8}}}, "override pattern"),
        ({"exclude": (".",)}, "leave no layer"),
    ],
)
def test_patterns_that_name_no_layer(kwargs, fragment):
    model = mlp()
    snap = _snapshot(model)
    with pytest.raises(ValueError, match=fragment):
        sqs.prepare_(model, sqs.SQSConfig(**kwargs))
    _unchanged(model, snap)


def test_objective_needs_a_prepared_model_and_positive_num_data():
    with pytest.raises(ValueError, match="not prepared"):
        sqs.Objective(mlp(), num_data=10)
    model = sqs.prepare_(mlp())
    for bad in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match="num_data"):
            sqs.Objective(model, num_data=bad)


def test_objective_refuses_nan_loss():
    model = sqs.prepare_(mlp())
    with pytest.raises(FloatingPointError, match="nan"):
        sqs.Objective(model, num_data=3)(torch.tensor(float("nan")))


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan")])
def test_nonzero_outside_unit_interval(bad):
    model = sqs.prepare_(mlp())
    with pytest.raises(ValueError, match="nonzero"):
        sqs.greedy_(model, nonzero=bad)
    with pytest.raises(ValueError, match="nonzero"):
        sqs.BayesianAverage(model, nonzero=bad)
    with pytest.raises(ValueError, match="nonzero"):
        sqs.PruningSchedule(model, target_nonzero=bad, total_steps=10)


def test_schedule_and_average_arguments():
    model = sqs.prepare_(mlp())
    with pytest.raises(ValueError, match="total_steps"):
        sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=0)
    with pytest.raises(ValueError, match="samples"):
        sqs.BayesianAverage(model, samples=0)
    with pytest.raises(ValueError, match="gate_lr"):
        sqs.param_groups(model, gate_lr=0)


def test_discrete_posteriors_alternatives_flag():
    model = sqs.prepare_(mlp())
    with pytest.raises(ValueError, match="alternatives must be True or False"):
        sqs.discrete_posteriors(model, alternatives="no")
    full = sqs.discrete_posteriors(model, nonzero=0.5)
    greedy_only = sqs.discrete_posteriors(model, nonzero=0.5, alternatives=False)
    for name, d in greedy_only.items():
        assert d.alt_index.numel() == 0 and torch.equal(d.weights(), full[name].weights())
