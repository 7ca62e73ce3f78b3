"""Fixtures shared by sqs-core's tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def no_compiler(monkeypatch):
    """``torch.compile`` as on a machine without a C++ compiler: the compiled function raises when called."""

    def broken(fn, **options):
        def run(*args):
            raise OSError("no C++ compiler")

        return run

    monkeypatch.setattr(torch, "compile", broken)
