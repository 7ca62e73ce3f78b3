"""Hooks on modules an SQS layer's call does not call (sqs_core._hooks): refused by name at the forward, never
silently skipped; a module whose own forward runs with its weights substituted (an LSTM) runs its hooks."""

import pytest
import sqs_core as sqs
import torch
from torch import nn


def _config():
    return sqs.SQSConfig(num_components=4)


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize(
    "register", ["register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook"]
)
def test_a_hook_on_the_wrapped_linear_is_refused_by_name(register, fixed):
    torch.manual_seed(0)
    model = sqs.prepare_(nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)), _config())
    if fixed:
        sqs.greedy_(model)
    inner = sqs.sqs_layers(model)["2"].base_layer
    getattr(inner, register)(lambda *args: None)
    with pytest.raises(
        ValueError, match=r"registered on a Linear that the SQS layer '2' wraps .*sqs_layers\(model\)\['2'\]"
    ):
        model(torch.randn(3, 4))


def _innermost(layer):
    while hasattr(layer, "base_layer"):
        layer = layer.base_layer
    return layer


@pytest.mark.parametrize("fixed", [False, True])
def test_an_lstms_hooks_run_once_per_call_registered_before_or_after_prepare(fixed):
    torch.manual_seed(0)
    calls = []
    model = nn.Sequential(nn.LSTM(4, 6, batch_first=True))
    model[0].register_forward_hook(lambda module, args, out: calls.append("before"))
    sqs.prepare_(model, _config())
    lstm = _innermost(model[0])
    assert isinstance(lstm, nn.LSTM)
    lstm.register_forward_pre_hook(lambda module, args: calls.append("after"))
    if fixed:
        sqs.greedy_(model)
    out, _ = model(torch.randn(2, 3, 4))
    assert calls == ["after", "before"] and out.shape == (2, 3, 6)


def test_a_hook_on_an_lstms_nested_sqs_layer_is_refused():
    torch.manual_seed(0)
    model = sqs.prepare_(nn.Sequential(nn.LSTM(4, 6)), _config())
    nested = sqs.sqs_layers(model)["0.base_layer"]
    nested.register_forward_hook(lambda *args: None)
    with pytest.raises(ValueError, match=r"registered on a SQSLayer that the SQS layer '0' wraps"):
        model(torch.randn(3, 2, 4))


def test_a_hook_on_the_sqs_layer_itself_runs():
    torch.manual_seed(0)
    model = sqs.prepare_(nn.Sequential(nn.Linear(4, 6)), _config())
    sqs.sqs_layers(model)["0"].register_forward_hook(lambda module, args, out: out * 0)
    assert not model(torch.randn(3, 4)).any()


def test_the_refusal_names_the_tied_layer_called_not_the_first_of_the_tie():
    torch.manual_seed(0)
    model = nn.ModuleDict({"embed": nn.Embedding(10, 4), "head": nn.Linear(4, 10, bias=False)})
    model["head"].weight = model["embed"].weight
    sqs.prepare_(model, _config())
    sqs.sqs_layers(model)["head"].base_layer.register_forward_hook(lambda *args: None)
    with pytest.raises(ValueError, match=r"the SQS layer 'head' wraps"):
        model["head"](torch.randn(2, 4))
