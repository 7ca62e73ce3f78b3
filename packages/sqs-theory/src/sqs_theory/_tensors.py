"""Argument checks of the convergence study's torch inputs (data, generators, models); each raises
``ValueError`` naming the parameter and its value. Kept apart from :mod:`_validate`, which stays numpy-only
so that ``import sqs_theory`` does not import torch."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

__all__ = ["check_finite_result", "data", "generator", "inputs"]


def generator(name: str, value: Any) -> None:
    """A ``torch.Generator`` (every random function of the study takes one, so that its results reproduce)."""
    if not isinstance(value, torch.Generator):
        raise ValueError(f"{name} must be a torch.Generator, got {value!r:.80}")


def _tensor(name: str, value: Any, dtype: torch.dtype, shape: tuple[int | None, ...]) -> torch.Tensor:
    """A finite tensor of ``dtype`` whose shape matches ``shape`` (None: any size)."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype != dtype:
        raise ValueError(f"{name} must have the model's dtype {dtype}, got {value.dtype}")
    if value.ndim != len(shape) or any(want not in (None, got) for got, want in zip(value.shape, shape, strict=True)):
        wanted = "(" + ", ".join("*" if want is None else str(want) for want in shape) + ")"
        raise ValueError(f"{name} must have shape {wanted}, got {tuple(value.shape)}")
    bad = ~torch.isfinite(value)
    if bad.any():
        index = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(f"{name} must be finite, got {value[index].item()!r} at index {index}")
    return value


def _first_layer(model: nn.Module) -> tuple[int, torch.dtype]:
    """(inputs p, dtype) of the first layer of ``model`` (a plain ``p -> width -> 1`` MLP, the same prepared by
    sqs-core, or a wrapper of it such as ``sqs_core.BayesianAverage``)."""
    if isinstance(model, nn.Module):
        for module in model.modules():
            weight = getattr(module, "weight", None)
            inputs = getattr(module, "in_features", None)
            if isinstance(inputs, int) and isinstance(weight, torch.Tensor):
                return inputs, weight.dtype
    raise ValueError(f"model must be a p -> width -> 1 network of Linear layers, got {type(model).__name__}")


def inputs(model: nn.Module, x: Any, *, name: str = "x") -> int:
    """``x`` (n, p): finite, of the dtype of ``model`` (a ``p -> width -> 1`` MLP), n >= 1; returns n."""
    p, dtype = _first_layer(model)
    _tensor(name, x, dtype, (None, p))
    if x.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one row, got shape {tuple(x.shape)}")
    return int(x.shape[0])


def data(model: nn.Module, x: Any, y: Any) -> int:
    """Training data for ``model``: x (n, p) and y (n, 1), finite, of the model's dtype, n >= 1; returns n.
    (A y of shape (n,) broadcast against the (n, 1) prediction into an (n, n) residual: a wrong NLL.)"""
    n = inputs(model, x)
    _tensor("y", y, x.dtype, (n, 1))
    return n


def check_finite_result(where: str, what: str, value: float, **given: Any) -> float:
    """``value`` if finite; otherwise a ValueError naming the arguments that drove it out of range."""
    if not math.isfinite(value):
        arguments = ", ".join(f"{k}={v!r}" for k, v in given.items())
        raise ValueError(f"{what} is {value!r} at {arguments}: beyond the range of float32 (in {where})")
    return value
