"""Fixtures shared by sqs-core's tests."""

from __future__ import annotations

import pytest
import torch
from sqs_core import _compiled

# The compiled kernels check every gathered index here (they do not by default: sqs_core._compiled.INDEX_CHECKS), so
# that an index out of range fails a test instead of reading stray memory. Kernels compile on first use, after this.
_compiled.INDEX_CHECKS = True


@pytest.fixture
def no_compiler(monkeypatch):
    """``torch.compile`` as on a machine without a C++ compiler: the compiled function raises when called."""

    def broken(fn, **options):
        def run(*args):
            raise OSError("no C++ compiler")

        return run

    monkeypatch.setattr(torch, "compile", broken)
