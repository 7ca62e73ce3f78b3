"""A prepared model under the user's own ``torch.compile``: the posterior runs eagerly (a graph break at
SpikeGMMPosterior.moments and .kl), the rest of the model is compiled, and the step is the eager step.

Before the break, dynamo traced into the posterior and AOTAutograd failed on its data-dependent sizes
("sources must not be empty for symbol ..."). The ``aot_eager`` backend runs that part without inductor's
C++ compile (fast, and no cache can hide the failure).
"""

import copy

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from torch import nn


def _loss_and_grads(model, forward, x, y):
    loss = sqs.Objective(model, num_data=16)(F.cross_entropy(forward(x), y))
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("likelihood", ["plugin", "moment_matched"])
def test_torch_compile_of_a_prepared_model_matches_eager(likelihood):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 5))
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, likelihood=likelihood))
    reference = copy.deepcopy(model)
    x, y = torch.randn(16, 32), torch.randint(0, 5, (16,))
    compiled = torch.compile(model, backend="aot_eager")
    for _ in range(2):  # the second call runs the cached graphs
        torch.manual_seed(1)  # the moment-matched forward draws noise
        want_loss, want = _loss_and_grads(reference, reference, x, y)
        torch.manual_seed(1)
        got_loss, got = _loss_and_grads(model, compiled, x, y)
        assert torch.allclose(got_loss, want_loss, rtol=1e-6)
        assert len(got) == len(want) == 10
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(got, want, strict=True))
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
    sqs.greedy_(model)  # the fixed mode compiles as an ordinary layer
    sqs.greedy_(reference)
    assert torch.allclose(compiled(x), reference(x), rtol=1e-5, atol=1e-6)


def test_a_file_saved_from_the_compile_wrapper_loads_into_a_plain_skeleton_and_back(tmp_path):
    """save/load/load_bayesian_average see through torch.compile's wrapper: before, the file's names carried
    its '_orig_mod.' prefix and a plain skeleton refused it."""
    torch.manual_seed(0)
    model = sqs.prepare_(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)), sqs.SQSConfig())
    sqs.save(torch.compile(model), tmp_path / "m.sqs", nonzero=0.5)
    plain = sqs.load(tmp_path / "m.sqs", nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)))
    assert sorted(plain.state_dict()) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    skeleton = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    sqs.load(tmp_path / "m.sqs", torch.compile(skeleton))
    average = sqs.load_bayesian_average(tmp_path / "m.sqs", torch.compile(copy.deepcopy(skeleton)), samples=2)
    sqs.greedy_(model, nonzero=0.5)
    x = torch.randn(4, 8)
    assert torch.equal(skeleton(x), model(x)) and torch.equal(plain(x), model(x))
    assert average(x).shape == (4, 3)


def _conv_net():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 5))
    return sqs.prepare_(model, sqs.SQSConfig(num_components=4)).eval()


@pytest.mark.parametrize("how", ["export", "export-strict", "jit-trace"])
def test_export_and_trace_take_fixed_weights_and_refuse_the_variational_mode_by_name(how):
    """A greedy model exports / traces as an ordinary network; the variational one is refused with the way out
    (torch.export failed on a data-dependent guard, jit.trace on an internal assert of torch's)."""
    model, x = _conv_net(), torch.randn(2, 3, 8, 8)

    def run(m):
        if how == "jit-trace":
            return torch.jit.trace(m, (x,))(x)
        return torch.export.export(m, (x,), strict=how == "export-strict").module()(x)

    with pytest.raises(Exception, match=r"variational \(training\) mode.*greedy_") as raised:
        run(model)
    assert how == "export-strict" or raised.type is ValueError  # strict export: dynamo's error carries it
    sqs.greedy_(model, nonzero=0.5)
    assert torch.equal(run(model), model(x))


class _Sequence(nn.Module):
    """An LSTM, a self-attention over its outputs (q/k/v weights of their own: kdim ≠ embed_dim) and a head: modules
    whose own forward runs with the compressed weights substituted (sqs_core.layers.substituted_forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(4, 8, batch_first=True)
        self.attn = nn.MultiheadAttention(8, 2, kdim=6, vdim=6, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.rnn(x)[0]
        return self.head(self.attn(h, h[..., :6], h[..., :6], need_weights=False)[0])


@pytest.mark.parametrize("how", ["export", "jit-trace"])
def test_a_fixed_model_with_substituted_forwards_exports_and_traces(how):
    """A greedy LSTM or nn.MultiheadAttention runs its own forward with the weights substituted, through
    torch.func.functional_call, which torch refuses while jit.trace runs ("The stateless API can't be used with
    Jitted modules", session 63); there the weights are set on the module for the call. The traced module computes
    what the model does, and the module's compressed parameters are None again after it."""
    torch.manual_seed(0)
    model = sqs.prepare_(_Sequence(), sqs.SQSConfig(num_components=4)).eval()
    sqs.greedy_(model, nonzero=0.5)
    x = torch.randn(2, 5, 4)
    traced = torch.jit.trace(model, (x,)) if how == "jit-trace" else torch.export.export(model, (x,)).module()
    torch.testing.assert_close(traced(x), model(x), rtol=0, atol=0)
    lstm = model.rnn.base_layer.base_layer  # weight_ih_l0's layer around weight_hh_l0's, around the LSTM
    assert lstm._parameters["weight_ih_l0"] is None and lstm._parameters["weight_hh_l0"] is None


def _func_transforms(model, x):
    """torch.func's transforms over a model: gradients of the parameters, per-sample ones, a batched forward
    (without gradients), the Jacobian in the input."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xb):
        return torch.func.functional_call(model, p, (xb,)).square().mean()

    def batched_forward():
        with torch.no_grad():
            return torch.func.vmap(model)(x.unsqueeze(1))

    return {
        "grad": lambda: torch.func.grad(loss)(params, x),
        "vmap(grad)": lambda: torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x.unsqueeze(1)),
        "vmap": batched_forward,
        "jacrev": lambda: torch.func.jacrev(model)(x[:1]),
    }


@pytest.mark.parametrize("transform", ["grad", "vmap(grad)", "vmap", "jacrev"])
def test_func_transforms_refuse_the_variational_mode_by_name_and_take_fixed_weights(transform):
    torch.manual_seed(0)
    model = sqs.prepare_(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), sqs.SQSConfig(num_components=4))
    x = torch.randn(5, 4)
    with pytest.raises(RuntimeError, match=r"torch.func transforms .* fix the weights first"):
        _func_transforms(model, x)[transform]()
    sqs.greedy_(model)
    got = _func_transforms(model, x)[transform]()
    if transform == "vmap":
        torch.testing.assert_close(got.squeeze(1), model(x))
