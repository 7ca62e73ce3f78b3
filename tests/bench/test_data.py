"""The CIFAR reader (real and fake files), the missing-file errors, the split, augmentation and batching."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_fake_cifar
from sqs_bench.data import (
    CIFAR10_URL,
    DataNotFoundError,
    augment,
    iterate_batches,
    load_cifar10,
    load_splits,
    normalize,
    resolve_data_dir,
    train_val_split,
)


@pytest.mark.data
def test_real_files_read_as_documented(data_dir):
    train_x, train_y = load_cifar10(data_dir, train=True)
    test_x, test_y = load_cifar10(data_dir, train=False)
    assert train_x.shape == (5085, 3, 32, 32) and test_x.shape == (1017, 3, 32, 32)
    assert train_x.dtype == torch.uint8 and train_y.dtype == torch.int64
    assert set(train_y.tolist()) == set(range(10)) and set(test_y.tolist()) == set(range(10))
    with (data_dir / "cifar-10-batches-py" / "test_batch").open("rb") as f:
        raw = pickle.load(f, encoding="latin1")
    assert torch.equal(test_x[5].flatten(), torch.as_tensor(raw["data"][5]))
    assert test_y[:20].tolist() == raw["labels"][:20]


def test_fake_files_round_trip(tmp_path):
    written = write_fake_cifar(tmp_path, per_batch=7, test=9)
    train_x, _ = load_cifar10(tmp_path, train=True)
    test_x, test_y = load_cifar10(tmp_path, train=False)
    assert train_x.shape == (35, 3, 32, 32) and test_x.shape == (9, 3, 32, 32)
    first = torch.as_tensor(written["data_batch_1"]["data"][0])
    assert torch.equal(train_x[0, 0].flatten(), first[:1024])  # red plane first, row-major
    assert torch.equal(train_x[0, 2].flatten(), first[2048:])
    assert torch.equal(train_x[7].flatten(), torch.as_tensor(written["data_batch_2"]["data"][0]))
    assert test_y.tolist() == written["test_batch"]["labels"]


def test_missing_file_names_it_and_where_to_get_it(tmp_path):
    write_fake_cifar(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DataNotFoundError) as err:
        load_cifar10(tmp_path, train=True)
    assert "data_batch_3" in str(err.value) and CIFAR10_URL in str(err.value)
    load_cifar10(tmp_path, train=False)  # the test batch alone still loads


def test_data_dir_from_argument_then_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SQS_DATA_DIR", str(tmp_path))
    assert resolve_data_dir() == tmp_path
    assert resolve_data_dir(tmp_path / ".") == tmp_path / "."
    monkeypatch.delenv("SQS_DATA_DIR")
    with pytest.raises(DataNotFoundError, match="SQS_DATA_DIR"):
        resolve_data_dir()
    with pytest.raises(DataNotFoundError, match="does not exist"):
        resolve_data_dir(tmp_path / "absent")


def test_split_is_seeded_stratified_and_disjoint():
    labels = torch.arange(500) % 10
    train, val = train_val_split(labels, 0.1, seed=3)
    again_train, again_val = train_val_split(labels, 0.1, seed=3)
    assert torch.equal(train, again_train) and torch.equal(val, again_val)
    assert not torch.equal(val, train_val_split(labels, 0.1, seed=4)[1])
    assert sorted(torch.cat([train, val]).tolist()) == list(range(500))
    assert torch.bincount(labels[val]).tolist() == [5] * 10


def test_load_splits_keeps_test_apart(fake_data_dir):
    splits = load_splits(fake_data_dir, val_fraction=0.2, seed=0)
    assert splits.train_x.shape[0] + splits.val_x.shape[0] == 100
    assert splits.val_x.shape[0] == 20 and splits.test_x.shape[0] == 30
    assert splits.subset(test=5).test_x.shape[0] == 5


def test_augment_is_a_seeded_crop_and_flip():
    images = torch.full((16, 3, 32, 32), 200, dtype=torch.uint8)
    out = augment(images, torch.Generator().manual_seed(0))
    assert out.shape == images.shape and out.dtype == torch.uint8
    assert torch.equal(out, augment(images, torch.Generator().manual_seed(0)))
    assert set(out.unique().tolist()) <= {0, 200}
    # the visible part of the image is a rectangle of at least 28 x 28 pixels
    visible = (out[:, 0] > 0).sum(dim=(1, 2))
    assert (visible >= 28 * 28).all()
    ramp = torch.arange(32, dtype=torch.uint8).expand(4, 3, 32, 32).contiguous()
    flipped_or_not = augment(ramp, torch.Generator().manual_seed(1), padding=0)
    for img, orig in zip(flipped_or_not, ramp, strict=True):
        assert torch.equal(img, orig) or torch.equal(img, orig.flip(-1))


def test_batches_cover_every_image_once_and_normalize():
    images = torch.zeros(10, 3, 32, 32, dtype=torch.uint8)
    labels = torch.arange(10)
    seen = []
    for x, y in iterate_batches(images, labels, 4, generator=torch.Generator().manual_seed(0), shuffle=True):
        assert x.dtype == torch.float32
        seen += y.tolist()
    assert sorted(seen) == list(range(10))
    expected = torch.tensor([-0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225])
    torch.testing.assert_close(normalize(images[:1])[0, :, 0, 0], expected)
    with pytest.raises(ValueError, match="Generator"):
        next(iterate_batches(images, labels, 4, shuffle=True))


def _rewrite_test_batch(root: Path, **changes) -> Path:
    """The fake test_batch under ``root`` with ``changes`` to its dict (numpy arrays, lists)."""
    path = root / "cifar-10-batches-py" / "test_batch"
    with path.open("rb") as f:
        batch = pickle.load(f)
    with path.open("wb") as f:
        pickle.dump(batch | changes, f)
    return path


BAD_BATCHES = {
    # float images in [0, 1] became all zeros with dtype=torch.uint8; int64 pixels > 255 wrapped
    "float pixels": (lambda b: {"data": b["data"].astype(np.float32) / 255}, "uint8 pixels.*float32"),
    "pixels above 255": (lambda b: {"data": b["data"].astype(np.int64) + 300}, r"0\.\.255, found 300\.\."),
    "label 10": (lambda b: {"labels": [10, *b["labels"][1:]]}, r"labels must lie in 0\.\.9, found 0\.\.10"),
    "negative label": (lambda b: {"labels": [-1, *b["labels"][1:]]}, r"0\.\.9, found -1\.\."),
    "2-D labels": (lambda b: {"labels": np.asarray(b["labels"])[:, None]}, r"shape \(30, 1\)"),
    "string labels": (lambda b: {"labels": [str(v) for v in b["labels"]]}, "labels must be integers"),
    "no images": (lambda b: {"data": b["data"][:0], "labels": []}, "holds no images"),
    "wrong row length": (lambda b: {"data": b["data"][:, :1024]}, r"shape \(N, 3072\)"),
    "fewer labels": (lambda b: {"labels": b["labels"][:-1]}, "30 images but 29 labels"),
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_a_batch_of_the_wrong_type_or_range_is_refused_naming_the_file(tmp_path, case):
    written = write_fake_cifar(tmp_path)
    change, what = BAD_BATCHES[case]
    path = _rewrite_test_batch(tmp_path, **change(written["test_batch"]))
    with pytest.raises(DataNotFoundError, match=what) as err:
        load_cifar10(tmp_path, train=False)
    assert str(path) in str(err.value)


def test_integer_pixels_within_0_255_of_another_dtype_are_read_exactly(tmp_path):
    written = write_fake_cifar(tmp_path)
    _rewrite_test_batch(tmp_path, data=written["test_batch"]["data"].astype(np.int64))
    images, labels = load_cifar10(tmp_path, train=False)
    assert images.dtype == torch.uint8 and labels.dtype == torch.int64
    assert torch.equal(images.flatten(1), torch.as_tensor(written["test_batch"]["data"]))
