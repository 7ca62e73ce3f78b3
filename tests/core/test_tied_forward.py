"""Tied layers (a head sharing its token embedding's weight) share one posterior, evaluated once per training
forward: the other layers of the tie take the first call's θ^avg (sqs_core._forward_cache), so the posterior's
forward and backward run once, not once per layer, and the gradients are those of separate evaluations."""

import copy

import pytest
import sqs_core as sqs
import torch
from sqs_core import posterior as posterior_module
from torch import nn


class TiedLM(nn.Module):
    """A language-model shape: the head's weight is the token embedding's."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 16)
        self.body = nn.Linear(16, 16)
        self.head = nn.Linear(16, 40, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.body(self.embed(tokens))))


def _model():
    torch.manual_seed(0)
    return sqs.prepare_(TiedLM(), sqs.SQSConfig(num_components=4))


def _loss(model, tokens):
    logits = model(tokens)
    nll = nn.functional.cross_entropy(logits.reshape(-1, 40), tokens.roll(1, 1).reshape(-1))
    return sqs.Objective(model, num_data=100)(nll)


def _count_evaluations(monkeypatch):
    calls = []
    original = posterior_module.posterior_moments

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(posterior_module, "posterior_moments", counting)
    return calls


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_a_tie_is_evaluated_once_per_forward_with_the_gradients_of_two(monkeypatch):
    tokens = torch.randint(0, 40, (4, 6), generator=torch.Generator().manual_seed(1))
    model, separate = _model().double(), _model().double()  # float64: sums in another order agree to 1e-12
    tied = sqs.posteriors(model)["embed"]
    assert tied.sharers == 2 and sqs.posteriors(model)["body"].sharers == 1
    sqs.posteriors(separate)["embed"].sharers = 1  # the old behaviour: each layer evaluates it
    calls = _count_evaluations(monkeypatch)
    _loss(model, tokens).backward()
    assert len(calls) == 2  # the tie once, the body once
    _loss(separate, tokens).backward()
    assert len(calls) == 2 + 3
    ours, theirs = _grads(model), _grads(separate)
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-9, atol=1e-12)


def test_no_result_outlives_a_backward_or_a_parameter_change(monkeypatch):
    """Gradient accumulation (two forward/backward pairs before a step), a step, a forward that calls only one
    layer of the tie, and an evaluation without gradients each get a correct θ^avg and a usable graph."""
    tokens = torch.randint(0, 40, (4, 6), generator=torch.Generator().manual_seed(2))
    model = _model()
    opt = torch.optim.AdamW(sqs.param_groups(model, gate_lr=1e-3))
    calls = _count_evaluations(monkeypatch)
    _loss(model, tokens).backward()
    _loss(model, tokens).backward()  # the first backward consumed the shared graph: a new one is built
    assert len(calls) == 4
    opt.step()
    opt.zero_grad()
    embedded = model.embed(tokens)  # only one layer of the tie, then a backward
    embedded.square().mean().backward()
    logits = model(tokens)  # a fresh evaluation: the last one's graph went through a backward
    logits.square().mean().backward()
    assert len(calls) == 4 + 1 + 2
    with torch.no_grad():  # no gradients: every call evaluates (nothing is kept)
        model(tokens)
    assert len(calls) == 4 + 1 + 2 + 3
    hidden = model.embed(tokens)  # one layer of the tie with gradients on, its parameters changed, the other
    with torch.no_grad():
        sqs.posteriors(model)["embed"].means.mul_(1.5)
    changed = model.head(hidden)
    fixed_head = nn.functional.linear(hidden, sqs.posteriors(model)["embed"].moments()[0].detach())
    torch.testing.assert_close(changed, fixed_head)  # the new means, not the first call's θ^avg
    reference = copy.deepcopy(model)
    sqs.posteriors(reference)["embed"].sharers = 1
    with torch.no_grad():
        sqs.posteriors(model)["embed"].gate_logits.add_(0.3)  # in place, between forwards: a new version
        sqs.posteriors(reference)["embed"].gate_logits.add_(0.3)
    assert torch.equal(model(tokens), reference(tokens))


@pytest.mark.parametrize("likelihood", ["plugin", "moment_matched"])
def test_gpt2_style_tie_trains_and_round_trips(likelihood, tmp_path):
    tokens = torch.randint(0, 40, (4, 6), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    model = sqs.prepare_(TiedLM(), sqs.SQSConfig(num_components=4, likelihood=likelihood))
    opt = torch.optim.AdamW(sqs.param_groups(model, gate_lr=1e-3))
    for _ in range(3):
        loss = _loss(model, tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)
    model.eval()
    sqs.save(model, tmp_path / "tied.sqs", nonzero=0.5)
    sqs.greedy_(model, nonzero=0.5)
    plain = sqs.load(tmp_path / "tied.sqs", TiedLM())
    assert plain.head.weight is plain.embed.weight
    with torch.no_grad():
        assert torch.equal(plain(tokens), model(tokens))


class Checkpointed(nn.Module):
    """TiedLM's forward under activation checkpointing (torch.utils.checkpoint), whose backward runs the forward
    again: the whole forward (both layers of the tie inside), or the body and head only (the tie across the
    boundary; the reentrant variant needs an input that requires grad)."""

    def __init__(self, model, whole, use_reentrant):
        super().__init__()
        self.model, self.whole, self.use_reentrant = model, whole, use_reentrant

    def forward(self, tokens):
        if self.whole:
            return torch.utils.checkpoint.checkpoint(self.model, tokens, use_reentrant=self.use_reentrant)
        model = self.model
        embedded = model.embed(tokens)
        return torch.utils.checkpoint.checkpoint(
            lambda h: model.head(torch.tanh(model.body(h))), embedded, use_reentrant=self.use_reentrant
        )


@pytest.mark.parametrize(("whole", "use_reentrant"), [(True, False), (False, False), (False, True)])
@pytest.mark.parametrize("likelihood", ["plugin", "moment_matched"])
def test_a_tie_under_activation_checkpointing_gets_the_gradients_without_it(whole, use_reentrant, likelihood):
    """The recomputation inside the backward must not take the θ^avg the first forward left for the tie's other
    layer (it did: torch's CheckpointError, fewer tensors saved the second time); two steps, the same gradients."""
    tokens = torch.randint(0, 40, (4, 6), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    plain = sqs.prepare_(TiedLM().double(), sqs.SQSConfig(num_components=4, likelihood=likelihood))
    checkpointed = Checkpointed(copy.deepcopy(plain), whole, use_reentrant)
    got = []
    for model in (plain, checkpointed):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(3)  # the moment-matched forward's noise: checkpoint restores the RNG for the recompute
        for _ in range(2):
            opt.zero_grad()
            _loss(model, tokens).backward()
            opt.step()
        got.append({n.removeprefix("model."): g for n, g in _grads(model).items()})
    assert got[0].keys() == got[1].keys()
    for name, grad in got[0].items():
        torch.testing.assert_close(got[1][name], grad, rtol=1e-9, atol=1e-12, msg=name)


def test_a_tie_outside_the_checkpointed_blocks_is_still_evaluated_once(monkeypatch):
    """A language model's usual gradient checkpointing wraps its blocks, not the embedding and head: the tie's
    θ^avg is still handed from one to the other (the body: once in the forward, once recomputed)."""
    tokens = torch.randint(0, 40, (4, 6), generator=torch.Generator().manual_seed(1))
    model = _model()

    def forward(tokens):
        hidden = torch.utils.checkpoint.checkpoint(model.body, model.embed(tokens), use_reentrant=False)
        return model.head(torch.tanh(hidden))

    monkeypatch.setattr(model, "forward", forward)
    calls = _count_evaluations(monkeypatch)
    _loss(model, tokens).backward()
    assert len(calls) == 1 + 2


def test_without_torchs_queries_the_tie_is_evaluated_per_layer(monkeypatch):
    """Where torch lacks the graph-task query (a private API), sharing is off: each layer of the tie evaluates
    the posterior, with the gradients of the shared evaluation."""
    tokens = torch.randint(0, 40, (4, 6), generator=torch.Generator().manual_seed(1))
    shared, unshared = _model().double(), _model().double()
    _loss(shared, tokens).backward()
    monkeypatch.delattr(torch._C, "_current_graph_task_id")
    calls = _count_evaluations(monkeypatch)
    _loss(unshared, tokens).backward()
    assert len(calls) == 3  # the tie twice, the body once
    ours, theirs = _grads(unshared), _grads(shared)
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-9, atol=1e-12)
