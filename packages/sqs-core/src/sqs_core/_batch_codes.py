"""Packed codes of many streams to values, a fixed number of tensor operations per code width.

A stream is ``n_codes`` codes of ``bits`` bits (byte-aligned start, zero padding) indexing its own ``table``
of codebook positions. The kept weights' primary codes and the escape codes of the escaped layout
(:mod:`sqs_core._codes`) are both such streams. Widths 1, 2, 4 and 8 gather whole bytes through a table of
every stream's 256 byte values (several fields per gathered row); odd widths unpack all streams, each
padded to whole groups of 8 fields, in one pass and gather the fields.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from ._bits import _unpack_aligned, tensor_from_bytes
from .packing import _byte_fields


class CodeStream(NamedTuple):
    codes: bytes  # ceil(n_codes · bits / 8) bytes, zero padding bits
    n_codes: int
    bits: int  # 0..8
    table: list[int]  # the codebook positions of codes 0, 1, …; ≤ 2^bits of them


def decode_code_streams(streams: list[CodeStream], codebook: Tensor) -> list[Tensor]:
    """Each stream's ``codebook[table[code]]`` values. ``codebook``'s last entry must be +0 (it fills the
    tables' unused codes). Raises ValueError if a code indexes past its table."""
    by_width: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(streams):
        by_width[s.bits].append(i)
    out: list[Tensor] = [codebook[:0]] * len(streams)
    for bits, members in by_width.items():
        group = [streams[i] for i in members]
        if bits == 0:  # a single table entry: every code is 0
            decoded = [codebook[s.table[0]].expand(s.n_codes) for s in group]
        else:
            tables = _tables(group, codebook, bits)
            decoded = _byte_values(group, tables, bits) if 8 % bits == 0 else _field_values(group, tables, bits)
        for i, values in zip(members, decoded, strict=True):
            out[i] = values
    return out


def _tables(group: list[CodeStream], codebook: Tensor, bits: int) -> Tensor:
    """(G, 2^b) the values each stream's codes index; codes past a short table index the +0 last entry
    (:func:`_check_codes` rejects them)."""
    zero, width = codebook.numel() - 1, 1 << bits
    index: list[int] = []
    for s in group:
        index += s.table + [zero] * (width - len(s.table))
    return codebook.index_select(0, torch.tensor(index, dtype=torch.int64)).view(len(group), width)


def _byte_values(group: list[CodeStream], tables: Tensor, bits: int) -> list[Tensor]:
    """b ∈ {1, 2, 4, 8}: each code byte of stream g gathers its 8/b values from row g·256 + byte."""
    data = tensor_from_bytes(b"".join(s.codes for s in group))
    sizes = [len(s.codes) for s in group]
    rows = data.int() + torch.repeat_interleave(
        torch.arange(len(group), dtype=torch.int32) * 256, torch.tensor(sizes, dtype=torch.int64)
    )
    fields = _byte_fields(bits)  # (256, 8 // b)
    _check_codes(group, bits, lambda bad: bad[:, fields].any(-1).reshape(-1).index_select(0, rows))
    flat = tables[:, fields].reshape(-1, 8 // bits).index_select(0, rows).reshape(-1)
    return _cut(flat, group, [size * 8 // bits for size in sizes])


def _field_values(group: list[CodeStream], tables: Tensor, bits: int) -> list[Tensor]:
    """Odd b: each stream's codes padded to whole groups of 8 fields (b bytes), unpacked in one pass."""
    padded = [s.codes + bytes(-len(s.codes) % bits) for s in group]
    data = tensor_from_bytes(b"".join(padded))
    sizes = [len(c) * 8 // bits for c in padded]
    index = _unpack_aligned(data, bits, sum(sizes)).int()
    index += torch.repeat_interleave(
        torch.arange(len(group), dtype=torch.int32) << bits, torch.tensor(sizes, dtype=torch.int64)
    )
    _check_codes(group, bits, lambda bad: bad.reshape(-1).index_select(0, index))
    return _cut(tables.reshape(-1).index_select(0, index), group, sizes)


def _check_codes(group: list[CodeStream], bits: int, bad_at: Callable[[Tensor], Tensor]) -> None:
    """Raise ValueError if a code indexes past its table (``bad_at`` maps the (G, 2^b) table of
    out-of-range codes to the codes read; padding fields are 0, always in range)."""
    width = 1 << bits
    if all(len(s.table) == width for s in group):
        return
    sizes = torch.tensor([len(s.table) for s in group])
    if bool(bad_at(torch.arange(width).unsqueeze(0) >= sizes.unsqueeze(1)).any()):
        raise ValueError("a code indexes past its table of used entries")


def _cut(flat: Tensor, group: list[CodeStream], sizes: list[int]) -> list[Tensor]:
    out, start = [], 0
    for s, size in zip(group, sizes, strict=True):
        out.append(flat[start : start + s.n_codes])
        start += size
    return out
