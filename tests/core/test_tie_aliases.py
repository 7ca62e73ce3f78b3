"""A prepared model's tied layers declare their shared posterior's second set of state keys as aliases
(``_tied_weights_keys``, the convention Hugging Face's ``save_pretrained`` and so ``Trainer``'s checkpoints read):
with the declared keys dropped, the state dict holds no aliased tensor (what safetensors refuses), and loading it
back with ``strict=False`` restores the whole model, the tie included (tests/integration runs the real
transformers code)."""

import re
from typing import ClassVar

import pytest
import sqs_core as sqs
import torch
from test_tied_forward import TiedLM
from torch import nn
from toy_models import Tied


class TiedBias(nn.Module):
    """As BERT's masked-LM head: the decoder's bias is the head's own ``bias`` parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(5))
        self.body = nn.Linear(12, 12)
        self.decoder = nn.Linear(12, 5)
        self.decoder.bias = self.bias

    def forward(self, x):
        return self.decoder(torch.relu(self.body(x)))


_TIE = {TiedLM: "embed", Tied: "a"}  # a layer of the tie


def _declared(model) -> list[str]:
    """Every module's ``_tied_weights_keys`` patterns, prefixed with the module's name (as transformers does)."""
    found = []
    for name, module in model.named_modules():
        for pattern in getattr(module, "_tied_weights_keys", None) or {}:
            found.append(f"{name}.{pattern}" if name else pattern)
    return found


def _without_aliases(model) -> dict[str, torch.Tensor]:
    patterns = _declared(model)
    return {k: v for k, v in model.state_dict().items() if not any(re.search(p, k) for p in patterns)}


def _trained(factory, seed=0):
    torch.manual_seed(seed)
    model = sqs.prepare_(factory(), sqs.SQSConfig(num_components=4))
    with torch.no_grad():  # move every posterior tensor off its initial value, as training would
        for post in sqs.posteriors(model).values():
            for p in post.parameters():
                p.add_(torch.randn_like(p) * 0.1)
            post.mask[::3] = False
    return model


@pytest.mark.parametrize("factory", [TiedLM, Tied], ids=["embedding-head", "linear-linear"])
def test_tied_layers_declare_their_aliases_and_the_state_without_them_restores_the_tie(factory):
    model = _trained(factory)
    layers = sqs.sqs_layers(model)
    first, second = [name for name, layer in layers.items() if layer.posterior is layers[_TIE[factory]].posterior]
    layers[first].posterior.pin_zero_rows_([3])  # its pinned rows, in the state too (_extra_state), load with it
    aliases = model.get_submodule(second)._tied_weights_keys
    assert aliases == {
        rf"posterior\.{key}$": f"{first}.posterior.{key}" for key in layers[first].posterior.state_dict()
    }
    assert not hasattr(model.get_submodule(first), "_tied_weights_keys")
    state = _without_aliases(model)
    dropped = set(model.state_dict()) - set(state)
    assert dropped == {k for k in model.state_dict() if k.startswith(f"{second}.posterior.")}
    storages = [v.untyped_storage().data_ptr() for v in state.values() if v.numel()]
    assert len(set(storages)) == len(storages)  # what safetensors (no numpy here) would refuse: aliased tensors

    fresh = _trained(factory, seed=1)
    result = fresh.load_state_dict({k: v.clone() for k, v in state.items()}, strict=False)
    # pinned rows and settings absent from a state keep the posterior's own (a checkpoint from before they were
    # saved): not missing
    assert set(result.missing_keys) == {k for k in dropped if not k.endswith(("._extra_state", ".settings"))}
    assert not result.unexpected_keys
    assert fresh.get_submodule(first).posterior is fresh.get_submodule(second).posterior  # still one posterior
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    x = torch.randint(0, 40, (3, 5)) if factory is TiedLM else torch.randn(3, 12)
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)


def test_untied_layers_declare_nothing():
    model = sqs.prepare_(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)), sqs.SQSConfig())
    assert _declared(model) == []


def test_a_wrapped_modules_tied_bias_is_declared_and_restored():
    """prepare_ moves the decoder's bias to ``decoder.base_layer.bias``, still the head's ``bias`` tensor."""
    model = _trained(TiedBias)
    with torch.no_grad():
        model.bias.add_(1.0)
    assert model.decoder._tied_weights_keys == {r"base_layer\.bias$": "bias"}
    state = _without_aliases(model)
    assert set(model.state_dict()) - set(state) == {"decoder.base_layer.bias"}
    fresh = _trained(TiedBias, seed=1)
    result = fresh.load_state_dict({k: v.clone() for k, v in state.items()}, strict=False)
    assert result.missing_keys == ["decoder.base_layer.bias"]
    assert fresh.decoder.bias is fresh.bias and torch.equal(fresh.bias, model.bias)
    x = torch.randn(3, 12)
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)


class TiedRecurrent(nn.Module):
    """Two LSTMs sharing one input weight (compressed: nested SQS layers) and one bias (dense, in the wrapped
    module): each alias declared once, on the later LSTM's innermost layer, the first name kept."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.LSTM(4, 6), nn.LSTM(4, 6)
        self.b.weight_ih_l0 = self.a.weight_ih_l0
        self.b.bias_hh_l0 = self.a.bias_hh_l0
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        return self.head(self.a(x)[0] + self.b(x)[0])


def test_nested_layers_declare_each_alias_once_and_keep_the_first_name():
    model = _trained(TiedRecurrent)
    assert _declared(model) == [
        f"b.base_layer.{pattern}"
        for pattern in [r"base_layer\.bias_hh_l0$"]
        + [rf"posterior\.{key}$" for key in model.a.base_layer.posterior.state_dict()]
    ]
    state = _without_aliases(model)
    assert all(not key.startswith("a.") or key in state for key in model.state_dict())  # the first LSTM's all kept
    fresh = _trained(TiedRecurrent, seed=1)
    fresh.load_state_dict({k: v.clone() for k, v in state.items()}, strict=False)
    x = torch.randn(3, 2, 4)
    torch.testing.assert_close(fresh.eval()(x), model.eval()(x), rtol=0, atol=0)


class DeclaresTies(nn.Module):
    """transformers' protocol for declaring ties (``PreTrainedModel``): ``_tied_weights_keys`` {target: source},
    expanded on demand by ``get_expanded_tied_weights_keys``, gathered at construction in ``all_tied_weights_keys``,
    and ``tie_weights()`` re-tying each pair with setattr. Here a compressed tie (head → embed) and, with
    ``exclude``, a tie between two layers left dense (side → body)."""

    _tied_weights_keys: ClassVar[dict[str, str]] = {"head.weight": "embed.weight", "side.weight": "body.weight"}

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.body = nn.Embedding(40, 16), nn.Linear(16, 16)
        self.head, self.side = nn.Linear(16, 40, bias=False), nn.Linear(16, 16)
        self.tie_weights()
        self.all_tied_weights_keys = self.get_expanded_tied_weights_keys(all_submodels=False)

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict[str, str]:
        names = dict(self.named_parameters(remove_duplicate=False))
        for target, source in self._tied_weights_keys.items():
            if target not in names or source not in names:  # as transformers refuses a pattern matching nothing
                raise ValueError(f"no tensor to tie for {source}:{target}")
        return dict(self._tied_weights_keys)

    def tie_weights(self) -> None:
        for target, source in self.get_expanded_tied_weights_keys().items():
            parent, name = target.rsplit(".", 1)
            setattr(self.get_submodule(parent), name, self.get_parameter(source))

    def forward(self, tokens):
        return self.head(torch.tanh(self.side(self.body(self.embed(tokens)))))


def test_ties_a_posterior_holds_are_retired_from_the_models_declarations():
    """transformers' ``tie_weights()`` failed after prepare_ on the tie's vanished ``embed.weight``; the declaration
    of a tie the posterior holds is retired (tests/integration runs it on six real architectures), one left dense
    is kept and still re-ties."""
    torch.manual_seed(0)
    model = sqs.prepare_(DeclaresTies(), sqs.SQSConfig(num_components=4, exclude=(r"^(body|side)$",)))
    assert model.head.posterior is model.embed.posterior
    kept = {"side.weight": "body.weight"}
    assert model._tied_weights_keys == kept and model.all_tied_weights_keys == kept
    assert DeclaresTies._tied_weights_keys["head.weight"] == "embed.weight"  # the class keeps its own
    model.side.weight = nn.Parameter(model.side.weight.detach().clone())
    state = model.state_dict(keep_vars=True)
    model.tie_weights()
    assert model.side.weight is model.body.weight
    assert all(model.state_dict(keep_vars=True)[key] is value for key, value in state.items() if "side" not in key)


def test_a_submodels_ties_gathered_by_the_outer_model_are_retired_there_too():
    """transformers gathers each submodel's ties into the outer model's ``all_tied_weights_keys`` (EncoderDecoderModel
    holds its decoder's), which ``init_weights`` re-ties from; the outer model declares none of its own."""
    torch.manual_seed(0)
    outer = nn.Module()
    outer.inner = DeclaresTies()
    outer.all_tied_weights_keys = {f"inner.{t}": f"inner.{s}" for t, s in outer.inner.all_tied_weights_keys.items()}
    sqs.prepare_(outer, sqs.SQSConfig(num_components=4, exclude=(r"^inner\.(body|side)$",)))
    assert outer.all_tied_weights_keys == {"inner.side.weight": "inner.body.weight"}
    assert outer.inner.all_tied_weights_keys == {"side.weight": "body.weight"}


def test_a_declaration_that_cannot_be_expanded_is_left_as_it_is():
    torch.manual_seed(0)
    model = DeclaresTies()
    model._tied_weights_keys = {"missing.weight": "embed.weight"}
    sqs.prepare_(model, sqs.SQSConfig(num_components=4))
    assert model._tied_weights_keys == {"missing.weight": "embed.weight"}
