"""Artifacts crafted for the validation tests: a saved file's records or blobs changed and every checksum
recomputed (as anyone can, and as a writer with a bug or an older version could have produced)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from sqs_core import artifact as artifact_module
from sqs_core._artifact_file import read_artifact, record_name

HEADER_KEYS = ("config", "nonzero", "per_layer", "alternatives")


def resealed(source: Path, out: Path, edit: Callable[[list[dict], list[torch.Tensor]], None]) -> Path:
    """A copy of ``source`` whose records and blobs ``edit(records, blobs)`` changed in place, every checksum valid."""
    art = read_artifact(source)
    records = [dict(r) for r in art.records]
    blobs = [art.blobs[record_name(r)].clone() for r in records]
    edit(records, blobs)
    body = {**{k: art.header.get(k) for k in HEADER_KEYS}, "compressed": records}
    artifact_module._write(out, body, blobs, dict(art.dense))
    return out
