"""What the batched greedy decoder (:mod:`sqs_core._batch_decode`) needs of one record, read in Python.

Each record's small tables (the used and primary entry sets, Rice headers, the padding of the last byte of
every packed section) are read straight from the blob's bytes: no tensor operation per record. A record
this plan does not cover, or one whose tables are inconsistent, gets no plan (``None``) and is decoded by
:func:`~sqs_core._artifact_layout.decode_weight`, which raises the error naming what is damaged.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

from torch import Tensor

from ._artifact_layout import SECTIONS, _numel
from ._bits import set_bits_of, zero_padding
from ._codes import field_bits
from ._rice import MAX_BATCH_K, RICE_HEADER_BYTES, RiceStream, parse_rice_header


class RecordPlan(NamedTuple):
    """One record's part of a batch: the bytes of its sections and the tables its codes index (a NamedTuple:
    built in ~1.9 µs against a frozen dataclass's ~2.9, once per record and decode)."""

    name: str
    shape: list[int]
    numel: int
    kept: int  # n
    code_bits: int  # b: width of every kept weight's (primary) code, 1..8
    codebook: bytes  # (W', K) levels
    table: list[int]  # the 2^b (or fewer, plain layout) entries the codes index, into the codebook
    codes: bytes
    mask: str  # "bitmap", "rice" (kept positions coded) or "all"
    mask_bytes: bytes  # the bitmap (empty otherwise)
    mask_stream: RiceStream | None
    rest: list[int]  # escaped layout: the entries of S, which the escape codes index
    escape_stream: RiceStream | None  # escaped layout: the escaped weights' ranks among the kept ones
    escape_codes: bytes
    escape_bits: int


GREEDY_SECTIONS = SECTIONS[: SECTIONS.index("escape_codes") + 1]
"""The sections greedy weights need: the first ones of a blob (the sampling alternatives follow)."""


def plan_record(name: str, rec: dict, blob: Tensor) -> RecordPlan | None:
    """The record's plan, or None when the batch does not cover it (or its tables are inconsistent)."""
    numel, kept, bits = _numel(rec["shape"]), rec["kept"], rec["code_bits"]
    if kept == 0 or not 1 <= bits <= 8 or not blob.is_cpu or not blob.is_contiguous():
        return None
    raw = ctypes.string_at(blob.data_ptr(), blob.numel()) if blob.numel() else b""
    parts, start, sizes = {}, 0, rec["sections"]  # read_artifact checked that they add up to the blob
    for section in GREEDY_SECTIONS:
        end = start + sizes.get(section, 0)
        parts[section], start = raw[start:end], end
    entries = _set_bits(parts["used"], rec["stored_windows"] * rec["K"])
    mask = _mask(rec, parts["mask"], numel)
    if entries is None or len(entries) != rec["codes_used"] or mask is None:
        return None
    if not zero_padding(parts["codes"], kept * bits) or parts["codes_hi"]:
        return None
    table, rest, escapes, escape_bits = entries, [], None, 0
    if "escaped" in rec:
        primary = _set_bits(parts["primary"], len(entries))
        escapes = _rice_stream(str(rec["escape_mask"]), parts["escapes"], kept)
        escape_bits = field_bits(len(entries) - (1 << bits))
        if primary is None or len(primary) != 1 << bits or escapes is None or escapes.m != rec["escaped"]:
            return None
        if not zero_padding(parts["escape_codes"], escapes.m * escape_bits):
            return None
        chosen = set(primary)
        table = [entries[r] for r in primary]
        rest = [e for r, e in enumerate(entries) if r not in chosen]
    return RecordPlan(
        name=name,
        shape=rec["shape"],
        numel=numel,
        kept=kept,
        code_bits=bits,
        codebook=parts["codebook"],
        table=table,
        codes=parts["codes"],
        mask=mask,
        mask_bytes=parts["mask"] if mask == "bitmap" else b"",
        mask_stream=_rice_stream(rec["mask"], parts["mask"], numel) if mask == "rice" else None,
        rest=rest,
        escape_stream=escapes,
        escape_codes=parts["escape_codes"],
        escape_bits=escape_bits,
    )


def _mask(rec: dict, payload: bytes, numel: int) -> str | None:
    """The record's mask kind if the batch covers it and it is consistent, else None."""
    encoding, kept = rec["mask"], rec["kept"]
    if encoding == "all":
        return "all" if kept == numel and not payload else None
    if encoding == "bitmap":
        return "bitmap" if zero_padding(payload, numel) else None
    if encoding == "rice":
        stream = _rice_stream(encoding, payload, numel)
        return "rice" if stream is not None and stream.m == kept else None
    return None


def _rice_stream(encoding: str, payload: bytes, length: int) -> RiceStream | None:
    """The payload's Rice stream when it codes the set positions with k ≤ MAX_BATCH_K, else None."""
    if encoding != "rice":
        return None
    try:
        inverted, k, m = parse_rice_header(payload, len(payload), length)
    except ValueError:
        return None
    if inverted or k > MAX_BATCH_K:
        return None
    return RiceStream(payload[RICE_HEADER_BYTES:], k, m, length)


def _set_bits(packed: bytes, count: int) -> list[int] | None:
    """Indices of the set bits of a 1-bit stream of ``count`` bits; None if its size or padding is wrong."""
    return set_bits_of(int.from_bytes(packed, "little")) if zero_padding(packed, count) else None
