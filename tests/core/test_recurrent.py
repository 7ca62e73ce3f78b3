"""nn.RNN / nn.LSTM / nn.GRU are compressed: every weight matrix (``weight_ih_l0``, ``weight_hh_l0``, an LSTM's
``weight_hr_l0``, the ``_reverse`` ones) gets a posterior and an SQS layer of its own, one around the other, and the
module's own forward runs with all of them substituted (``sqs_core.layers.substituted_forward``); the biases stay
dense. A prepared one computes what the module computes at θ^avg, trains, and comes back from an artifact."""

from __future__ import annotations

import copy
import io

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from torch import nn

CASES = {
    "lstm": lambda: nn.LSTM(6, 8, num_layers=2, batch_first=True, bidirectional=True),
    "lstm-proj": lambda: nn.LSTM(6, 8, batch_first=True, proj_size=4),
    "gru": lambda: nn.GRU(6, 8, num_layers=2, batch_first=True),
    "rnn": lambda: nn.RNN(6, 8, batch_first=True, nonlinearity="relu"),
}


class Tagger(nn.Module):
    """A recurrent layer and a Linear head over its outputs."""

    def __init__(self, recurrent: nn.Module) -> None:
        super().__init__()
        self.rnn = recurrent
        out = getattr(recurrent, "proj_size", 0) or recurrent.hidden_size
        self.head = nn.Linear(out * (2 if recurrent.bidirectional else 1), 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # contiguous: torch's matmul folds a strided 3-D input (a bidirectional batch_first output) differently for
        # a weight that requires grad (a plain Linear's Parameter) than for a fixed tensor, 1e-8 apart
        return self.head(self.rnn(x)[0].contiguous())


def _model(case: str) -> Tagger:
    torch.manual_seed(0)
    return Tagger(CASES[case]())


def _sequences(seed: int = 1) -> torch.Tensor:
    return torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(seed))


def _weights(module: nn.Module) -> list[str]:
    return [n for n, _ in module.named_parameters() if n.startswith("weight_")]


@pytest.mark.parametrize("case", sorted(CASES))
def test_prepared_recurrent_layer_is_the_module_at_theta_avg(case):
    plain = _model(case)
    names = _weights(plain.rnn)
    model = sqs.prepare_(copy.deepcopy(plain), sqs.SQSConfig(num_components=4))
    assert len(sqs.posteriors(model)) == len(names) + 1  # one per weight matrix, and the head
    layer = model.rnn
    assert layer.hidden_size == 8 and layer.batch_first  # data attributes pass through every nested layer
    assert all(f"{n}: mode=variational" in repr(model) for n in names)  # each nested layer names its parameter
    with torch.no_grad():
        for name in names:
            getattr(plain.rnn, name).copy_(getattr(layer, name))
        plain.head.weight.copy_(model.head.weight)
    x = _sequences()
    assert torch.allclose(model(x), plain(x), atol=1e-6)
    model(x).square().mean().backward()
    assert all(p.means.grad.abs().sum() > 0 for p in sqs.posteriors(model).values())


@pytest.mark.parametrize("likelihood", ["plugin", "moment_matched"])
def test_lstm_trains_and_round_trips(likelihood, tmp_path):
    model = sqs.prepare_(_model("lstm"), sqs.SQSConfig(num_components=4, likelihood=likelihood))
    x, y = _sequences(), torch.randint(0, 3, (4, 5), generator=torch.Generator().manual_seed(2))
    objective = sqs.Objective(model, num_data=20)
    opt = torch.optim.AdamW(sqs.param_groups(model, gate_lr=1e-3))
    pruning = sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=4)
    model.train()
    if likelihood == "moment_matched":
        torch.manual_seed(0)
        assert not torch.equal(model(x), model(x))  # the weights are drawn in training
    for step in range(4):
        pruning.step(step)
        loss = objective(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    pruning.step(4)
    model.eval()
    sqs.greedy_(model, nonzero=0.5)
    path = tmp_path / "lstm.sqs"
    sqs.save(model, path, nonzero=0.5)
    rows = {r.name + "." + r.parameter for r in sqs.compression_report(path).layers}
    assert rows == {f"rnn.{n}" for n in _weights(_model("lstm").rnn)} | {"head.weight"}
    skeleton = sqs.load(path, _model("lstm")).eval()
    with torch.no_grad():
        assert torch.equal(skeleton(x), model(x))
    average = sqs.BayesianAverage(model, samples=2, nonzero=0.5, generator=torch.Generator().manual_seed(3))
    loaded = sqs.load_bayesian_average(path, _model("lstm"), samples=2, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(average(x), loaded(x))


def test_a_prepared_lstm_pickles_and_its_weights_cannot_be_assigned():
    model = sqs.prepare_(_model("gru"), sqs.SQSConfig(num_components=4))
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    again = torch.load(buffer, weights_only=False)
    x = _sequences()
    assert torch.equal(again(x), model(x))
    with pytest.raises(AttributeError, match="weight_hh_l1 is computed from the posterior"):
        model.rnn.weight_hh_l1 = nn.Parameter(torch.zeros(24, 8))
    model.rnn.flatten_parameters()  # model code calls it; the SQS layers pass it on


def test_torch_compile_of_a_prepared_lstm_matches_eager():
    model = sqs.prepare_(_model("lstm"), sqs.SQSConfig(num_components=4))
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="aot_eager")  # dynamo traces substituted_forward's functional_call
    x = _sequences()
    got, want = compiled(x), reference(x)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    got.square().mean().backward()
    want.square().mean().backward()
    for name, posterior in sqs.posteriors(model).items():
        assert torch.allclose(posterior.means.grad, sqs.posteriors(reference)[name].means.grad, rtol=1e-5, atol=1e-8)


def test_posteriors_by_the_tensor_they_compress():
    model = sqs.prepare_(_model("lstm"), sqs.SQSConfig(num_components=4))
    by_tensor = sqs.posteriors(model, by_tensor=True)
    assert set(by_tensor) == {f"rnn.{n}" for n in _weights(_model("lstm").rnn)} | {"head.weight"}
    assert (
        by_tensor["rnn.weight_ih_l0"]
        is model.rnn.base_layer.base_layer.base_layer.base_layer.base_layer.base_layer.base_layer.posterior
    )
    assert set(by_tensor.values()) == set(sqs.posteriors(model).values())
    with pytest.raises(ValueError, match="by_tensor must be True or False"):
        sqs.posteriors(model, by_tensor="yes")


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_prepared_recurrent_layer_computes_after_it_is_moved(case):
    """``model.to(...)``, ``.float()`` and ``.double()`` rebuild an RNN's flat-weight cache, which then held None for
    the compressed weights: the next forward failed inside torch. Moved, it computes and trains as before."""
    model = sqs.prepare_(_model(case), sqs.SQSConfig(num_components=4))
    x = _sequences()
    before = model(x).detach()
    model.to("cpu").float()
    after = model(x)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    after.square().mean().backward()
    grads = [p.gate_logits.grad for p in sqs.posteriors(model).values()]
    assert all(g is not None and bool(g.isfinite().all()) for g in grads)
    sqs.greedy_(model, nonzero=0.5)
    fixed = model(x).detach()
    model.double()
    torch.testing.assert_close(model(x.double()).float(), fixed, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_prepared_recurrent_model_deep_copies_after_a_training_forward(case):
    """The flat-weight cache held the substituted weights of the last forward (graph nodes), so ``copy.deepcopy``
    of the model, or of a BayesianAverage over it, failed after a training forward; the copy trains as the model."""
    model = sqs.prepare_(_model(case), sqs.SQSConfig(num_components=4))
    x = _sequences()
    model(x).square().mean().backward()
    again = copy.deepcopy(model)
    torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)
    average = sqs.BayesianAverage(model, samples=2, generator=torch.Generator().manual_seed(0))
    copied = copy.deepcopy(average)
    with torch.no_grad():
        torch.testing.assert_close(copied(x), average(x), rtol=0, atol=0)
