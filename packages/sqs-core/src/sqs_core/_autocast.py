"""The posterior's arithmetic in its own precision under a user's ``torch.autocast``.

Mixed-precision training wraps the forward (and sometimes the backward) in ``torch.autocast``, which runs the
ops on its lower-precision list in float16 / bfloat16. The posterior's evaluation uses one of them
(``torch.linalg.vecdot``, sqs_core._nearby's Σ_c φ_c μ_c): under CPU bfloat16 autocast the eager step failed
(an ``index_copy_`` of bfloat16 moments into float32 ones), and where no such copy follows, φ and θ^avg would be
formed to 8 bits, and inside a compiled kernel autocast is traced into the graph. The layers' own op (the
``F.linear`` / convolution with θ^avg) stays under the user's autocast: that is what they asked for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, TypeVar

import torch

__all__: list[str] = []  # used by sqs_core.posterior, the autograd Functions and sqs_core.schedules

DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu")
"""Device types whose autocast :func:`without_autocast` turns off where it is on."""

F = TypeVar("F", bound=Callable[..., Any])


def _autocast_on(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` here (False where this torch does not know the type)."""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except (RuntimeError, TypeError, ValueError):
        return False


def without_autocast(fn: F) -> F:
    """``fn`` run with autocast off for every device type where it is on (nothing to do where it is off)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        active = [d for d in DEVICE_TYPES if _autocast_on(d)]
        if not active:
            return fn(*args, **kwargs)
        with ExitStack() as stack:
            for device_type in active:
                stack.enter_context(torch.autocast(device_type, enabled=False))
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
