"""Shared by the benchmark scripts (run as ``python bench_*.py`` from this folder): best-of-N wall time, and
writing a result file whole or not at all."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from sqs_core.files import write_atomic


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


def write_json(path: Path | str, data: object, *, indent: int = 2) -> None:
    """``data`` as JSON (and a final newline) at ``path``, its folder made if missing, written whole or not at
    all by sqs-core's atomic writer (sqs_core.files: temporary file beside it, fsync, rename), so an
    interrupted run leaves the earlier file, never half of one."""
    text = json.dumps(data, indent=indent) + "\n"  # serialised first: a value JSON refuses leaves no file behind
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
