"""Data-parallel training (``DistributedDataParallel``, two CPU processes over gloo): prepare → schedule → Objective on
each rank's half of a batch ends where one process on the whole batch ends (the ranks' gradients averaged), so
the SQS parameters, buffers (masks) and schedule need nothing of their own under DDP."""

import pytest
import sqs_core as sqs
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="torch.distributed with gloo is not available"
)

STEPS = 4
WORLD = 2


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 5))
    return sqs.prepare_(model, sqs.SQSConfig(num_components=4))


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 32, generator=g), torch.randint(0, 5, (16,), generator=g)


def _train(model, inner, x, y):
    """STEPS steps of plain SGD with the pruning schedule; ``inner``'s parameters and masks afterwards."""
    objective = sqs.Objective(model, num_data=100)
    schedule = sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=STEPS)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(STEPS):
        schedule.step(step)
        loss = objective(F.cross_entropy(model(x), y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    masks = [p.mask.clone() for p in sqs.posteriors(inner).values()]
    return [p.detach().clone() for p in inner.parameters()], masks


def _rank(rank, store, out):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        inner = _model()
        x, y = _batch()
        half = slice(rank * 8, (rank + 1) * 8)
        result = _train(torch.nn.parallel.DistributedDataParallel(inner), inner, x[half], y[half])
        torch.save(result, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_ddp_training_matches_one_process_on_the_whole_batch(tmp_path):
    out = tmp_path / "result"
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(out)), nprocs=WORLD)
    ranks = [torch.load(f"{out}.{rank}") for rank in range(WORLD)]
    model = _model()
    want_params, want_masks = _train(model, model, *_batch())
    for params, masks in ranks:
        assert all(torch.equal(a, b) for a, b in zip(masks, want_masks, strict=True))
        for got, want in zip(params, want_params, strict=True):
            # the average of two half-batch gradients against one whole-batch gradient: float32 rounding only
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(ranks[0][0], ranks[1][0], strict=True))  # the ranks agree exactly
