"""The posterior's methods under a user's ``torch.compile(model)``, ``torch.export`` and ``torch.jit.trace``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["EXPORT_HINT", "FUNC_TRANSFORM_HINT", "eager_under_torch_compile"]

EXPORT_HINT = (
    "torch.export / torch.jit.trace of a prepared model in its variational (training) mode: the posterior's "
    "evaluation is data-dependent and cannot be exported or traced. Fix the weights first "
    "(sqs_core.greedy_(model, nonzero=...) or sample_): the exported program then holds the sparse quantized "
    "weights; or export the plain model that sqs_core.load fills from a saved file"
)

FUNC_TRANSFORM_HINT = (
    "torch.func transforms (grad, vmap, jacrev, jvp, ...) cannot run through a prepared model in its variational "
    "(training) mode: the posterior's forward and backward are written by hand (a custom autograd.Function that "
    "functorch cannot transform). Train with ordinary autograd (torch.func.functional_call works), or fix the "
    "weights first (sqs_core.greedy_(model) or sample_): a fixed model takes every transform"
)


def _under_func_transform() -> bool:
    """Whether a torch.func transform (grad, vmap, ...) is running: functorch's interpreter stack is not empty."""
    peek = getattr(torch._C._functorch, "peek_interpreter_stack", None)
    return peek is not None and peek() is not None


def eager_under_torch_compile(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` run eagerly inside a user's ``torch.compile(model)``: a graph break, the rest of the model
    compiles. Dynamo cannot trace the posterior's data-dependent blocks and Python state (AOTAutograd failed
    on a guard). ``torch.compiler.disable`` as a plain decorator would import dynamo (sympy, ...) with
    sqs_core; this asks for it only while dynamo traces, when it is loaded already. ``torch.export`` allows no
    graph break and ``torch.jit.trace`` records no data-dependent branch: there a ValueError says to fix the
    weights first (export failed on a data-dependent guard, trace on an internal assert of torch's). Inside a
    torch.func transform a RuntimeError says the same (torch's own named a missing ``setup_context``)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_exporting() or torch.jit.is_tracing():
            raise ValueError(EXPORT_HINT)
        if _under_func_transform():
            raise RuntimeError(FUNC_TRANSFORM_HINT)
        if torch.compiler.is_compiling():
            return torch.compiler.disable(method)(*args, **kwargs)
        return method(*args, **kwargs)

    return wrapper
