"""Fixtures of the bench tests: a fake CIFAR-10 folder (official pickle layout) with a fake checkpoint,
and tiny splits/models for the baselines. The real data come from the shared ``data_dir`` fixture."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from sqs_bench.data import CifarSplits
from sqs_bench.models import CifarResNet, build_model


def write_fake_cifar(root: Path, *, per_batch: int = 20, test: int = 30, seed: int = 0) -> dict[str, dict]:
    """Write ``cifar-10-batches-py/`` with random images; returns what was written, by file name."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    written = {}
    names = [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", test)]
    for offset, (name, n) in enumerate(names):
        data = torch.randint(0, 256, (n, 3072), generator=generator, dtype=torch.uint8).numpy()
        labels = [(i + offset) % 10 for i in range(n)]
        batch = {
            "batch_label": name,
            "labels": labels,
            "data": data,
            "filenames": [f"{i}.png" for i in range(n)],
        }
        with (folder / name).open("wb") as f:
            pickle.dump(batch, f)
        written[name] = batch
    return written


def write_fake_checkpoint(root: Path, name: str = "resnet20", seed: int = 0) -> Path:
    """A randomly initialised ``name`` saved like the real checkpoints (``module.`` keys, no BN counters)."""
    torch.manual_seed(seed)
    state = {
        f"module.{k}": v for k, v in build_model(name).state_dict().items() if not k.endswith("num_batches_tracked")
    }
    folder = root / "resnet-cifar10"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-00000000.th"
    torch.save({"state_dict": state, "best_prec1": 0.0}, path)
    return path


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Bench tests run single-threaded: on a shared 2-core machine OpenMP spin-waits made them ~9x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def fake_data_dir(tmp_path_factory) -> Path:
    """A data directory with a fake CIFAR-10 (100 train / 30 test images) and a fake ResNet-20 checkpoint."""
    root = tmp_path_factory.mktemp("fake_data")
    write_fake_cifar(root)
    write_fake_checkpoint(root)
    return root


@pytest.fixture
def tiny_splits() -> CifarSplits:
    """Random uint8 images: 64 train, 16 validation, 32 test."""
    g = torch.Generator().manual_seed(1)

    def images(n: int) -> torch.Tensor:
        return torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)

    def labels(n: int) -> torch.Tensor:
        return torch.randint(0, 10, (n,), generator=g)

    return CifarSplits(images(64), labels(64), images(16), labels(16), images(32), labels(32))


@pytest.fixture
def tiny_model() -> CifarResNet:
    """A randomly initialised ResNet-8 (one block per stage) in eval mode."""
    torch.manual_seed(0)
    return CifarResNet(1).eval()
