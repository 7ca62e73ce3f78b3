"""A posterior-moments backward whose outputs are partly unused: the Functions do not materialise their outputs'
gradients (sqs_core._gate_terms.materialized_grads), so autograd hands None for θ^avg, Var or the KL where a loss
does not use them; the gradients must be those of a loss that uses them times zero."""

import pytest
import sqs_core as sqs
import torch
from torch import nn


def _posterior(compiled):
    torch.manual_seed(0)
    layer = nn.Linear(24, 16)
    model = nn.Sequential(layer)
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, compile_kernels=compiled))
    (posterior,) = sqs.posteriors(model).values()
    with torch.no_grad():
        posterior.gate_logits.add_(torch.randn(posterior.gate_logits.shape) * posterior.gate_temperature)
        posterior.mask.view(-1)[::5] = False  # some weights pruned
    return posterior


def _grads(compiled, second, loss_of):
    posterior = _posterior(compiled)
    mean, var = posterior.moments(second=second)
    loss_of(mean, var, posterior.kl()).backward()
    params = (posterior.gate_logits, posterior.means, posterior.log_stds, posterior.mixing_logits)
    return [p.grad for p in params]


def _weights(mean):
    return torch.linspace(-1, 1, mean.numel()).reshape(mean.shape)


CASES = {
    "kl only": (False, lambda m, v, kl: kl, lambda m, v, kl: kl + 0 * m.sum()),
    "mean only": (False, lambda m, v, kl: (m * _weights(m)).sum(), lambda m, v, kl: (m * _weights(m)).sum() + 0 * kl),
    "var unused": (
        True,
        lambda m, v, kl: (m * _weights(m)).sum() + kl,
        lambda m, v, kl: (m * _weights(m)).sum() + kl + 0 * v.sum(),
    ),
    "mean unused": (True, lambda m, v, kl: v.sum() + kl, lambda m, v, kl: v.sum() + kl + 0 * m.sum()),
}


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_unused_outputs_give_the_gradients_of_a_zero_weighted_use(compiled, case):
    second, partial_loss, full_loss = CASES[case]
    got, want = _grads(compiled, second, partial_loss), _grads(compiled, second, full_loss)
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None or not bool(g.any())
        else:
            assert g is not None and torch.equal(g, w)
    assert got[0] is not None and bool(got[0].any())  # the gates learn in every case
