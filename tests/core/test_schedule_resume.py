"""Resuming a run with a PruningSchedule: from its state_dict, or with a fresh schedule that infers it."""

import copy

import pytest
import sqs_core as sqs
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn


def prepared(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(10, 30), nn.ReLU(), nn.Linear(30, 7))
    model = sqs.prepare_(model, sqs.SQSConfig(gate_init="magnitude"))
    with torch.no_grad():  # distinct λ̃, so that a mask update after a gate change is visible
        for p in sqs.posteriors(model).values():
            p.gate_logits.add_(0.01 * torch.randn(p.gate_logits.shape))
    return model


def run(schedule, model, steps):
    """(rate returned, whether the masks were replaced) at each step; gates move between steps as in training."""
    out = []
    for t in steps:
        before = [p.mask for p in sqs.posteriors(model).values()]
        rate = schedule.step(t)
        after = [p.mask for p in sqs.posteriors(model).values()]
        out.append((t, rate, any(a is not b for a, b in zip(before, after, strict=True))))
        with torch.no_grad():
            for i, p in enumerate(sqs.posteriors(model).values()):
                g = torch.Generator().manual_seed(1000 * t + i)
                p.gate_logits.add_(0.05 * torch.randn(p.gate_logits.shape, generator=g))
    return out


def masks(model):
    return torch.cat([p.mask.reshape(-1) for p in sqs.posteriors(model).values()])


@settings(max_examples=40, deadline=None)
@given(
    total=st.integers(1, 24),
    every=st.integers(1, 6),
    cut=st.integers(1, 30),
    start=st.sampled_from([0.0, 0.2, 0.5]),
    end=st.sampled_from([0.5, 0.75, 1.0]),
    target=st.sampled_from([0.3, 0.5, 0.7]),
    load=st.booleans(),
)
def test_a_resumed_schedule_follows_the_uninterrupted_run(total, every, cut, start, end, target, load):
    """Steps cut, cut+1, ... of a schedule resumed at ``cut`` (fresh, or from the state_dict) return the same rates
    and update the masks at the same steps as an uninterrupted run; the masks end the same."""
    kw = {"target_nonzero": target, "total_steps": total, "start_fraction": start, "end_fraction": end}
    kw["update_every"] = every
    whole, resumed = prepared(), prepared()
    uninterrupted = run(sqs.PruningSchedule(whole, **kw), whole, range(total + 4))
    first = sqs.PruningSchedule(resumed, **kw)
    run(first, resumed, range(min(cut, total + 4)))
    again = sqs.PruningSchedule(resumed, **kw)
    if load:
        again.load_state_dict(copy.deepcopy(first.state_dict()))
    assert run(again, resumed, range(cut, total + 4)) == uninterrupted[cut:]
    assert torch.equal(masks(whole), masks(resumed))


def test_a_fresh_schedule_on_an_unpruned_model_starts_at_full_rate():
    """Not resumed (nothing pruned yet): a first call at a step that is not an update reports 1.0, as before."""
    model = prepared()
    schedule = sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=20, update_every=4)
    assert schedule.step(5) == 1.0
    assert bool(masks(model).all())
    assert schedule.step(8) < 1.0


def test_state_dict_of_another_schedule_is_refused_naming_what_differs():
    model = prepared()
    ours = sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=20, update_every=4)
    other = sqs.PruningSchedule(prepared(1), target_nonzero=0.3, total_steps=20, update_every=2)
    other.step(10)
    with pytest.raises(ValueError, match=r"target_nonzero=0\.3 \(this schedule: 0\.5\).*update_every=2"):
        ours.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="not a PruningSchedule state_dict"):
        ours.load_state_dict({"current_nonzero": 0.5})
    bad = {**ours.state_dict(), "current_nonzero": float("nan")}
    with pytest.raises(ValueError, match="current_nonzero"):
        ours.load_state_dict(bad)
    assert ours.current_nonzero == 1.0
    assert ours.step(5) == 1.0  # nothing loaded, and the model is not pruned yet
