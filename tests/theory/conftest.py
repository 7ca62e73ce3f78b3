"""Fixtures shared by the theory tests."""

from __future__ import annotations

import pytest
from sqs_theory import convergence, errata


@pytest.fixture
def no_compute(monkeypatch):
    """Any compute raises: the CLI must fail on its arguments and refuse its outputs first."""

    def boom(*_args, **_kwargs):
        raise AssertionError("computed before the arguments and outputs were checked")

    monkeypatch.setattr(convergence, "run_study", boom)
    monkeypatch.setattr(errata, "build_errata", boom)
    monkeypatch.setattr("sqs_theory.__main__.all_verdicts", boom)
    monkeypatch.setattr("sqs_theory.docs.all_verdicts", boom)
