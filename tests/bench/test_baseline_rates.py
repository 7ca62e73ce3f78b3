"""Each baseline's reported compression_rate_paper against the paper's eq. written out from its compressed weights:
32·T / (Σ_l log2(K)·nnz_l + 32·Σ_l K), K = 2**bits per layer (the codebook each method stores).

Gap: uniform() charged with K = 2**bits − 1 (or any K) passed the suite: no test reads a baseline's rate."""

import math
from types import SimpleNamespace

import pytest
import torch
from sqs_bench import baselines
from sqs_bench.compression import compressible_layers
from sqs_bench.train import Budget
from torch import nn


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 30 * 30, 10)).eval()


def _expected(compressed: nn.Module, K: int) -> float:
    ws = [m.weight.detach() for m in compressible_layers(compressed).values()]
    total, nnz = sum(w.numel() for w in ws), sum(int((w != 0).sum()) for w in ws)
    return 32 * total / (math.log2(K) * nnz + 32 * K * len(ws))


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_uniform_rate_is_the_papers_formula(bits):
    data = SimpleNamespace(train_x=torch.zeros((0, 3, 32, 32), dtype=torch.uint8))
    compressed, record = baselines.uniform(_model(), data, Budget(epochs=0, bn_images=0), bits=bits, nonzero=0.3)
    assert record["num_components"] == 2**bits
    assert record["compression_rate_paper"] == pytest.approx(_expected(compressed, 2**bits), rel=1e-12)
