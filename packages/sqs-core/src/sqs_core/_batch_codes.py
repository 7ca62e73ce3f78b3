"""Packed codes of many streams to values, a fixed number of tensor operations per code width.

A stream is ``n_codes`` codes of ``bits`` bits (byte-aligned start, zero padding) indexing its own ``table``
of codebook positions. The kept weights' primary codes and the escape codes of the escaped layout
(:mod:`sqs_core._codes`) are both such streams. Widths 1, 2, 4 and 8 gather whole bytes through a table of
every stream's 256 byte values (several fields per gathered row); odd widths unpack all streams, each
padded to whole groups of 8 fields, in one pass and gather the fields. Few codes in all (the escape codes)
are read in one pass over every width as fields of varying width: ~15 operations, whatever the widths.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from ._bits import _unpack_aligned, per_element, read_varying_fields, segment_ids, tensor_from_bytes
from .packing import _byte_fields, _gather_byte_rows

VARYING_LIMIT = 1 << 15
"""Streams with fewer codes than this in all are read as fields of varying width in one pass: fewer tensor
operations (~15) than a pass per width (~10 for 1, 2, 4, 8 bits; ~40 for odd widths), each over every code."""


class CodeStream(NamedTuple):
    codes: bytes  # ceil(n_codes · bits / 8) bytes, zero padding bits
    n_codes: int
    bits: int  # 0..8
    table: list[int]  # the codebook positions of codes 0, 1, …; ≤ 2^bits of them


def decode_code_buffer(streams: list[CodeStream], codebook: Tensor) -> tuple[Tensor, list[int]]:
    """Every stream's ``codebook[table[code]]`` values in one buffer, stream i's from ``starts[i]`` on, and
    the buffer's last entry +0 (``codebook``'s last entry, which must be +0: it also fills the tables'
    unused codes). Entries between streams hold the values of padding fields (never meant to be read).
    Widths with :data:`VARYING_LIMIT` codes or more in all take a pass per width; the other streams one
    pass together. Raises ValueError if a code indexes past its table."""
    by_width: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(streams):
        by_width[s.bits].append(i)
    groups = [(b, m) for b, m in by_width.items() if b and sum(streams[i].n_codes for i in m) >= VARYING_LIMIT]
    varying = sorted(set(range(len(streams))).difference(*(m for _, m in groups)))
    starts, regions, size = [0] * len(streams), [], 0  # per group: where its streams' (padded) fields begin
    align = max(1, 16 // codebook.element_size())  # a region of rows viewed as wide elements starts aligned
    for bits, members in [*groups, (0, varying)]:
        size += -size % align
        regions.append(size)
        for i in members:
            starts[i] = size
            size += _slots(streams[i], bits)
    buffer = codebook.new_empty(size + 1)
    buffer[size:] = codebook[-1:]
    for (bits, members), region in zip(groups, regions, strict=False):
        group = [streams[i] for i in members]
        fill = _byte_values if 8 % bits == 0 else _field_values
        region_end = starts[members[-1]] + _slots(group[-1], bits)
        fill(group, _tables(group, codebook, bits), bits, buffer[region:region_end])
    if varying:
        _varying_values([streams[i] for i in varying], codebook, buffer[regions[-1] : size])
    return buffer, starts


def _slots(s: CodeStream, bits: int) -> int:
    """Buffer entries a stream takes in a pass over its width: its codes, plus the padding fields of its last
    byte (for odd widths, of its last group of 8 fields, which :func:`_field_values` completes); in the
    pass over varying widths (``bits`` 0 here), its codes."""
    if bits == 0:
        return s.n_codes
    padded_bytes = len(s.codes) if 8 % bits == 0 else len(s.codes) + -len(s.codes) % bits
    return padded_bytes * 8 // bits


def _tables(group: list[CodeStream], codebook: Tensor, bits: int) -> Tensor:
    """(G, 2^b) the values each stream's codes index; codes past a short table index the +0 last entry
    (:func:`_check_codes` rejects them)."""
    zero, width = codebook.numel() - 1, 1 << bits
    index: list[int] = []
    for s in group:
        index += s.table + [zero] * (width - len(s.table))
    return codebook.index_select(0, torch.tensor(index, dtype=torch.int64)).view(len(group), width)


def _byte_values(group: list[CodeStream], tables: Tensor, bits: int, out: Tensor) -> None:
    """b ∈ {1, 2, 4, 8}: each code byte of stream g gathers its 8/b values from row g·256 + byte."""
    rows = _byte_rows(group)
    fields = _byte_fields(bits)  # (256, 8 // b)
    _check_codes(group, bits, lambda bad: bad[:, fields].any(-1).reshape(-1).index_select(0, rows))
    _gather_byte_rows(tables, bits, rows, out)


def _byte_rows(group: list[CodeStream]) -> Tensor:
    """(code bytes,) int32: each code byte of stream g as g·256 + byte (no tensor operation over the bytes)."""
    return segment_ids([len(s.codes) for s in group], torch.int32, b"".join(s.codes for s in group))


def _field_values(group: list[CodeStream], tables: Tensor, bits: int, out: Tensor) -> None:
    """Odd b: each stream's codes padded to whole groups of 8 fields (b bytes), unpacked in one pass."""
    data = tensor_from_bytes(b"".join(s.codes + bytes(-len(s.codes) % bits) for s in group))
    sizes = [_slots(s, bits) for s in group]
    index = _unpack_aligned(data, bits, sum(sizes)).int()
    index += segment_ids(sizes, torch.int32).bitwise_left_shift_(bits)  # stream s's table starts at s·2^b
    _check_codes(group, bits, lambda bad: bad.reshape(-1).index_select(0, index))
    torch.index_select(tables.reshape(-1), 0, index, out=out)


def _varying_values(streams: list[CodeStream], codebook: Tensor, out: Tensor) -> None:
    """Every stream's values, in turn, into ``out``: its codes read as fields of its width (0..8 bits) from
    one buffer, looked up in one table holding each stream's 2^b entries (−1 past its used ones)."""
    counts = [s.n_codes for s in streams]
    total = sum(counts)
    rows, table, start_bit, first, base = [], [], 0, 0, 0  # per stream: width, start bit − first·width, base, mask
    for s in streams:
        rows.append((s.bits, start_bit - first * s.bits, base, (1 << s.bits) - 1))
        table += s.table + [-1] * ((1 << s.bits) - len(s.table))
        start_bit, first, base = start_bit + 8 * len(s.codes), first + s.n_codes, base + (1 << s.bits)
    work = torch.int32 if start_bit + 8 * total < 1 << 31 else torch.int64
    _, (bits, shifted, bases, masks) = per_element(counts, rows, work)
    offsets = torch.arange(total, dtype=work).mul_(bits).add_(shifted)
    data = tensor_from_bytes(b"".join(s.codes for s in streams) + bytes(3))  # two bytes past every field
    codes = read_varying_fields(data, offsets, bits, masks)
    entries = torch.tensor(table, dtype=work).index_select(0, codes.add_(bases))
    if total and int(entries.min()) < 0:
        raise ValueError("a code indexes past its table of used entries")
    torch.index_select(codebook, 0, entries, out=out)


def _check_codes(group: list[CodeStream], bits: int, bad_at: Callable[[Tensor], Tensor]) -> None:
    """Raise ValueError if a code indexes past its table (``bad_at`` maps the (G, 2^b) table of
    out-of-range codes to the codes read; padding fields are 0, always in range)."""
    width = 1 << bits
    if all(len(s.table) == width for s in group):
        return
    sizes = torch.tensor([len(s.table) for s in group])
    if bool(bad_at(torch.arange(width).unsqueeze(0) >= sizes.unsqueeze(1)).any()):
        raise ValueError("a code indexes past its table of used entries")
