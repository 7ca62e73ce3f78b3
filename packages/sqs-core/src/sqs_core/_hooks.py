"""Hooks that an SQS layer's call would bypass. An SQS layer computes its module's functional form with the posterior's
weight (Linear, Conv, Embedding ...) and never calls the module; a module with several compressed parameters (an
LSTM, attention) is called once, innermost, with every weight substituted, and the SQS layers nested around it are
not called. A hook on such a module would silently never run: :func:`refuse_bypassed_hooks` names it instead."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

__all__ = ["HOOK_KINDS", "hook_kinds", "refuse_bypassed_hooks"]

HOOK_KINDS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
"""A module's own hook registries (the global ones, torch.nn.modules.module.register_module_*, run on the SQS layer)."""


def hook_kinds(module: nn.Module) -> list[str]:
    """The registries of ``module`` that hold a hook."""
    return [kind for kind in HOOK_KINDS if getattr(module, kind, None)]


def refuse_bypassed_hooks(name: str, bypassed: Iterable[nn.Module]) -> None:
    """A ValueError naming the SQS layer ``name`` where a module its call bypasses holds a hook (registered after
    ``prepare_``, on ``layer.base_layer`` or on a module found by its type, say)."""
    for module in bypassed:
        kinds = hook_kinds(module)
        if kinds:
            raise ValueError(
                f"a hook ({', '.join(kinds)}) is registered on a {type(module).__name__} that the SQS layer "
                f"{name or '(unnamed)'!r} wraps and never calls (it computes the layer's op itself), so it would never "
                f"run: remove it and register it on sqs_core.sqs_layers(model)[{name or '...'!r}] instead"
            )
