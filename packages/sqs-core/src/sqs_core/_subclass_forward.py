"""Subclasses of a supported layer type that define their own ``forward``.

A scaled embedding (BART's, Gemma's: the lookup times √d), timm's weight-standardised ``StdConv2d``: the SQS layer
of such a module cannot compute the base type's functional form (F.embedding, F.conv2d), which would skip what the
subclass adds. It runs the subclass's own forward instead, with the compressed weight substituted
(sqs_core.layers.substituted_forward), as it does for nn.MultiheadAttention: the adapter is the registered one with
``weight_names`` giving its single parameter. (Before session 56 such layers were refused, naming
``register_layer_type``: BART, mBART, Pegasus and Gemma could not be prepared without excluding their embeddings.)
A forward set on the instance (accelerate's hooks patch modules so) stays refused.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from torch import nn

__all__ = ["defines_forward", "substituting"]


def defines_forward(module: nn.Module, registered: type) -> bool:
    """Whether a class between ``type(module)`` and the ``registered`` type defines ``forward``."""
    for cls in type(module).__mro__:
        if cls is registered or cls is nn.Module:
            return False
        if "forward" in vars(cls):
            return True
    return False


def _single(name: str, module: nn.Module) -> tuple[str, ...]:
    return (name,)


def substituting(adapter: Any) -> Any:
    """``adapter`` (a LayerAdapter) made to run the module's own forward with its one weight substituted."""
    names = functools.partial(_single, adapter.weight_name)  # a partial of a module-level function: it pickles
    return dataclasses.replace(adapter, forward=None, forward_no_bias=None, weight_names=names)
