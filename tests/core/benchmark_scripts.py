"""Running the scripts of packages/sqs-core/benchmarks/ as a user does, for the tests of their output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "packages/sqs-core/benchmarks"


def run_benchmark(script: str, *args: str) -> subprocess.CompletedProcess:
    """``python packages/sqs-core/benchmarks/<script> <args>`` in a process of its own, its output captured."""
    command = [sys.executable, str(BENCHMARKS / script), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)
