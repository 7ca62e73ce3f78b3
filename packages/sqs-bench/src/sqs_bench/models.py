"""CIFAR ResNet-20/32/56 (He et al. 2016, Section 4.2) and the pretrained checkpoints found here.

The network: a 3×3 stem conv (16 channels), three stages of ``n`` basic blocks with 16/32/64 channels
(n = 3/5/9 for depth 6n + 2 = 20/32/56), global average pooling and a ``Linear(64, 10)`` classifier.
Shortcuts are "option A": parameter-free identities; where a block halves the resolution and doubles the
channels, the shortcut subsamples with stride 2 and zero-pads the new channels, split evenly before and after
the existing ones (the layout the checkpoints were trained with).

Parameter names (``conv1``, ``bn1``, ``layer{1,2,3}.{i}.{conv1,bn1,conv2,bn2}``, ``linear``) match the
checkpoints' state dicts once their ``module.`` prefix is stripped, so :func:`load_pretrained` loads strictly.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from sqs_bench.data import DataNotFoundError, resolve_data_dir

__all__ = [
    "CHECKPOINT_DIR",
    "DEPTHS",
    "BasicBlock",
    "CifarResNet",
    "build_model",
    "checkpoint_file",
    "checkpoint_path",
    "file_sha256",
    "load_model",
    "load_pretrained",
    "load_timm",
    "require_timm",
]

logger = logging.getLogger(__name__)

DEPTHS = {"resnet20": 3, "resnet32": 5, "resnet56": 9}
"""Blocks per stage for each supported model name."""

CHECKPOINT_DIR = "resnet-cifar10"
_CHECKPOINT_SOURCE = (
    "the pretrained CIFAR-10 ResNets of akamaster/pytorch_resnet_cifar10 "
    "(https://github.com/akamaster/pytorch_resnet_cifar10, release files resnet20-12fca82f.th, "
    "resnet32-d509ac18.th, resnet56-4bfd9763.th)"
)


class BasicBlock(nn.Module):
    """Two 3×3 conv + batch-norm layers with an option-A (parameter-free) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.stride = stride
        self.extra_channels = out_channels - in_channels

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        """Identity, or stride-2 subsampling with the new channels zero-padded on both sides."""
        if self.stride == 1 and self.extra_channels == 0:
            return x
        x = x[:, :, :: self.stride, :: self.stride]
        before = self.extra_channels // 2
        return F.pad(x, (0, 0, 0, 0, before, self.extra_channels - before))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for 32×32 inputs: ``blocks_per_stage`` = n."""

    def __init__(self, blocks_per_stage: int, num_classes: int = 10) -> None:
        super().__init__()
        if blocks_per_stage < 1:
            raise ValueError(f"blocks_per_stage must be >= 1, got {blocks_per_stage}")
        self.conv1 = nn.Conv2d(3, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = self._stage(16, 16, blocks_per_stage, stride=1)
        self.layer2 = self._stage(16, 32, blocks_per_stage, stride=2)
        self.layer3 = self._stage(32, 64, blocks_per_stage, stride=2)
        self.linear = nn.Linear(64, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d | nn.Linear):
                nn.init.kaiming_normal_(module.weight)

    @staticmethod
    def _stage(in_channels: int, out_channels: int, blocks: int, stride: int) -> nn.Sequential:
        layers = [BasicBlock(in_channels, out_channels, stride)]
        layers += [BasicBlock(out_channels, out_channels, 1) for _ in range(blocks - 1)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, 3, 32, 32), normalized
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)  # (N, 64)
        return self.linear(out)


def build_model(name: str, num_classes: int = 10) -> CifarResNet:
    """A randomly initialised ``resnet20`` / ``resnet32`` / ``resnet56``."""
    if name not in DEPTHS:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(DEPTHS)}")
    return CifarResNet(DEPTHS[name], num_classes=num_classes)


def checkpoint_path(name: str, data_dir: str | Path | None = None) -> Path:
    """The checkpoint ``<data_dir>/resnet-cifar10/<name>-*.th``; a clear error when it is missing, or when two
    files match (``sorted(glob)[0]`` silently picked one)."""
    if name not in DEPTHS:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(DEPTHS)}")
    folder = resolve_data_dir(data_dir) / CHECKPOINT_DIR
    found = sorted(folder.glob(f"{name}-*.th")) if folder.is_dir() else []
    if not found:
        raise DataNotFoundError(
            f"no checkpoint {folder / (name + '-*.th')}: download {_CHECKPOINT_SOURCE} into {folder}"
        )
    if len(found) > 1:
        raise DataNotFoundError(
            f"{len(found)} checkpoints match {folder / (name + '-*.th')}: {', '.join(p.name for p in found)}; "
            f"keep only the one to use (the release file of {_CHECKPOINT_SOURCE})"
        )
    return found[0]


def checkpoint_file(spec: str, data_dir: str | Path | None = None, *, checkpoint: str | None = None) -> Path:
    """The checkpoint file :func:`load_model` reads for ``spec`` (checked to exist)."""
    if not spec.startswith("timm:"):
        return checkpoint_path(spec, data_dir)
    if checkpoint is None:
        raise ValueError(f"model {spec!r} needs a 'checkpoint' (path under the data directory)")
    path = resolve_data_dir(data_dir) / checkpoint
    if not path.is_file():
        raise DataNotFoundError(
            f"no checkpoint {path}: the paper tier needs a CIFAR-100 pretrained timm {spec[5:]} state dict there"
        )
    return path


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes (recorded beside each result, compared by ``--resume``)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    """The state dict in ``path`` (``state_dict`` entry or the whole payload, ``module.`` prefixes removed); a
    DataNotFoundError naming the file when it is not a readable torch file or holds no state dict."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, empty or foreign files raise almost anything
        raise DataNotFoundError(
            f"checkpoint {path} is not a readable torch file ({type(err).__name__}: {_one_line(err)}); "
            "download it again"
        ) from err
    state = payload.get("state_dict", payload) if isinstance(payload, dict) else payload
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise DataNotFoundError(
            f"checkpoint {path} holds a {type(state).__name__}, not a state dict of tensors (nor one under "
            "'state_dict')"
        )
    return {key.removeprefix("module."): value for key, value in state.items()}


def _load_strict(model: nn.Module, path: Path) -> None:
    """Load ``path`` into ``model`` strictly; keys or shapes that do not fit are a DataNotFoundError naming it."""
    try:
        model.load_state_dict(_read_state(path), strict=True)
    except RuntimeError as err:
        raise DataNotFoundError(f"checkpoint {path} does not fit {type(model).__name__}: {_one_line(err)}") from err


def _one_line(err: Exception, limit: int = 300) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def load_pretrained(name: str, data_dir: str | Path | None = None) -> CifarResNet:
    """The pretrained CIFAR-10 ``name`` in eval mode, loaded strictly from its checkpoint."""
    path = checkpoint_path(name, data_dir)
    model = build_model(name)
    _load_strict(model, path)
    logger.info("loaded %s from %s", name, path)
    return model.eval()


def require_timm():
    """The timm module, or an ImportError saying how to get it (the paper tier's ResNet-18/50 need it)."""
    try:
        import timm
    except ImportError as err:
        raise ImportError(
            "the paper tier's CIFAR-100 ResNet-18/50 need timm (and torchvision): "
            "pip install 'sqs-bench[paper]' on a machine where torchvision matches your torch"
        ) from err
    return timm


def load_timm(arch: str, checkpoint: Path, *, num_classes: int, cifar_stem: bool = True) -> nn.Module:
    """A timm ``arch`` (e.g. ``resnet18``) with ``num_classes`` outputs, loaded strictly from ``checkpoint``.

    ``cifar_stem`` swaps the ImageNet stem for the usual CIFAR one (3×3 stride-1 conv, no max-pool) before
    loading, as CIFAR-trained timm ResNets use. Not exercised on this machine (no timm, no CIFAR-100).
    """
    timm = require_timm()
    if not checkpoint.is_file():
        raise DataNotFoundError(
            f"no checkpoint {checkpoint}: the paper tier needs a CIFAR-100 pretrained timm {arch} state dict there"
        )
    model = timm.create_model(arch, pretrained=False, num_classes=num_classes)
    if cifar_stem:
        model.conv1 = nn.Conv2d(3, model.conv1.out_channels, 3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    _load_strict(model, checkpoint)
    return model.eval()


def load_model(
    spec: str, data_dir: str | Path | None = None, *, checkpoint: str | None = None, num_classes: int = 10
) -> nn.Module:
    """``resnet20|32|56`` (pretrained CIFAR-10 checkpoints) or ``timm:<arch>`` with ``checkpoint`` (a path
    relative to the data directory)."""
    if spec.startswith("timm:"):
        path = checkpoint_file(spec, data_dir, checkpoint=checkpoint)
        return load_timm(spec.removeprefix("timm:"), path, num_classes=num_classes)
    return load_pretrained(spec, data_dir)
