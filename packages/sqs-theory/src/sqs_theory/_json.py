"""JSON-safe copies of result structures, for the files the studies write (``json.dumps(allow_nan=False)``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


def jsonable(x: Any, non_finite: Callable[[float], Any] = lambda _: None) -> Any:
    """A copy of ``x`` with mappings as dicts of str keys, lists, tuples and arrays as lists, numpy scalars as
    Python ones, and each non-finite float ``v`` replaced by ``non_finite(v)`` (JSON null by default)."""
    if isinstance(x, Mapping):
        return {str(k): jsonable(v, non_finite) for k, v in x.items()}
    if isinstance(x, list | tuple | np.ndarray):
        return [jsonable(v, non_finite) for v in x]
    if isinstance(x, bool | np.bool_):
        return bool(x)
    if isinstance(x, int | np.integer):
        return int(x)
    if isinstance(x, float | np.floating):
        return float(x) if math.isfinite(x) else non_finite(float(x))
    return x
