"""Loading a posterior whose window count or pinned rows differ from the model's.

With ``outlier`` windows, W (the number of windows, each with its own K components) depends on the weights
``prepare_`` saw: a model built afresh (its own random init) and prepared with the checkpoint's config may get
W = 2 where the checkpoint's posterior has W = 4. Every tensor of q is in the state dict (θ, window ids, and the
(W, K) μ, log σ, mixing logits), so the model takes the checkpoint's W before the copy; a checkpoint without
the window ids, or with another K, is reported in load_state_dict's error instead of a bare size mismatch.

The same holds for the pinned rows (an embedding's padding row, pinned pruned where ``prepare_`` found it zero):
since session 63 they are the posterior's ``_extra_state``, which the model takes; a checkpoint saved before
holds none, and the model keeps its own.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import torch
from torch import nn

log = logging.getLogger(__name__)

_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)

__all__ = ["PER_WINDOW", "take_pinned_rows", "take_window_count"]

PER_WINDOW = ("means", "log_stds", "mixing_logits", "window_edges")  # (W, K) each, and the W − 1 interior edges


def take_window_count(
    posterior: nn.Module, state_dict: dict[str, Any], prefix: str, _metadata: Any, _strict: bool, *rest: Any
) -> None:
    """load_state_dict's pre-hook: resize the per-window tensors to the checkpoint's W (values come by the copy
    that follows; a Parameter keeps its identity, so an optimizer built before the load still holds it)."""
    error_msgs: list[str] = rest[-1]
    loaded = state_dict.get(f"{prefix}means")
    own = cast(torch.Tensor, posterior.means)
    if not isinstance(loaded, torch.Tensor) or loaded.dim() != 2 or loaded.shape == own.shape:
        return
    where = f"layer {prefix.removesuffix('posterior.').rstrip('.')!r}"
    if loaded.shape[1] != own.shape[1]:
        error_msgs.append(
            f"{where} has K = {loaded.shape[1]} components in the checkpoint and {own.shape[1]} in this model: "
            "prepare the model with the checkpoint's num_components (and its per-layer overrides)"
        )
        return
    if f"{prefix}window_ids" not in state_dict:
        error_msgs.append(
            f"{where} has {loaded.shape[0]} windows in the checkpoint and {own.shape[0]} in this model, and the "
            "checkpoint holds no window_ids to say which weight is in which: load a whole state_dict"
        )
        return
    before = own.shape[0]  # own is resized below
    for name in PER_WINDOW:
        tensor: torch.Tensor = getattr(posterior, name)
        incoming = state_dict.get(f"{prefix}{name}")
        if not isinstance(incoming, torch.Tensor) or incoming.shape[1:] != tensor.shape[1:]:
            continue  # missing, or K differs: load_state_dict reports it
        fresh = torch.empty(incoming.shape, dtype=tensor.dtype, device=tensor.device)
        if isinstance(tensor, nn.Parameter):
            tensor.data = fresh
        else:
            setattr(posterior, name, fresh)
    log.info("%s: %d windows in this model, the checkpoint's %d taken", where, before, loaded.shape[0])


def take_pinned_rows(
    posterior: nn.Module, state_dict: dict[str, Any], prefix: str, _metadata: Any, _strict: bool, *rest: Any
) -> None:
    """load_state_dict's pre-hook: where the state holds no pinned rows (a checkpoint saved before they were, or a
    tie's alias that transformers' save_pretrained left out) the posterior keeps the rows it has (None: not a
    missing key under strict loading, and a tie's second layer does not undo what its first loaded); rows that
    are not a 1-D integer tensor of rows of θ are reported in load_state_dict's error (the posterior's kept).
    ``state_dict`` is load_state_dict's own copy."""
    key, error_msgs = f"{prefix}_extra_state", rest[-1]
    if key not in state_dict:
        state_dict[key] = None
        return
    rows = state_dict[key]
    size = cast(torch.Tensor, posterior.weight).shape[0]
    valid = isinstance(rows, torch.Tensor) and rows.dim() == 1 and rows.dtype in _INTEGER_DTYPES
    if not valid or bool(((rows < 0) | (rows >= size)).any()):
        shown = rows.tolist() if isinstance(rows, torch.Tensor) else type(rows).__name__
        error_msgs.append(f"{key!r} must be a 1-D integer tensor of rows in [0, {size}) to pin pruned, got {shown!r}")
        state_dict[key] = None
