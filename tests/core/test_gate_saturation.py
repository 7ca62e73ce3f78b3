"""∂/∂s̃ of a saturated kept gate in float32: λ̃(1 − λ̃)/τ' with 1 − λ̃ taken as sigmoid(−ℓ), not 1 − sigmoid(ℓ),
which rounds to 0 past ℓ ≈ 17 and made the gradient exactly 0 (Adam then froze the gate; float64 moves it)."""

import copy

import pytest
import sqs_core as sqs
import torch
from torch import nn

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

SATURATED = torch.tensor([10.0, 15.0, 17.0, 20.0, 25.0, 40.0, -17.0, -30.0])  # ℓ = s̃/τ'


def _gate_grads(model):
    p = sqs.posteriors(model)["0"]
    p.gate_logits.grad = None
    (p.moments()[0].sum() + p.kl()).backward()
    return p.gate_logits.grad.reshape(-1)


@pytest.mark.parametrize("compiled", [False, True])
def test_saturated_gates_get_the_float64_gradient_in_float32(compiled):
    torch.manual_seed(0)
    model = sqs.prepare_(nn.Sequential(nn.Linear(8, 16)), sqs.SQSConfig(num_components=4, compile_kernels=compiled))
    p = sqs.posteriors(model)["0"]
    with torch.no_grad():
        flat = p.gate_logits.view(-1)
        flat[: SATURATED.numel()] = SATURATED * float(p.gate_temperature)
    reference = copy.deepcopy(model).double()
    got, want = _gate_grads(model), _gate_grads(reference)
    n = SATURATED.numel()
    assert bool((want[:n] != 0).all())  # the exact gradients are not 0, down to ℓ = 40 (4e-18 · dL/dλ̃ / τ')
    torch.testing.assert_close(got[:n].double(), want[:n], rtol=1e-4, atol=0)
