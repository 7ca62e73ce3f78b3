"""sqs-core on timm's architectures (random initial weights, no download), as tests/vision/test_torchvision.py
does for torchvision's: prepare → two AdamW steps with the pruning schedule → greedy → save → load into a fresh
plain model (the same outputs, exactly) → Bayesian averaging. ``nox -s vision`` installs timm.

timm's weight-standardised convolutions (ResNetV2-BiT's StdConv2d, NFNet's ScaledStdConv2d) were refused before
session 56 (a subclass with its own forward); they now run that forward with the compressed weight substituted.
"""

from __future__ import annotations

import pytest
import sqs_core as sqs
import torch
from vision_round_trip import train_and_round_trip

timm = pytest.importorskip("timm", reason="nox -s vision installs timm")

ARCHITECTURES = [
    "resnet50d",
    "resnetv2_50x1_bit",  # StdConv2d
    "nf_resnet26",  # ScaledStdConv2d
    "mixnet_s",  # MixedConv2d
    "convnext_atto",
    "vit_tiny_patch16_224",
    "eva02_tiny_patch14_224",  # rotary embeddings, SwiGLU
    "levit_128s",
    "mobilevit_xxs",
    "poolformer_s12",
    "repvgg_a0",
    "ghostnet_100",
    "efficientvit_b0",
    "fastvit_t8",
    "tiny_vit_5m_224",
    "hgnetv2_b0",
    "mobilenetv4_conv_small",
    "edgenext_xx_small",
    "dla34",
]


def _make(name: str):
    try:  # the vision transformers take the input size as an argument
        return timm.create_model(name, pretrained=False, num_classes=10, img_size=64)
    except TypeError:
        return timm.create_model(name, pretrained=False, num_classes=10)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_architecture_compresses_and_round_trips(tmp_path, name):
    torch.manual_seed(0)
    train_and_round_trip(tmp_path, lambda: _make(name), side=64, config=sqs.SQSConfig(num_components=4))
