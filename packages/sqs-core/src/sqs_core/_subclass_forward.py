"""Subclasses of a supported layer type that define their own ``forward``.

A scaled embedding (BART's, Gemma's: the lookup times √d), timm's weight-standardised ``StdConv2d``: the SQS layer
of such a module cannot compute the base type's functional form (F.embedding, F.conv2d), which would skip what the
subclass adds. It runs the subclass's own forward instead, with the compressed weight substituted
(sqs_core.layers.substituted_forward), as it does for nn.MultiheadAttention: the adapter is the registered one with
``weight_names`` giving its single parameter. (Before session 56 such layers were refused, naming
``register_layer_type``: BART, mBART, Pegasus and Gemma could not be prepared without excluding their embeddings.)
A forward set on the instance (accelerate's hooks patch modules so) stays refused. A method such a subclass
defines, which model code calls on the layer (ProphetNet's decoder calls its positional embedding's ``_forward``),
runs the same way: the SQS layer answers it with a call under the substituted weight (:class:`MethodCall`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from torch import nn

__all__ = ["NOT_DEFINED", "MethodCall", "call_substituted", "defined_below", "defines_forward", "substituting"]


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


NOT_DEFINED = object()


def defined_below(module: nn.Module, registered: type | None, name: str) -> Any:
    """The class attribute ``name`` as a class between ``type(module)`` and the ``registered`` type defines it
    (ProphetNet's positional embedding defines ``_forward``, which its decoder calls), else ``NOT_DEFINED``."""
    if registered is None:
        return NOT_DEFINED
    for cls in type(module).__mro__:
        if cls is registered or cls is nn.Module:
            return NOT_DEFINED
        if name in vars(cls):
            return vars(cls)[name]
    return NOT_DEFINED


class MethodCall(nn.Module):
    """A forward that calls ``module.<method>(...)`` (or reads the property ``module.<method>``), so that
    ``torch.func.functional_call`` runs that method with ``module``'s compressed weights substituted.

    An nn.RNN/LSTM/GRU computes with its cached ``_flat_weights``, which torch refreshes in forward only where it
    holds a reference to the weights it cached before; after ``model.to(...)``, ``.float()`` or ``.double()``
    (``RNNBase._apply``) it holds none for the compressed weights (``None`` on the prepared module), so its forward
    failed on a ``None`` weight. The cache is rebuilt here from the substituted weights before the call."""

    def __init__(self, module: nn.Module, method: str, *, read: bool = False) -> None:
        super().__init__()
        self.module = module
        self.method = method
        self.read = read

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self.module, nn.RNNBase):
            self.module._init_flat_weights()  # the substituted weights (class docstring)
        if self.method == "forward" and not self.read:
            return self.module(*args, **kwargs)  # its hooks run, as for a module substituted by functional_call
        found = getattr(self.module, self.method)
        return found if self.read else found(*args, **kwargs)


def call_substituted(base: nn.Module, method: str, read: bool, weights: dict, args: tuple, kwargs: dict) -> Any:
    """``base.<method>(*args, **kwargs)`` (or the property read) with ``weights`` (its parameters by name) substituted
    by ``torch.func.functional_call``; while ``torch.jit.trace`` runs, which functional_call refuses ("The stateless API
    can't be used with Jitted modules": a fixed LSTM or attention did not trace), set on ``base`` for the call and
    restored after it (the trace records them as constants: a fixed model's weights).

    An nn.RNN/LSTM/GRU's ``_flat_weights`` cache is reset after the call: it held the substituted weights, graph
    nodes of the training forward, so ``copy.deepcopy(model)`` failed after it ("Only Tensors created explicitly by
    the user ... support the deepcopy protocol"; before session 64) and the cache kept that graph alive."""
    call = MethodCall(base, method, read=read)
    try:
        if not torch.jit.is_tracing():
            return torch.func.functional_call(call, {f"module.{k}": w for k, w in weights.items()}, args, kwargs)
        return _call_with_parameters_set(base, call, weights, args, kwargs)
    finally:
        if isinstance(base, nn.RNNBase):
            base._init_flat_weights()  # None again for the compressed weights, as prepare_ left them


def _call_with_parameters_set(base: nn.Module, call: MethodCall, weights: dict, args: tuple, kwargs: dict) -> Any:
    held = {name: base._parameters.get(name) for name in weights}  # None on a prepared module
    try:
        base._parameters.update(weights)
        return call(*args, **kwargs)
    finally:
        base._parameters.update(held)
