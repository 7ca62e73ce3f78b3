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


SHARDED = r"sharded \(a torch\.distributed DTensor.*fully_shard.*DistributedDataParallel"


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of one rank in this process, for FSDP's fully_shard."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_sharded_posteriors_are_refused_by_name(one_rank_group, tmp_path):
    """FSDP (fully_shard) leaves the posteriors' tensors as DTensors outside the forward: the schedule's ranking
    failed on them with torch's "Cannot flatten unevenly sharded tensor" (two ranks), greedy_ / save with "mixed
    torch.Tensor and DTensor". Every entry point that reads them names the layer and the way out instead."""
    fsdp = pytest.importorskip("torch.distributed.fsdp")
    model = _model()
    made_before = sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=4)
    fsdp.fully_shard(model)
    path = tmp_path / "model.sqs"
    calls = {
        "PruningSchedule made before": lambda: made_before.step(1),
        "Objective": lambda: sqs.Objective(model, num_data=10),
        "PruningSchedule": lambda: sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=4),
        "greedy_": lambda: sqs.greedy_(model, nonzero=0.5),
        "BayesianAverage": lambda: sqs.BayesianAverage(model, samples=2),
        "save": lambda: sqs.save(model, path, nonzero=0.5),
    }
    for what, call in calls.items():
        with pytest.raises(ValueError, match=rf"layer '0' holds .* {SHARDED}"):
            call()
        assert not path.exists(), what


def test_a_sharded_plain_model_is_refused_by_prepare(one_rank_group):
    fsdp = pytest.importorskip("torch.distributed.fsdp")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 5))
    fsdp.fully_shard(model)
    with pytest.raises(ValueError, match=rf"layer '0' has its weight {SHARDED}"):
        sqs.prepare_(model, sqs.SQSConfig(num_components=4))
    assert not sqs.sqs_layers(model)
