"""Best-of-N wall time, shared by the benchmark scripts (run as ``python bench_*.py`` from this folder)."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_seconds(fn: Callable[[], object], repeats: int, *, warmup: bool = False) -> float:
    """The fastest of ``repeats`` calls of ``fn`` (after one untimed call when ``warmup``)."""
    if warmup:
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
