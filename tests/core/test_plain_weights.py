"""``plain_weights_`` folds what computes a compressible weight (weight norm old and new, spectral norm, pruning
masks) into a plain parameter holding the value it computes: the model computes what it did, ``prepare_`` takes
it, and an artifact loads into a skeleton folded the same way."""

from __future__ import annotations

import pytest
import sqs_core as sqs
import torch
from torch import nn
from torch.nn.utils import parametrizations, prune


def _pruned(layer: nn.Module) -> nn.Module:
    prune.l1_unstructured(layer, "weight", amount=0.5)
    return layer


NORMS = {
    "weight_norm": parametrizations.weight_norm,
    "spectral_norm": parametrizations.spectral_norm,
    "old_weight_norm": torch.nn.utils.weight_norm,
    "old_spectral_norm": torch.nn.utils.spectral_norm,
    "pruned": _pruned,
}


def _model(norm: str, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(NORMS[norm](nn.Conv1d(3, 4, 3)), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2))


@pytest.mark.parametrize("norm", sorted(NORMS))
@pytest.mark.filterwarnings("ignore::FutureWarning")  # the old-style helpers are deprecated
def test_folded_model_computes_the_same_and_round_trips(norm, tmp_path):
    model = _model(norm).eval()
    x = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(x)
    with pytest.raises(ValueError, match="plain_weights_"):
        sqs.prepare_(model)
    assert sqs.plain_weights_(model) == ["0.weight"]
    assert sqs.plain_weights_(model) == []  # nothing left to fold
    assert isinstance(model[0]._parameters["weight"], nn.Parameter)
    with torch.no_grad():
        assert torch.allclose(model(x), before, atol=1e-6)
    sqs.prepare_(model, sqs.SQSConfig(num_components=4))
    sqs.greedy_(model, nonzero=0.5)
    sqs.save(model, tmp_path / "m.sqs", nonzero=0.5)
    skeleton = _model(norm, seed=1).eval()
    with pytest.raises(ValueError, match="does not match the skeleton"):
        sqs.load(tmp_path / "m.sqs", skeleton)
    sqs.plain_weights_(skeleton)
    with torch.no_grad():
        assert torch.equal(sqs.load(tmp_path / "m.sqs", skeleton)(x), model(x))


def test_only_compressible_weights_are_folded_and_a_prepared_model_is_refused():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), parametrizations.weight_norm(nn.Linear(4, 4)))
    parametrize_bias = nn.utils.parametrize.register_parametrization
    parametrize_bias(model[0], "bias", nn.Identity())  # not a weight SQS compresses: left as it is
    assert sqs.plain_weights_(model) == ["1.weight"]
    assert nn.utils.parametrize.is_parametrized(model[0], "bias")
    with pytest.raises(ValueError, match=r"needs a torch\.nn\.Module"):
        sqs.plain_weights_("model")
    prepared = sqs.prepare_(nn.Sequential(nn.Linear(4, 4)))
    with pytest.raises(ValueError, match="before prepare_"):
        sqs.plain_weights_(prepared)
