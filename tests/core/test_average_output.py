"""BayesianAverage over models whose output is not a tensor (a transformers ``ModelOutput``, a dict, a tuple):
``output=`` picks the tensor to average; without it such an output is refused with a message naming its type
and the argument, and the wrapped model's layers are left as they were."""

import copy
import io
import logging

import pytest
import sqs_core as sqs
import torch
from torch import nn


class WithExtras(nn.Module):
    """A model that returns a dict, as transformers models return a ModelOutput."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4))

    def forward(self, x):
        logits = self.body(x)
        return {"logits": logits, "argmax": logits.argmax(-1)}


def _prepared(seed: int = 0) -> WithExtras:
    torch.manual_seed(seed)
    model = sqs.prepare_(WithExtras(), sqs.SQSConfig(num_components=4))
    with torch.no_grad():
        for p in sqs.posteriors(model).values():
            p.log_stds.add_(2.0)  # wide components: the draws differ from each other
    object.__setattr__(next(iter(sqs.posteriors(model).values())).config, "temperature", 0.5)
    return model


@pytest.mark.parametrize("average", ["outputs", "probs"])
def test_output_picks_the_tensor_averaged(average, tmp_path):
    model, x = _prepared(), torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
    avg = sqs.BayesianAverage(
        model,
        samples=3,
        nonzero=0.6,
        generator=torch.Generator().manual_seed(2),
        average=average,
        output=lambda out: out["logits"],
    )
    expected = []
    draws = torch.Generator().manual_seed(2)
    for _ in range(3):  # the same draws, one at a time, from a generator in the same state
        one = sqs.BayesianAverage(model, samples=1, nonzero=0.6, generator=draws, output=lambda out: out["logits"])
        logits = one(x)
        expected.append(torch.softmax(logits, -1) if average == "probs" else logits)
    assert len({tuple(t.flatten().tolist()) for t in expected}) == 3  # three different draws
    torch.testing.assert_close(avg(x), torch.stack(expected).mean(0), rtol=1e-6, atol=1e-7)
    path = tmp_path / "model.sqs"
    sqs.save(model, path, nonzero=0.6)
    loaded = sqs.load_bayesian_average(
        path,
        WithExtras(),
        samples=3,
        generator=torch.Generator().manual_seed(2),
        average=average,
        output=lambda out: out["logits"],
    )
    assert torch.equal(loaded(x), avg(x))


def test_a_non_tensor_output_is_refused_and_the_layers_are_put_back():
    model, x = _prepared(), torch.randn(5, 6)
    before = model(x)["logits"]
    avg = sqs.BayesianAverage(model, samples=2, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"the model's output is a builtins\.dict; pass output="):
        avg(x)
    assert torch.equal(model(x)["logits"], before)  # variational again
    picks_int = sqs.BayesianAverage(model, samples=2, output=lambda out: out["argmax"])
    with pytest.raises(ValueError, match=r"output\(model output\) is a torch\.int64 tensor"):
        picks_int(x)


@pytest.mark.parametrize("bad", ["logits", 3])
def test_output_must_be_callable(bad, tmp_path):
    model = _prepared()
    with pytest.raises(ValueError, match="output must be None or a callable"):
        sqs.BayesianAverage(model, output=bad)
    path = tmp_path / "model.sqs"
    sqs.save(model, path, nonzero=0.6)
    skeleton = WithExtras()
    weights = [p.clone() for p in skeleton.parameters()]
    with pytest.raises(ValueError, match="output must be None or a callable"):
        sqs.load_bayesian_average(path, skeleton, output=bad)
    assert all(torch.equal(a, b) for a, b in zip(weights, skeleton.parameters(), strict=True))  # nothing loaded


def test_a_model_in_training_mode_is_warned_about_once(caplog):
    torch.manual_seed(0)
    model = sqs.prepare_(
        nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)), sqs.SQSConfig(num_components=4)
    )
    average = sqs.BayesianAverage(model, samples=2, generator=torch.Generator().manual_seed(0))
    x = torch.randn(5, 6)
    with caplog.at_level(logging.WARNING, logger="sqs_core.inference"):
        model.eval()
        average(x)
        assert "training mode" not in caplog.text
        model.train()
        average(x)
        average(x)
    assert caplog.text.count("training mode") == 1 and "model.eval()" in caplog.text


NOT_SCORES = {
    r"a 0-d torch\.float32 tensor": lambda out: out["logits"].sum(),
    r"a torch\.complex64 tensor": lambda out: torch.view_as_complex(out["logits"].reshape(-1, 2, 2)),
}


@pytest.mark.parametrize("named", NOT_SCORES)
def test_probs_needs_real_scores_along_a_last_dimension(named):
    """average="probs" takes a softmax over the last dimension: of a 0-d output it is 1 whatever the model says,
    of a complex one torch has no kernel. Both are refused, named, and the layers put back."""
    model, x = _prepared(), torch.randn(5, 6)
    before = model(x)["logits"]
    avg = sqs.BayesianAverage(model, samples=2, average="probs", output=NOT_SCORES[named])
    with pytest.raises(ValueError, match=rf'average="probs"\) .*{named}'):
        avg(x)
    assert torch.equal(model(x)["logits"], before)


def test_probs_over_a_class_dimension_that_is_not_last():
    """A segmentation model's (N, C, H, W) scores: output=lambda out: out.movedim(1, -1) averages the softmax over
    C (docs/api-contract.md), the same as each draw's softmax(dim=1) averaged by hand."""
    torch.manual_seed(0)
    model = sqs.prepare_(nn.Sequential(nn.Conv2d(2, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 3, 1)), sqs.SQSConfig())
    model.eval()
    x = torch.randn(2, 2, 5, 4, generator=torch.Generator().manual_seed(1))
    avg = sqs.BayesianAverage(
        model, samples=3, generator=torch.Generator().manual_seed(2), average="probs", output=lambda o: o.movedim(1, -1)
    )
    by_hand = []
    draws = torch.Generator().manual_seed(2)
    for _ in range(3):
        one = sqs.BayesianAverage(model, samples=1, generator=draws)
        by_hand.append(torch.softmax(one(x), dim=1))
    torch.testing.assert_close(avg(x).movedim(-1, 1), torch.stack(by_hand).mean(0), rtol=1e-6, atol=1e-7)


def _averages(tmp_path):
    """(x, in-memory average, the file's average) over one MLP's posterior, outputs already computed once."""
    torch.manual_seed(0)
    model = sqs.prepare_(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), sqs.SQSConfig(temperature=0.5))
    model.eval()
    path = tmp_path / "m.sqs"
    sqs.save(model, path, nonzero=0.5)
    skeleton = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    in_memory = sqs.BayesianAverage(model, samples=3, nonzero=0.5, generator=torch.Generator().manual_seed(0))
    from_file = sqs.load_bayesian_average(path, skeleton, samples=3, generator=torch.Generator().manual_seed(0))
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(1)), in_memory, from_file


@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
def test_a_copied_average_averages_its_own_model(how, tmp_path):
    """A deep copy (and a torch.save / torch.load round trip) of a BayesianAverage set its draws into the original
    model's layers or tensors, and ran its own with the greedy weights: 0.2 off, silently (torch.save failed on a
    local function). The copy computes what the original does, and leaves the original alone."""

    x, *averages = _averages(tmp_path)
    for average in averages:
        want = average(x)
        if how == "deepcopy":
            copied = copy.deepcopy(average)
        else:
            buffer = io.BytesIO()
            torch.save(average, buffer)
            copied = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
        with torch.no_grad():  # the original's weights changed: a copy that reads them would change too
            for p in average.model.parameters():
                p.add_(1.0)
        torch.testing.assert_close(copied(x), want, rtol=0, atol=0)
