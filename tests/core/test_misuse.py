"""Misuse that once went silently wrong now fails clearly, or works: non-finite posteriors and KLs, training
fixed layers, half-compressed ties, Bayesian averaging that left its last draw behind, deepcopy after a
forward, bad adapters and flags."""

import copy
import re

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from sqs_core.posterior import LOG_STD_MAX, LOG_STD_MIN
from torch import nn

X, Y = torch.randn(6, 4, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 0, 1, 1, 0])


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def prepared(**config):
    return sqs.prepare_(mlp(), sqs.SQSConfig(**config))


@pytest.mark.parametrize("attr", ["means", "log_stds", "mixing_logits", "gate_logits"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_posterior_is_not_turned_into_weights(tmp_path, attr, value):
    model = prepared()
    with torch.no_grad():
        getattr(sqs.posteriors(model)["2"], attr).view(-1)[0] = value
    for call in (
        lambda: sqs.greedy_(model),
        lambda: sqs.sample_(model, generator=torch.Generator().manual_seed(0)),
        lambda: sqs.BayesianAverage(model, samples=2),
        lambda: sqs.save(model, tmp_path / "m.sqs"),
    ):
        with pytest.raises(ValueError, match=f"layer '2' holds NaN or inf in {attr}"):
            call()
    assert not (tmp_path / "m.sqs").exists()
    assert all(layer.mode == "variational" for layer in sqs.sqs_layers(model).values())


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_the_pruning_schedule_refuses_to_rank_non_finite_gates(value):
    """A NaN gate logit has no rank: the schedule once kept or pruned it arbitrarily and went on."""
    model = prepared()
    schedule = sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=4)
    schedule.step(0)
    with torch.no_grad():
        sqs.posteriors(model)["2"].gate_logits.view(-1)[3] = value
    masks = [p.mask.clone() for p in sqs.posteriors(model).values()]
    with pytest.raises(ValueError, match=r"layer '2' holds NaN or inf in gate_logits.*cannot be ranked for pruning"):
        schedule.step(4)
    assert all(torch.equal(m, p.mask) for m, p in zip(masks, sqs.posteriors(model).values(), strict=True))


def test_a_non_finite_kl_names_the_layer():
    model = prepared()
    with torch.no_grad():  # finite means whose μ²/σ_0² overflows float32 in KL(N(μ, σ²) ‖ N(0, σ_0²))
        sqs.posteriors(model)["0"].means.fill_(1e30)
    objective = sqs.Objective(model, num_data=6)
    with pytest.raises(FloatingPointError, match="KL of layer '0' is inf"):
        objective(F.cross_entropy(model(X), Y))


@pytest.mark.parametrize("likelihood", ["plugin", "moment_matched"])
@pytest.mark.parametrize("log_std", [-90.0, -300.0])
def test_a_vanishing_std_is_floored_so_gradients_stay_finite(likelihood, log_std):
    """σ below float32's range (1/σ overflowed in backward: NaN gradients for every μ and log σ of the
    layer, written into the parameters by the next optimizer step) is evaluated at the floor, gradient 0."""
    _assert_clamped_at(log_std, LOG_STD_MIN, likelihood=likelihood)


def _assert_clamped_at(log_std, bound, **config):
    """Half of layer '0''s log σ set to ``log_std`` beyond the clamp: every gradient finite, each equal to that
    with those log σ at ``bound`` itself, and theirs 0."""
    grads = []
    for value in (log_std, bound):
        model = prepared(**config)
        with torch.no_grad():
            sqs.posteriors(model)["0"].log_stds.view(-1)[::2] = value
        sqs.Objective(model, num_data=6)(F.cross_entropy(model(X), Y)).backward()
        grads.append({name: p.grad for name, p in model.named_parameters() if p.grad is not None})
    for name, grad in grads[0].items():
        assert torch.isfinite(grad).all(), name
        if not name.endswith("0.posterior.log_stds"):
            assert torch.equal(grad, grads[1][name]), name
    assert torch.all(grads[0]["0.posterior.log_stds"].view(-1)[::2] == 0)


def test_training_after_an_inference_mode_forward_of_a_layer_the_step_does_not_use():
    """A head used only in evaluation keeps the k* of its last forward; under torch.inference_mode (Lightning's
    validation) that was an inference tensor, and every later Objective call failed to save it for backward."""
    model = prepared()
    with torch.inference_mode():
        model(X)
    head_only = model[2]
    objective = sqs.Objective(model, num_data=6)
    loss = objective(F.cross_entropy(model[1](model[0](X)) @ torch.ones(8, 2), Y))  # layer '2' not called
    loss.backward()
    assert (
        head_only.posterior.gate_logits.grad is not None and torch.isfinite(head_only.posterior.gate_logits.grad).all()
    )


def test_loading_a_posterior_into_a_fixed_layer_puts_it_back_to_variational(caplog):
    """A greedy weight was drawn from the posterior that load_state_dict replaces (and state_dict does not
    hold it): the layer used to keep computing with that stale weight."""
    model = prepared()
    checkpoint = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        sqs.posteriors(model)["0"].means.add_(0.5)
    sqs.greedy_(model)
    heads_only = {k: v for k, v in checkpoint.items() if not k.startswith("0.")}
    model.load_state_dict(heads_only, strict=False)  # layer '0''s posterior untouched: its greedy weight stays
    assert sqs.sqs_layers(model)["0"].mode == "fixed" and sqs.sqs_layers(model)["2"].mode == "variational"
    model.load_state_dict(checkpoint)
    assert all(layer.mode == "variational" for layer in sqs.sqs_layers(model).values())
    assert torch.equal(model[0].weight, prepared()[0].weight)  # θ^avg of the loaded posterior
    assert "back to the variational mode" in caplog.text


def test_a_module_holding_a_prepared_model_works_with_every_entry_point(tmp_path):
    """prepare_(net.backbone), AveragedModel(model), DDP-like wrappers: the entry points said "not prepared"."""
    wrapper = nn.Sequential(prepared(), nn.Softmax(dim=-1))
    objective = sqs.Objective(wrapper, num_data=6)
    objective(F.nll_loss(wrapper(X).log(), Y)).backward()
    assert len(sqs.param_groups(wrapper)[0]["params"]) == 6
    sqs.save(wrapper, tmp_path / "m.sqs", nonzero=0.5)
    sqs.greedy_(wrapper, nonzero=0.5)
    with pytest.raises(ValueError, match="not a model prepare_ was called on"):
        sqs.Objective(wrapper[0][2:], num_data=6)  # a part of a prepared model
    other = sqs.prepare_(mlp(), sqs.SQSConfig(num_components=8))
    with pytest.raises(ValueError, match="different configs \\('0', '1'\\)"):
        sqs.Objective(nn.Sequential(prepared(), other), num_data=6)


def test_an_overflowing_kl_weight_is_refused_with_the_loss():
    model = prepared(kl_weight=1e300)
    with pytest.raises(FloatingPointError, match="lower kl_weight"):
        sqs.Objective(model, num_data=1)(F.cross_entropy(model(X), Y))


@pytest.mark.parametrize("bad", [True, "1e-3", float("nan"), -1.0])
def test_objective_kl_weight_must_be_a_finite_number(bad):
    with pytest.raises(ValueError, match="kl_weight"):
        sqs.Objective(prepared(), num_data=6, kl_weight=bad)


def test_training_fixed_layers_is_refused_but_evaluating_them_works():
    model = sqs.greedy_(prepared())
    objective = sqs.Objective(model, num_data=6)
    with pytest.raises(ValueError, match=r"layers \['0', '2'\] have fixed weights.*variational_"):
        objective(F.cross_entropy(model(X), Y))
    with torch.no_grad():
        assert torch.isfinite(objective(F.cross_entropy(model(X), Y)))
    sqs.variational_(model)
    objective(F.cross_entropy(model(X), Y)).backward()
    assert sqs.posteriors(model)["0"].gate_logits.grad is not None


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(10, 6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, i):
        return self.head(self.emb(i))


@pytest.mark.parametrize(
    "config",
    [
        sqs.SQSConfig(exclude=("head",)),
        sqs.SQSConfig(include=("emb",)),
        sqs.SQSConfig(overrides={"^head$": {"skip": True}}),
    ],
)
def test_compressing_one_side_of_a_tie_is_refused_and_changes_nothing(config):
    model = TiedLM()
    before = repr(model)
    with pytest.raises(ValueError, match=r"'emb' is tied to 'head.weight'.*compress both"):
        sqs.prepare_(model, config)
    assert repr(model) == before and not sqs.is_prepared(model) and model.head.weight is model.emb.weight


def test_a_weight_tied_to_a_bare_parameter_is_refused():
    model = mlp()
    model.register_parameter("shadow", model[0].weight)
    with pytest.raises(ValueError, match="'0' is tied to 'shadow'"):
        sqs.prepare_(model)


def test_both_sides_of_a_tie_still_compress_together():
    model = sqs.prepare_(TiedLM())
    assert len(sqs.posteriors(model)) == 1 and len(sqs.sqs_layers(model)) == 2


@pytest.mark.parametrize(
    ("overrides", "differs"),
    [
        ({"^head$": {"num_components": 2}}, "num_components 4 vs 2"),
        (
            {"^emb$": {"windows": "none", "temperature": 0.01}},
            "windows 'none' vs 'outlier', temperature 0.01 vs 0.0005",
        ),
        ({"^head$": {"responsibility": "standard"}}, "responsibility 'paper' vs 'standard'"),
    ],
)
def test_overrides_that_split_a_tie_are_refused_and_change_nothing(overrides, differs):
    """One posterior serves both layers of a tie: it was built with the first layer's settings, and an override
    of the other was silently ignored (found by tests/core/test_random_configs.py)."""
    model = TiedLM()
    before = repr(model)
    with pytest.raises(ValueError, match=r"'emb' and 'head' share one weight.*" + re.escape(f"({differs})")):
        sqs.prepare_(model, sqs.SQSConfig(overrides=overrides))
    assert repr(model) == before and not sqs.is_prepared(model)
    both = sqs.prepare_(TiedLM(), sqs.SQSConfig(overrides={"^(emb|head)$": next(iter(overrides.values()))}))
    assert len(sqs.posteriors(both)) == 1


def _outputs(model):
    with torch.no_grad():
        return model(X)


@pytest.mark.parametrize("fixed", [False, True])
def test_bayesian_average_puts_the_layers_back(fixed):
    model = prepared(temperature=0.5)  # soft φ: the draws differ from the greedy levels
    model.eval()
    if fixed:
        sqs.greedy_(model)
    before = _outputs(model)
    weights = {name: layer.fixed_weight for name, layer in sqs.sqs_layers(model).items()}
    averaged = sqs.BayesianAverage(model, samples=3, generator=torch.Generator().manual_seed(0))(X)
    assert not torch.equal(averaged, before)  # the draws were used ...
    assert torch.equal(_outputs(model), before)  # ... and the model is as it was
    for name, layer in sqs.sqs_layers(model).items():
        assert layer.mode == ("fixed" if fixed else "variational")
        assert (layer.fixed_weight is None) if not fixed else torch.equal(layer.fixed_weight, weights[name])


def test_a_loaded_bayesian_average_leaves_the_greedy_weights(tmp_path):
    model = prepared(temperature=0.5)
    sqs.save(model, tmp_path / "m.sqs")
    greedy = _outputs(sqs.load(tmp_path / "m.sqs", mlp()))
    skeleton = mlp()
    average = sqs.load_bayesian_average(tmp_path / "m.sqs", skeleton, samples=3)
    assert torch.equal(_outputs(skeleton), greedy)
    assert not torch.equal(average(X), greedy)
    assert torch.equal(_outputs(skeleton), greedy)


def test_deepcopy_after_a_training_forward_gives_an_equal_model():
    model = prepared()
    out = model(X)  # the posteriors now hold this forward's KL, a node of its graph
    twin = copy.deepcopy(model)
    loss = sqs.Objective(model, num_data=6)(F.cross_entropy(out, Y))
    assert torch.equal(_outputs(twin), _outputs(model))
    twin_loss = sqs.Objective(twin, num_data=6)(F.cross_entropy(twin(X), Y))
    torch.testing.assert_close(twin_loss, loss, rtol=0, atol=0)
    twin_loss.backward()  # the copy trains on its own
    assert sqs.posteriors(model)["0"].gate_logits.grad is None


@pytest.mark.parametrize("adapter", [None, "oops", sqs.LayerAdapter(forward=None, forward_no_bias=None)])
def test_register_layer_type_refuses_a_bad_adapter_and_keeps_the_old_one(adapter):
    with pytest.raises(ValueError, match="adapter must be a LayerAdapter"):
        sqs.register_layer_type(nn.Linear, adapter)
    assert len(sqs.sqs_layers(sqs.prepare_(mlp()))) == 2


@pytest.mark.parametrize(
    "call",
    [
        lambda m: sqs.greedy_(m, per_layer="no"),
        lambda m: sqs.sample_(m, per_layer=1),
        lambda m: sqs.discrete_posteriors(m, per_layer="no"),
        lambda m: sqs.BayesianAverage(m, per_layer="yes"),
    ],
)
def test_per_layer_must_be_a_bool(call):
    model = prepared()
    with pytest.raises(ValueError, match="per_layer must be True or False"):
        call(model)
    assert all(layer.mode == "variational" for layer in sqs.sqs_layers(model).values())


@pytest.mark.parametrize(
    "call", [lambda m: sqs.sample_(m, generator=3), lambda m: sqs.BayesianAverage(m, generator="seed")]
)
def test_generator_must_be_a_torch_generator(call):
    with pytest.raises(ValueError, match=r"generator must be a torch\.Generator or None"):
        call(prepared())


def test_prepare_refuses_a_dict_config():
    with pytest.raises(ValueError, match=r"SQSConfig \(SQSConfig.from_dict"):
        sqs.prepare_(mlp(), {"num_components": 4})


class WithEmptyLayer(nn.Module):
    """MobileBERT's prediction head when its hidden size equals its embedding size: a Linear with no outputs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.full, self.empty = nn.Linear(4, 8), nn.Linear(4, 0)

    def forward(self, x):
        return torch.cat([self.full(x), self.empty(x)], dim=-1)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_an_empty_layer_is_left_as_it_is_and_a_model_of_empty_layers_is_refused(tmp_path):
    """Before session 57 an empty layer refused the whole model (MobileBERT with hidden = embedding size)."""
    model = sqs.prepare_(WithEmptyLayer(), sqs.SQSConfig(num_components=4))
    assert sorted(sqs.sqs_layers(model)) == ["full"] and isinstance(model.empty, nn.Linear)
    sqs.greedy_(model)
    sqs.save(model, tmp_path / "m.sqs")
    plain = sqs.load(tmp_path / "m.sqs", WithEmptyLayer())
    with torch.no_grad():
        assert torch.equal(plain(X[:, :4]), model(X[:, :4]))
    excluded = sqs.prepare_(WithEmptyLayer(), sqs.SQSConfig(num_components=4, exclude=("empty",)))  # the old advice
    assert sorted(sqs.sqs_layers(excluded)) == ["full"]
    only_empty = nn.Sequential(nn.Linear(0, 3))
    with pytest.raises(ValueError, match="has no layer SQS can compress"):
        sqs.prepare_(only_empty)
    assert not sqs.is_prepared(only_empty)


def test_second_order_gradients_of_the_posterior_fail_clearly_and_input_penalties_work():
    model = prepared()
    x = X.clone().requires_grad_()
    out = model(x)
    (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)  # an input-gradient penalty: first order in s̃, μ
    (g.pow(2).sum() + F.cross_entropy(out, Y)).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    objective = sqs.Objective(model, num_data=100)
    first_order = "SQS posteriors give first-order gradients only"
    gates = sqs.posteriors(model)["0"].gate_logits
    for loss in (lambda: objective(F.cross_entropy(model(X), Y)), objective.kl):  # the fused forward, the gate KL
        with pytest.raises(RuntimeError, match=first_order):
            torch.autograd.grad(loss(), gates, create_graph=True)


def test_a_frozen_layer_is_compressed_with_a_trainable_posterior_and_the_log_says_so(caplog):
    model = mlp()
    model[2].requires_grad_(False)
    with caplog.at_level("INFO", logger="sqs_core.prepare"):
        sqs.prepare_(model, sqs.SQSConfig())
    said = [r.getMessage() for r in caplog.records if "frozen weight" in r.getMessage()]
    assert len(said) == 1 and "'2'" in said[0] and "'0'" not in said[0] and "exclude" in said[0]
    assert sqs.posteriors(model)["2"].means.requires_grad


def test_functional_call_takes_the_kl_at_the_supplied_parameters_inside_the_call_and_warns_outside(caplog):
    from sqs_core import _forward_cache
    from torch.func import functional_call

    model = prepared()
    objective = sqs.Objective(model, num_data=10)
    supplied = {k: (v.detach() + 0.05).requires_grad_() for k, v in model.named_parameters()}

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, y):
            return objective(F.cross_entropy(self.model(x), y))

    inside = functional_call(Step(), {f"model.{k}": v for k, v in supplied.items()}, (X, Y))
    holder = copy.deepcopy(model)
    with torch.no_grad():
        for k, v in holder.named_parameters():
            v.copy_(supplied[k])
    assert inside.item() == sqs.Objective(holder, num_data=10)(F.cross_entropy(holder(X), Y)).item()
    _forward_cache.log_other_tensors.cache_clear()
    with caplog.at_level("WARNING", logger="sqs_core.posterior"):
        objective(F.cross_entropy(functional_call(model, supplied, (X,)), Y))  # the KL outside the call
        objective(F.cross_entropy(functional_call(model, supplied, (X,)), Y))
    said = [r.getMessage() for r in caplog.records if "functional_call" in r.getMessage()]
    assert len(said) == 1 and "inside the functional call" in said[0]
    with caplog.at_level("WARNING", logger="sqs_core.posterior"):
        caplog.clear()
        _forward_cache.log_other_tensors.cache_clear()
        objective(F.cross_entropy(model(X), Y))
        assert not caplog.records  # an ordinary step says nothing


@pytest.mark.parametrize("log_std", [90.0, 300.0])
def test_an_overflowing_std_is_capped_so_gradients_stay_finite(log_std):
    """σ above float32's range (an SGD step too large for the loss put log σ at 95: σ = inf, and its
    component's gradients NaN while the loss stayed finite) is evaluated at the cap, gradient 0. (The
    moment-matched likelihood's variance at σ ≈ 9e18 overflows the layer's output: its NLL is refused.)"""
    _assert_clamped_at(log_std, LOG_STD_MAX)


@pytest.mark.parametrize("attr", ["means", "log_stds", "mixing_logits"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_the_objective_names_a_non_finite_posterior_table(attr, value):
    """A component no weight takes leaves the task loss and the KL finite, not the gradients: the Objective
    names the layer and the parameter instead of passing NaN gradients to the optimizer (or, with the NLL
    already NaN, saying only that)."""
    model = prepared(num_components=4)
    with torch.no_grad():
        getattr(sqs.posteriors(model)["2"], attr).view(-1)[-1] = value
    objective = sqs.Objective(model, num_data=6)
    with pytest.raises(FloatingPointError, match=f"layer '2' holds NaN or inf in {attr}"):
        objective(F.cross_entropy(model(X), Y))
