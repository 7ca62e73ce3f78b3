"""CIFAR-10 in the official python-pickle layout, read without torchvision.

The data directory comes from an explicit argument, else the ``SQS_DATA_DIR`` environment variable. It holds
``cifar-10-batches-py/`` (``data_batch_1`` … ``data_batch_5``, ``test_batch``) as unpacked from the official
"CIFAR-10 python version" archive. Images are kept as uint8 NCHW tensors; :func:`normalize` turns a batch
into the float input the pretrained models expect, and :func:`augment` is the standard CIFAR augmentation
(random 32×32 crop of the 4-pixel zero-padded image, random horizontal flip) driven by a ``torch.Generator``.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "CIFAR10_DIR",
    "CIFAR10_URL",
    "FULL_SIZES",
    "MEAN",
    "NUM_CLASSES",
    "STD",
    "CifarSplits",
    "DataNotFoundError",
    "augment",
    "fingerprint",
    "iterate_batches",
    "load_cifar10",
    "load_splits",
    "normalize",
    "resolve_data_dir",
    "train_val_split",
]

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
# dataset -> (folder, training files, test file, label key); both from the official python versions
_LAYOUTS = {
    "cifar10": (CIFAR10_DIR, tuple(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "labels"),
    "cifar100": ("cifar-100-python", ("train",), "test", "fine_labels"),
}
NUM_CLASSES = {"cifar10": 10, "cifar100": 100}
FULL_SIZES = {"cifar10": (50_000, 10_000), "cifar100": (50_000, 10_000)}
"""(train, test) image counts of the complete datasets."""
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
_ENV = "SQS_DATA_DIR"


class DataNotFoundError(FileNotFoundError):
    """A data file or folder the benchmark needs is missing or unreadable; the message says which and where to
    get it."""


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """``data_dir`` if given, else ``$SQS_DATA_DIR``; :class:`DataNotFoundError` if it is not a folder."""
    raw = data_dir if data_dir is not None else os.environ.get(_ENV)
    if raw is None or str(raw) == "":
        raise DataNotFoundError(
            f"no data directory: pass --data-dir or set {_ENV} to the folder holding {CIFAR10_DIR}/ "
            f"(the CIFAR-10 python version from {CIFAR10_URL}, unpacked)"
        )
    path = Path(raw).expanduser()
    if not path.is_dir():
        state = "is not a folder" if path.exists() else "does not exist"
        raise DataNotFoundError(f"data directory {path} {state} (from {'argument' if data_dir else _ENV})")
    return path


def _read_batch(path: Path, label_key: str = "labels", num_classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """One pickled batch -> (uint8 images (N, 3, 32, 32), int64 labels (N,)) in ``[0, num_classes)``."""
    if not path.is_file():
        raise DataNotFoundError(
            f"missing CIFAR file {path}: download the CIFAR python version from {CIFAR10_URL} "
            f"and unpack it so that {path.parent.name}/{path.name} exists"
        )
    try:
        with path.open("rb") as f:
            batch = pickle.load(f, encoding="latin1")
        raw_data, raw_labels = np.asarray(batch["data"]), np.asarray(batch[label_key])
    # a truncated or corrupted pickle raises almost anything (UnpicklingError, EOFError, KeyError, ...)
    except Exception as err:
        raise DataNotFoundError(
            f"CIFAR file {path} is corrupted or truncated ({type(err).__name__}: {str(err)[:200]}); download the CIFAR "
            f"python version again from {CIFAR10_URL} and unpack it so that {path.parent.name}/{path.name} exists"
        ) from err
    problem = _pixel_problem(raw_data) or _label_problem(raw_labels, num_classes)
    if problem is None and raw_data.shape[0] != raw_labels.shape[0]:
        problem = f"{raw_data.shape[0]} images but {raw_labels.shape[0]} labels"
    if problem is not None:
        raise DataNotFoundError(
            f"CIFAR file {path} is not in the official python layout: {problem}; download the CIFAR python "
            f"version again from {CIFAR10_URL}"
        )
    data = torch.from_numpy(raw_data.astype(np.uint8))  # (N, 3072), channel-major rows
    return data.reshape(-1, 3, 32, 32), torch.from_numpy(raw_labels.astype(np.int64))


def _pixel_problem(data: np.ndarray) -> str | None:
    """What is wrong with a batch's ``data`` array (uint8, or integers in 0..255, shape (N > 0, 3072)), or None."""
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        return f"'data' must have shape (N, 3072), got {data.shape}"
    if data.shape[0] == 0:
        return "it holds no images"
    if data.dtype == np.uint8:
        return None
    if data.dtype.kind not in "iu":
        return f"'data' must hold uint8 pixels (0..255), got dtype {data.dtype} (a cast would truncate or wrap them)"
    low, high = int(data.min()), int(data.max())
    return None if low >= 0 and high <= 255 else f"pixels must lie in 0..255, found {low}..{high}"


def _label_problem(labels: np.ndarray, num_classes: int) -> str | None:
    """What is wrong with a batch's labels (1-D integers in ``[0, num_classes)``), or None."""
    if labels.ndim != 1:
        return f"labels must be a list of class indices, got shape {labels.shape}"
    if labels.dtype.kind not in "iu":
        return f"labels must be integers, got dtype {labels.dtype}"
    if labels.size and not (int(labels.min()) >= 0 and int(labels.max()) < num_classes):
        return f"labels must lie in 0..{num_classes - 1}, found {int(labels.min())}..{int(labels.max())}"
    return None


def load_cifar10(
    data_dir: str | Path | None = None, *, train: bool, dataset: str = "cifar10"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The training (``data_batch_1..5``) or test (``test_batch``) images and labels.

    ``dataset="cifar100"`` reads ``cifar-100-python/{train,test}`` (fine labels) instead.
    """
    if dataset not in _LAYOUTS:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {sorted(_LAYOUTS)}")
    folder_name, train_files, test_file, label_key = _LAYOUTS[dataset]
    folder = resolve_data_dir(data_dir) / folder_name
    names = train_files if train else (test_file,)
    parts = [_read_batch(folder / name, label_key, NUM_CLASSES[dataset]) for name in names]
    images = torch.cat([p[0] for p in parts])
    labels = torch.cat([p[1] for p in parts])
    return images.contiguous(), labels


def train_val_split(labels: torch.Tensor, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic class-stratified split of indices into (train, validation), seeded."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    generator = torch.Generator().manual_seed(seed)
    train_parts, val_parts = [], []
    for cls in torch.unique(labels).tolist():
        idx = torch.nonzero(labels == cls).flatten()
        idx = idx[torch.randperm(idx.numel(), generator=generator)]
        n_val = round(val_fraction * idx.numel())
        val_parts.append(idx[:n_val])
        train_parts.append(idx[n_val:])
    return torch.sort(torch.cat(train_parts)).values, torch.sort(torch.cat(val_parts)).values


@dataclass(frozen=True)
class CifarSplits:
    """uint8 images (N, 3, 32, 32) and int64 labels for train / validation / test."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    def subset(self, *, train: int | None = None, val: int | None = None, test: int | None = None) -> CifarSplits:
        """The first ``train`` / ``val`` / ``test`` images of each split (None keeps all)."""
        return CifarSplits(
            self.train_x[:train],
            self.train_y[:train],
            self.val_x[:val],
            self.val_y[:val],
            self.test_x[:test],
            self.test_y[:test],
        )


def load_splits(
    data_dir: str | Path | None = None, *, val_fraction: float = 0.1, seed: int = 0, dataset: str = "cifar10"
) -> CifarSplits:
    """Training images split into train/validation (for model selection) plus the untouched test set."""
    images, labels = load_cifar10(data_dir, train=True, dataset=dataset)
    train_idx, val_idx = train_val_split(labels, val_fraction, seed)
    test_x, test_y = load_cifar10(data_dir, train=False, dataset=dataset)
    return CifarSplits(images[train_idx], labels[train_idx], images[val_idx], labels[val_idx], test_x, test_y)


def fingerprint(splits: CifarSplits) -> dict[str, Any]:
    """What a run was computed on: the split sizes, the sha256 of the test labels and the sha256 of every
    split's images and labels (recorded in each result, compared by ``--resume``)."""
    every = hashlib.sha256()
    for tensor in (splits.train_x, splits.train_y, splits.val_x, splits.val_y, splits.test_x, splits.test_y):
        every.update(tensor.contiguous().numpy().tobytes())
    return {
        "sha256": every.hexdigest(),
        "test_labels_sha256": hashlib.sha256(splits.test_y.contiguous().numpy().tobytes()).hexdigest(),
        "train": int(splits.train_y.numel()),
        "val": int(splits.val_y.numel()),
        "test": int(splits.test_y.numel()),
    }


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 (N, 3, H, W) -> float32 scaled to [0, 1] and standardised with :data:`MEAN`, :data:`STD`."""
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    return (images.float() / 255.0 - mean) / std


def augment(images: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Random crop of the zero-padded image (same size as the input) and random horizontal flip."""
    n, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (padding, padding, padding, padding))  # (N, C, H+2p, W+2p)
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    rows = (dy[:, None] + torch.arange(h))[:, None, :, None]  # (N, 1, H, 1)
    cols = (dx[:, None] + torch.arange(w))[:, None, None, :]  # (N, 1, 1, W)
    batch = torch.arange(n)[:, None, None, None]
    channels = torch.arange(images.shape[1])[None, :, None, None]
    cropped = padded[batch, channels, rows, cols]  # (N, C, H, W)
    flip = torch.rand(n, generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], cropped.flip(-1), cropped)


def iterate_batches(
    images: torch.Tensor,
    labels: torch.Tensor,
    batch_size: int,
    *,
    generator: torch.Generator | None = None,
    shuffle: bool = False,
    augmentation: bool = False,
    drop_last: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield normalized float batches ``(x, y)``; shuffling and augmentation draw from ``generator``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if (shuffle or augmentation) and generator is None:
        raise ValueError("shuffle/augmentation need a torch.Generator for reproducibility")
    n = images.shape[0]
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        idx = order[start : start + batch_size]
        x = images[idx]
        if augmentation:
            x = augment(x, generator)  # type: ignore[arg-type]
        yield normalize(x), labels[idx]
