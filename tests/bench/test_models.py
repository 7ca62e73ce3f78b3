"""The CIFAR ResNets: shapes, sizes, option-A shortcuts, and the real checkpoints' accuracy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import write_fake_checkpoint
from sqs_bench.data import DataNotFoundError, load_cifar10
from sqs_bench.models import BasicBlock, build_model, checkpoint_path, load_pretrained
from sqs_bench.train import predict

# He et al. (2016), Table 6: 0.27M / 0.46M / 0.85M parameters.
PARAMS_M = {"resnet20": 0.27, "resnet32": 0.46, "resnet56": 0.85}
# shared/data/README.md: measured top-1 on the 1,017 test images of the subset.
README_ACCURACY = {"resnet20": 91.64, "resnet32": 92.82, "resnet56": 92.72}


@pytest.mark.parametrize("name", sorted(PARAMS_M))
def test_shapes_and_sizes(name):
    model = build_model(name).eval()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 2) == PARAMS_M[name]


def test_option_a_shortcut_subsamples_and_zero_pads_both_sides():
    block = BasicBlock(16, 32, stride=2)
    x = torch.randn(1, 16, 8, 8)
    short = block.shortcut(x)
    assert short.shape == (1, 32, 4, 4)
    assert torch.equal(short[:, 8:24], x[:, :, ::2, ::2])
    assert short[:, :8].abs().sum() == 0 and short[:, 24:].abs().sum() == 0
    assert block(x).shape == (1, 32, 4, 4)


def test_unknown_model_and_missing_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="resnet20"):
        build_model("resnet18")
    with pytest.raises(DataNotFoundError, match="resnet32-"):
        load_pretrained("resnet32", tmp_path)


def test_fake_checkpoint_loads_strictly(fake_data_dir):
    model = load_pretrained("resnet20", fake_data_dir)
    assert not model.training


@pytest.mark.data
@pytest.mark.parametrize("name", sorted(README_ACCURACY))
def test_checkpoint_reproduces_measured_accuracy(data_dir, name):
    images, labels = load_cifar10(data_dir, train=False)
    model = load_pretrained(name, data_dir)
    correct = (predict(model, images) == labels).sum().item()
    assert abs(100 * correct / labels.numel() - README_ACCURACY[name]) <= 0.1, f"{name}: {correct}/1017"


def _damaged(root: Path, damage) -> Path:
    """A fake ResNet-20 checkpoint under ``root``, then ``damage(path, state)`` applied to it."""
    path = write_fake_checkpoint(root)
    damage(path, torch.load(path, weights_only=True)["state_dict"])
    return path


def _shape(path, state):
    state["module.linear.weight"] = torch.zeros(100, 64)
    torch.save({"state_dict": state}, path)


DAMAGES = {
    "truncated": (lambda path, state: path.write_bytes(path.read_bytes()[:1000]), "not a readable torch file"),
    "empty": (lambda path, state: path.write_bytes(b""), "not a readable torch file"),
    "a list": (lambda path, state: torch.save([1, 2, 3], path), "holds a list, not a state dict"),
    "a tensor": (lambda path, state: torch.save(torch.zeros(3), path), "holds a Tensor, not a state dict"),
    "a missing key": (
        lambda path, state: torch.save(
            {"state_dict": {k: v for k, v in state.items() if "linear.bias" not in k}}, path
        ),
        r"does not fit CifarResNet.*linear\.bias",
    ),
    "an extra key": (
        lambda path, state: torch.save({"state_dict": {**state, "module.extra": torch.zeros(1)}}, path),
        "does not fit CifarResNet.*extra",
    ),
    "a wrong shape": (_shape, r"does not fit CifarResNet.*linear\.weight"),
}


@pytest.mark.parametrize("case", sorted(DAMAGES))
def test_a_damaged_checkpoint_is_a_data_error_naming_the_file(tmp_path, case):
    damage, what = DAMAGES[case]
    path = _damaged(tmp_path, damage)
    with pytest.raises(DataNotFoundError, match=what) as err:
        load_pretrained("resnet20", tmp_path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_another_architectures_checkpoint_under_the_name_is_a_data_error(tmp_path):
    path = write_fake_checkpoint(tmp_path, "resnet32")
    path.rename(path.with_name("resnet20-00000000.th"))
    with pytest.raises(DataNotFoundError, match=r"resnet20-00000000\.th does not fit CifarResNet"):
        load_pretrained("resnet20", tmp_path)


def test_two_matching_checkpoints_are_refused_naming_both(tmp_path):
    """sorted(glob)[0] picked the first silently: a stray older file changed every result."""
    path = write_fake_checkpoint(tmp_path)
    shutil.copy(path, path.with_name("resnet20-0-older.th"))
    with pytest.raises(DataNotFoundError, match="2 checkpoints match") as err:
        checkpoint_path("resnet20", tmp_path)
    assert "resnet20-00000000.th" in str(err.value) and "resnet20-0-older.th" in str(err.value)
