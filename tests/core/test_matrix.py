"""Every toy model × config runs prepare → train → greedy / sampled / averaged inference."""

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from toy_models import MODELS

CONFIGS = {
    "default": {},
    "k2-equal-standard": {"num_components": 2, "windows": "equal", "responsibility": "standard"},
    "k8-none-moment": {"num_components": 8, "windows": "none", "likelihood": "moment_matched"},
    "gaussian-prior-trainθ": {"prior": sqs.GaussianPrior(slab_std=0.5), "train_weight": True},
}


def _train(model, steps=6):
    x = torch.randn(32, 12, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 5, (32,), generator=torch.Generator().manual_seed(1))
    objective = sqs.Objective(model, num_data=32)
    opt = torch.optim.AdamW(sqs.param_groups(model, weight_lr=1e-3, other_lr=1e-3))
    pruning = sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=steps)
    gate_tau = sqs.GateTemperatureSchedule(model, total_steps=steps)
    model.train()
    for step in range(steps):
        pruning.step(step)
        gate_tau.step(step)
        loss = objective(F.cross_entropy(model(x), y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    pruning.step(steps)
    return x


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("model_name", list(MODELS))
def test_prepare_train_infer(model_name, config_name):
    torch.manual_seed(0)
    model = MODELS[model_name]()
    sqs.prepare_(model, sqs.SQSConfig(**CONFIGS[config_name]))
    before = {n: p.gate_logits.detach().clone() for n, p in sqs.posteriors(model).items()}
    x = _train(model)
    after = sqs.posteriors(model)
    assert any(not torch.equal(before[n], p.gate_logits.detach()) for n, p in after.items())
    model.eval()
    sqs.greedy_(model, nonzero=0.5)
    greedy_out = model(x)
    weights = {n: layer.fixed_weight for n, layer in sqs.sqs_layers(model).items()}
    total = sum(p.weight.numel() for p in after.values())
    unique_layers = {id(layer.posterior): layer for layer in sqs.sqs_layers(model).values()}.values()
    kept = sum(int((layer.fixed_weight != 0).sum()) for layer in unique_layers)
    assert kept <= round(0.5 * total)  # a kept weight may still sit at a level of exactly 0
    for w, p in ((weights[n], p) for n, p in after.items() if n in weights):
        levels = set(torch.unique(w).tolist()) - {0.0}
        assert len(levels) <= p.num_components * p.num_windows
    sqs.sample_(model, nonzero=0.5, generator=torch.Generator().manual_seed(3))
    assert torch.isfinite(model(x)).all()
    avg = sqs.BayesianAverage(model, samples=3, nonzero=0.5, generator=torch.Generator().manual_seed(3))
    assert avg(x).shape == greedy_out.shape
    sqs.variational_(model)
    assert all(layer.mode == "variational" for layer in sqs.sqs_layers(model).values())


def test_tied_weights_share_one_posterior():
    from toy_models import Tied

    model = Tied()
    sqs.prepare_(model)
    assert model.a.posterior is model.b.posterior
    assert len(sqs.posteriors(model)) == 2
    assert list(sqs.posteriors(model, by_tensor=True)) == ["a.weight", "head.weight"]  # a tie: its first tensor
    _train(model)
    sqs.greedy_(model, nonzero=0.5)
    assert torch.equal(model.a.fixed_weight, model.b.fixed_weight)


def test_module_used_twice_is_wrapped_once():
    from toy_models import Nested

    model = Nested()
    sqs.prepare_(model)
    assert isinstance(model.shared, sqs.SQSLayer)
    assert len(sqs.posteriors(model)) == 4
