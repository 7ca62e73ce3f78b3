"""The ranking pass as a compiled kernel (sqs_core.selection, ``compiled=True``): the same split as the eager pass,
taken by the pruning schedule where the model's layers compile their kernels, never where they do not. (Its masks
against the eager ones on many tied inputs: test_schedules_inference,
test_divided_scores_rank_as_their_quotients_would.)"""

import math

import pytest
import sqs_core as sqs
import torch
from sqs_core import selection
from torch import nn


@pytest.fixture
def small_sample(monkeypatch):
    """A sample of 16 keys ±2 ranks, so that small tensors take the bracketed pass, in chunks of 13 keys."""
    monkeypatch.setattr(selection, "SAMPLE", 16)
    monkeypatch.setattr(selection, "SAMPLE_MARGIN", 2)
    monkeypatch.setattr(selection, "CHUNK", 13)


def test_the_compiled_pass_runs_the_kernel_and_splits_as_the_eager_pass(small_sample):
    """One bracketed pass over 1,000 divided keys: the kernel runs once per chunk, and the counts, the mask of the
    keys above the bracket and the positions and keys inside it are the eager pass's."""
    gates = torch.randn(1000, generator=torch.Generator().manual_seed(0)).round(decimals=1)  # ties
    gates[::50], gates[7::50] = math.inf, -math.inf
    keys = selection._Keys([gates], [torch.tensor(0.0125)], compiled=True)
    low, high = selection._bracket(keys, 400)
    assert low is not None and high is not None
    calls = selection._SPLIT_KERNEL.calls
    keep_compiled, keep_eager = torch.empty(1000, dtype=torch.bool), torch.empty(1000, dtype=torch.bool)
    got = selection._split_compiled(keys, low, high, keep_compiled)
    want = selection._split(keys, low, high, keep_eager)
    assert selection._SPLIT_KERNEL.calls - calls == math.ceil(1000 / 13)
    assert got[:2] == want[:2] and torch.equal(got[2], want[2]) and torch.equal(got[3], want[3])
    assert torch.equal(keep_compiled, keep_eager)


def test_float64_keys_stay_eager(small_sample):
    """Keys the kernel would divide otherwise than the eager pass (float64) take the eager pass."""
    keys = selection._Keys([torch.randn(500, dtype=torch.float64)], [None], compiled=True)
    assert not keys.compiled


@pytest.mark.parametrize("compile_kernels", [True, False])
def test_the_schedule_ranks_by_the_compiled_pass_where_the_layers_compile(small_sample, compile_kernels):
    """PruningSchedule.step ranks with the kernel exactly where some layer runs compiled kernels, and the masks are
    those of the same model trained eagerly."""

    def pruned(setting):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(20, 30), nn.Linear(30, 10))
        sqs.prepare_(model, sqs.SQSConfig(num_components=4, compile_kernels=setting))
        with torch.no_grad():
            for p in sqs.posteriors(model).values():
                p.gate_logits.copy_(torch.randn(p.gate_logits.shape))
        sqs.PruningSchedule(model, target_nonzero=0.4, total_steps=4).step(4)
        return [p.mask.clone() for p in sqs.posteriors(model).values()]

    calls = selection._SPLIT_KERNEL.calls
    masks = pruned(compile_kernels)
    assert (selection._SPLIT_KERNEL.calls > calls) == compile_kernels
    assert all(torch.equal(a, b) for a, b in zip(masks, pruned(False), strict=True))
