"""Resuming a run: a checkpoint into a model built and prepared afresh (its own init), and a PruningSchedule
from its state_dict or a fresh one that infers it."""

import copy
import dataclasses

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
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


def _with_outliers(seed):
    """A model whose first layer has a few large weights: outlier windows give it more windows than a fresh init."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    with torch.no_grad():
        model[0].weight[0, :3] = torch.tensor([2.5, -3.0, 4.0])
    return model


def _fresh(config):
    torch.manual_seed(123)
    return sqs.prepare_(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)), config)


def _train_step(model, optimizer, x, y):
    loss = sqs.Objective(model, num_data=100)(F.cross_entropy(model(x), y))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def test_a_checkpoint_loads_into_a_model_prepared_from_another_init(caplog):
    """Outlier windows: W depends on the weights prepare_ saw; the fresh model takes the checkpoint's W (before:
    a bare size mismatch), and training goes on exactly as in the checkpointed model."""
    config = sqs.SQSConfig(num_components=4)
    trained = sqs.prepare_(_with_outliers(0), config)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    opt = torch.optim.AdamW(sqs.param_groups(trained))
    _train_step(trained, opt, x, y)
    checkpoint = copy.deepcopy((trained.state_dict(), opt.state_dict()))
    fresh = _fresh(config)
    windows = (sqs.posteriors(trained)["0"].num_windows, sqs.posteriors(fresh)["0"].num_windows)
    assert windows[1] < windows[0]
    fresh_opt = torch.optim.AdamW(sqs.param_groups(fresh))  # built before the load, as scripts often do
    with caplog.at_level("INFO", logger="sqs_core._window_load"):
        fresh.load_state_dict(checkpoint[0])
    assert [r.getMessage() for r in caplog.records] == [
        f"layer '0': {windows[1]} windows in this model, the checkpoint's {windows[0]} taken"
    ]
    fresh_opt.load_state_dict(checkpoint[1])
    assert sqs.posteriors(fresh)["0"].num_windows == sqs.posteriors(trained)["0"].num_windows
    assert torch.equal(fresh(x), trained(x))
    assert _train_step(fresh, fresh_opt, x, y) == _train_step(trained, opt, x, y)
    assert all(
        torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), trained.state_dict().values(), strict=True)
    )


def test_a_checkpoint_of_another_k_or_without_window_ids_is_refused_clearly():
    state = sqs.prepare_(_with_outliers(0), sqs.SQSConfig(num_components=4)).state_dict()
    with pytest.raises(RuntimeError, match=r"layer '0' has K = 4 components in the checkpoint and 8 in this model"):
        _fresh(sqs.SQSConfig(num_components=8)).load_state_dict(state)
    partial = {k: v for k, v in state.items() if not k.endswith("window_ids")}
    with pytest.raises(RuntimeError, match="holds no window_ids"):
        _fresh(sqs.SQSConfig(num_components=4)).load_state_dict(partial, strict=False)


@pytest.mark.parametrize(
    ("changed", "said"),
    [
        ({"prior": sqs.GaussianPrior(slab_std=1.0)}, "prior {'keep_prob': 0.5, 'kind': 'spike_slab', 'slab_std': 1.0}"),
        ({"temperature": 0.1}, "temperature 0.0005 in the checkpoint, 0.1 here"),
        ({"gate_temperature": 0.05}, "gate_temperature 0.0125 in the checkpoint, 0.05 here"),
        ({"likelihood": "moment_matched"}, "likelihood 'plugin' in the checkpoint, 'moment_matched' here"),
        ({"responsibility": "standard", "kl_weight": 1.0}, "responsibility 'paper' in the checkpoint, 'standard'"),
    ],
)
def test_a_checkpoint_trained_under_other_settings_loads_with_a_warning_naming_them(changed, said, caplog):
    """Every tensor fits, so such a checkpoint loaded without a word before session 64 while the resumed run
    trained another objective or forward; the model keeps its own settings, and the same config loads quietly."""
    config = sqs.SQSConfig(num_components=4)
    state = sqs.prepare_(_with_outliers(0), config).state_dict()
    with caplog.at_level("WARNING", logger="sqs_core.load"):
        _fresh(config).load_state_dict(state)
        assert not caplog.records
        other = _fresh(dataclasses.replace(config, **changed))
        own = other.state_dict()["0.posterior.settings"].clone()
        other.load_state_dict(state)
    assert said in caplog.records[0].getMessage() and "layer '0'" in caplog.records[0].getMessage()
    assert torch.equal(other.state_dict()["0.posterior.settings"], own)


def test_a_checkpoint_without_settings_loads_and_malformed_ones_are_refused():
    config = sqs.SQSConfig(num_components=4)
    state = sqs.prepare_(_with_outliers(0), config).state_dict()
    older = {k: v for k, v in state.items() if not k.endswith(".settings")}  # saved before session 64
    _fresh(config).load_state_dict(older)
    with pytest.raises(RuntimeError, match=r"'0\.posterior\.settings' must be the JSON of a layer's SQS settings"):
        _fresh(config).load_state_dict({**state, "0.posterior.settings": torch.zeros(3)})


def test_per_window_names_every_tensor_whose_size_follows_the_window_count():
    """take_window_count resizes the tensors _window_load.PER_WINDOW names; a posterior tensor added later whose
    size depends on W and is missing there would fail the load with a bare size mismatch."""
    from sqs_core._window_load import PER_WINDOW

    config = sqs.SQSConfig(num_components=4)
    many, few = sqs.prepare_(_with_outliers(0), config).state_dict(), _fresh(config).state_dict()
    assert many.keys() == few.keys()
    differing = {key.rpartition(".")[2] for key in many if many[key].shape != few[key].shape}
    assert differing == set(PER_WINDOW)
