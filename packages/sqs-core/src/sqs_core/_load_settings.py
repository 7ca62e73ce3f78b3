"""The settings a posterior was trained under, kept in its state so that a load into a differently configured model
is said.

``load_state_dict`` refuses a checkpoint of another K (sqs_core._window_load), but a model prepared with another
temperature τ, prior, responsibility, likelihood, KL weight, ``train_weight`` or initial τ' took a checkpoint without
a word (before session 64): every tensor fits, and the resumed run then trains another objective (the KL of a
checkpoint under SpikeSlabPrior(0.5) was 1364 nats, 987 under a Gaussian prior), or computes another forward (τ), or
the gate temperature schedule rescales the loaded τ' from another τ'_0. Each posterior keeps these settings as a
``settings`` buffer (the JSON of them, uint8); a load compares the checkpoint's with the model's and logs a WARNING
naming the layer and each difference. The model keeps its own settings (the config it was prepared with is what it
computes with): changing the likelihood or the KL weight between runs may be intended, so it is not refused. A
checkpoint without them (saved before session 64, or a tie's alias left out of it) loads as before.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import torch
from torch import nn

from .config import SQSConfig

log = logging.getLogger("sqs_core.load")

__all__ = ["SETTINGS", "compare_settings", "settings_tensor"]

SETTINGS = ("temperature", "gate_temperature", "responsibility", "prior", "likelihood", "kl_weight", "train_weight")


def _settings(config: SQSConfig) -> dict[str, Any]:
    written = config.to_dict()
    return {name: written[name] for name in SETTINGS}


def settings_tensor(config: SQSConfig, device: torch.device | str = "cpu") -> torch.Tensor:
    """The layer config's :data:`SETTINGS` as JSON bytes (a 1-D uint8 tensor: state dicts and safetensors hold it)."""
    data = json.dumps(_settings(config), sort_keys=True).encode()
    return torch.tensor(list(data), dtype=torch.uint8, device=device)


def _decoded(tensor: Any) -> dict[str, Any] | None:
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.dim() != 1:
        return None
    try:
        found = json.loads(bytes(tensor.tolist()).decode())
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return found if isinstance(found, dict) else None


def compare_settings(
    posterior: nn.Module, state_dict: dict[str, Any], prefix: str, _metadata: Any, _strict: bool, *rest: Any
) -> None:
    """load_state_dict's pre-hook: a WARNING naming each setting where the checkpoint's ``settings`` differ from the
    model's; the model's own are kept (``state_dict``, load_state_dict's own copy, gets them). Settings that are not
    such JSON are reported in load_state_dict's error."""
    key, error_msgs = f"{prefix}settings", rest[-1]
    own: torch.Tensor = posterior.settings  # type: ignore[assignment]
    incoming = state_dict.get(key)
    state_dict[key] = own
    if incoming is None:
        return  # a checkpoint from before session 64, or a tie's alias left out of it
    theirs, ours = _decoded(incoming), _decoded(own)
    if theirs is None:
        error_msgs.append(f"{key!r} must be the JSON of a layer's SQS settings as a 1-D uint8 tensor")
        return
    assert ours is not None
    differ = [
        f"{name} {theirs.get(name)!r} in the checkpoint, {ours[name]!r} here"
        for name in SETTINGS
        if theirs.get(name) != ours[name]
    ]
    if differ:
        layer = prefix.removesuffix("posterior.").rstrip(".")
        log.warning(
            "layer %r was trained under other settings than this model's config: %s; this model's are used "
            "(prepare the model with the checkpoint's config to resume that run)",
            layer,
            "; ".join(differ),
        )
