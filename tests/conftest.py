"""Shared test configuration: hypothesis profiles and the data-directory fixture."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# A derandomized profile for CI: deterministic, no deadline, no example database.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _data_dir() -> Path | None:
    raw = os.environ.get("SQS_DATA_DIR")
    candidates = [Path(raw)] if raw else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
    return None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data directory (SQS_DATA_DIR, else ../shared/data); skips when absent."""
    found = _data_dir()
    if found is None:
        pytest.skip("real data not found: set SQS_DATA_DIR to the folder described in shared/data/README.md")
    return found
