"""sqs-core on torchvision's architectures (random initial weights, no download): prepare → two AdamW steps
with the pruning schedule → greedy → save → load into a fresh plain model (the same outputs, exactly) →
Bayesian averaging, on each.

Not part of ``nox -s tests``: torchvision needs torch 2.14.1 (a 5.5 GB CUDA build in the venv here), so
``nox -s vision`` runs these in an environment of their own. Session 56's sweep found torchvision's MNASNet
refusing every file (its loader reads the state version, which ``sqs.load`` did not pass).
"""

from __future__ import annotations

import pytest
import sqs_core as sqs
import torch
from vision_round_trip import train_and_round_trip

torchvision = pytest.importorskip("torchvision", reason="nox -s vision installs torch 2.14.1 with torchvision")

# (architecture, input side): the CNNs at 64 px; the ones whose size is fixed at their own
ARCHITECTURES = [
    ("resnet18", 64),
    ("resnext50_32x4d", 64),
    ("mobilenet_v3_small", 64),
    ("efficientnet_b0", 64),
    ("shufflenet_v2_x0_5", 64),
    ("squeezenet1_0", 64),
    ("mnasnet0_5", 64),
    ("regnet_y_400mf", 64),
    ("googlenet", 64),
    ("densenet121", 64),
    ("convnext_tiny", 64),
    ("inception_v3", 299),
    ("swin_t", 224),
    ("maxvit_t", 224),
    ("vit_b_16", 224),
]


def _make(name: str):
    extra = {"aux_logits": False, "init_weights": True} if name in ("googlenet", "inception_v3") else {}
    return torchvision.models.get_model(name, weights=None, num_classes=10, **extra)


@pytest.mark.parametrize(("name", "side"), ARCHITECTURES, ids=[name for name, _ in ARCHITECTURES])
def test_architecture_compresses_and_round_trips(tmp_path, name, side):
    torch.manual_seed(0)
    train_and_round_trip(tmp_path, lambda: _make(name), side, sqs.SQSConfig(num_components=4))
