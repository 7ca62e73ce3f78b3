"""Fixtures shared by sqs-core's tests."""

from __future__ import annotations

import os

import pytest
import torch
from sqs_core import _compiled
from torch._inductor import cpp_builder

# The compiled kernels check every gathered index here (they do not by default: sqs_core._compiled.INDEX_CHECKS), so
# that an index out of range fails a test instead of reading stray memory. Kernels compile on first use, after this.
_compiled.INDEX_CHECKS = True

FULL_OPTIMISATION = os.environ.get("SQS_TEST_INDUCTOR_O3") == "1"
"""Whether this suite compiles inductor's C++ kernels at its own -O3 (``SQS_TEST_INDUCTOR_O3=1``) instead of
-O1. Inductor compiles CPU kernels with IEEE semantics kept (no fast-math, ``-ffp-contract=off``), so the
optimisation level changes how long g++ takes, not a value: the largest kernel of this suite took 57 s at -O3
and 10 s at -O1 on a 2-core Xeon (session 59), and the suite from a cold inductor cache 32 min with -O3.
tests/core/test_compile_level.py compiles kernels at -O3 in a fresh process and checks that every value and
gradient is bitwise the -O1 one. The level is part of the command line inductor keys its cache by, so an -O1
kernel is never loaded where -O3 is asked for (benchmarks, users)."""


def _at_o1(get_flags):
    def flags(cpp_compiler, min_optimize=False):
        cflags, ldflags = get_flags(cpp_compiler, min_optimize)
        return ["O1" if flag == "O3" else flag for flag in cflags], ldflags

    return flags


if not FULL_OPTIMISATION:
    cpp_builder._get_optimization_cflags = _at_o1(cpp_builder._get_optimization_cflags)


@pytest.fixture
def no_compiler(monkeypatch):
    """``torch.compile`` as on a machine without a C++ compiler: the compiled function raises inductor's error
    when called, and no kernel has compiled in this process."""
    monkeypatch.setattr(torch, "compile", failing_compile(OSError("no C++ compiler")))
    monkeypatch.setattr(_compiled, "_COMPILED_ONCE", False)


def failing_compile(cause: Exception):
    """A stand-in for ``torch.compile`` whose compiled functions raise ``cause`` as inductor reports a failed
    build: wrapped in an InductorError (a TorchDynamoException), before anything runs."""
    from torch._inductor.exc import InductorError

    def compile_(fn, **options):
        def run(*args):
            raise InductorError(cause, None)

        return run

    return compile_
