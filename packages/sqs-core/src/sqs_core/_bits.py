"""Bit-stream primitives of the artifact's payloads (the bit order is documented in ``sqs_core.packing``)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["check_bits", "pack_bits", "packed_length", "read_fields", "unpack_bits"]


SMALL_COUNT = 4096
"""Streams shorter than this (in fields, or bits for a Rice stream) take paths with fewer tensor operations,
which win where per-operation overhead, not bytes, is the cost: odd widths gather the bytes each field
straddles (~15 operations, against ~60 for the column path), and a Rice stream is unpacked once."""
PYTHON_BITS = 256  # 1-bit streams up to this long are read as a Python integer (set_bit_indices)


def packed_length(count: int, bits: int) -> int:
    """Number of bytes ``ceil(count * bits / 8)`` that ``count`` values of ``bits`` bits occupy."""
    check_bits(bits)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a non-negative int, got {count!r}")
    return (count * bits + 7) // 8


def pack_bits(values: Tensor, bits: int) -> Tensor:
    """Pack integers ``0 ≤ v < 2**bits`` into a little-endian bit stream.

    Layout: value ``i`` occupies stream bits ``[i*bits, (i+1)*bits)``, least significant bit
    first, where stream bit ``j`` is bit ``j % 8`` of byte ``j // 8``.  E.g. with ``bits=2`` byte
    0 holds ``v0 | v1 << 2 | v2 << 4 | v3 << 6``.  The result has ``ceil(len * bits / 8)`` bytes;
    the unused high bits of the last byte are zero.

    Args:
        values: 1-D integer or bool tensor.
        bits: field width, 1..8.

    Returns:
        1-D ``uint8`` tensor on ``values.device``.
    """
    check_bits(bits)
    if values.dim() != 1:
        raise ValueError(f"values must be 1-D, got shape {tuple(values.shape)}")
    if values.dtype.is_floating_point or values.dtype.is_complex:
        raise TypeError(f"values must be an integer or bool tensor, got {values.dtype}")
    n = values.numel()
    if n and values.dtype != torch.bool:
        lo, hi = int(values.min()), int(values.max())
        if lo < 0 or hi >= 1 << bits:
            raise ValueError(f"values must lie in [0, {1 << bits}) for bits={bits}, got range [{lo}, {hi}]")
    device = values.device
    groups = (n + 7) // 8
    # 8 values of `bits` bits are exactly `bits` bytes: assemble each group in one int64 word.
    v = torch.zeros(groups * 8, dtype=torch.int64, device=device)
    v[:n] = values
    shifts = torch.arange(8, device=device) * bits
    word = (v.view(groups, 8) << shifts).sum(dim=1)  # (groups,), fields do not overlap
    byte_shifts = torch.arange(bits, device=device) * 8
    out = ((word.unsqueeze(1) >> byte_shifts) & 0xFF).to(torch.uint8).reshape(-1)  # (groups * bits,)
    return out[: packed_length(n, bits)].clone()


def unpack_bits(packed: Tensor, bits: int, count: int) -> Tensor:
    """Inverse of :func:`pack_bits`: read ``count`` fields of ``bits`` bits.

    Raises ``ValueError`` when ``packed`` does not hold exactly ``ceil(count * bits / 8)`` bytes
    (a truncated or over-long payload) or when its padding bits are not zero.

    Returns:
        1-D ``uint8`` tensor of length ``count`` on ``packed.device``.
    """
    check_packed(packed, bits, count)
    return _unpack_aligned(packed, bits, count)


def _unpack_aligned(packed: Tensor, bits: int, count: int) -> Tensor:
    """``count`` fields of ``bits`` ∈ 1..8 bits from the start of ``packed`` (uint8 result, no checks)."""
    device = packed.device
    if bits == 8:
        return packed[:count].clone()
    mask = (1 << bits) - 1
    if 8 % bits == 0:
        # bits ∈ {1, 2, 4}: every byte holds 8 // bits whole fields, so shift the bytes directly.
        fields = (packed.unsqueeze(1) >> _byte_shifts(bits, device)).bitwise_and_(mask)  # (bytes, 8 // bits)
        return fields.reshape(-1)[:count]
    if count < SMALL_COUNT:  # a few fields: one gather of the bytes they straddle (fewer operations)
        return _gather_fields(packed, bits, count, 0).to(torch.uint8)
    # bits ∈ {3, 5, 6, 7}: a group of 8 fields is exactly `bits` bytes. Field j of every group starts at
    # bit r = bits·j mod 8 of byte p = bits·j // 8 and may continue into byte p + 1: two uint8 shifts
    # per field column, no wide integers.
    groups = (count + 7) // 8
    padded = torch.zeros(groups * bits, dtype=torch.uint8, device=device)
    used = min(packed.numel(), groups * bits)
    padded[:used] = packed[:used]
    rows = padded.view(groups, bits)
    fields = torch.empty(groups, 8, dtype=torch.uint8, device=device)
    for j in range(8):
        p, r = divmod(bits * j, 8)
        column = rows[:, p] >> r
        if r + bits > 8:
            column |= rows[:, p + 1] << (8 - r)  # uint8: the bits shifted past 7 fall off
        fields[:, j] = column.bitwise_and_(mask)
    return fields.reshape(-1)[:count]


def read_fields(stream: Tensor, bits: int, count: int, start_bit: int = 0) -> Tensor:
    """``count`` fields of ``bits`` bits (1..57) read from ``stream`` (uint8) from bit ``start_bit`` on,
    LSB first, as int64; no length or padding checks (the caller validates). Byte-aligned fields of
    ≤ 8 bits take :func:`unpack_bits`' shift path; the rest gather the ≤ 8 bytes each field straddles."""
    if count == 0:
        return torch.zeros(0, dtype=torch.int64, device=stream.device)
    if start_bit % 8 == 0 and bits <= 8 and (8 % bits == 0 or count >= SMALL_COUNT):
        start = start_bit // 8
        return _unpack_aligned(stream[start : start + (count * bits + 7) // 8], bits, count).long()
    return _gather_fields(stream, bits, count, start_bit)


def _gather_fields(stream: Tensor, bits: int, count: int, start_bit: int) -> Tensor:
    """``count`` fields of ``bits`` bits from bit ``start_bit`` on, as int64, each read from the ≤ 8 bytes it
    straddles (no length checks)."""
    start, skip = divmod(start_bit, 8)
    span = (bits + 7 + 7) // 8  # bytes a field can straddle
    data = torch.cat([stream[start : start + (skip + count * bits + 7) // 8], stream.new_zeros(span)])
    offsets = torch.arange(count, dtype=torch.int64, device=stream.device) * bits + skip
    return _fields_at(data, offsets, (1 << bits) - 1, span)


def set_bit_indices(packed: Tensor, count: int) -> Tensor:
    """Indices (int64, increasing) of the set bits among the first ``count`` bits of a 1-bit stream, i.e.
    ``unpack_bits(packed, 1, count).nonzero()``; same checks. Streams of up to :data:`PYTHON_BITS` bits
    (the per-tensor tables of an artifact) are read as one Python integer: one tensor operation instead of
    about ten (a loop over the set bits, so only for short streams)."""
    if count > PYTHON_BITS:
        return unpack_bits(packed, 1, count).nonzero().squeeze(1)
    if packed.dtype != torch.uint8 or packed.dim() != 1 or packed.numel() != (count + 7) // 8:
        check_packed(packed, 1, count)  # raises the usual error
    value = int.from_bytes(bytes(packed.tolist()), "little")
    if value >> count:  # a padding bit is set
        check_packed(packed, 1, count)  # raises the usual error
    return torch.tensor(set_bits_of(value), dtype=torch.int64, device=packed.device)


def set_bits_of(value: int) -> list[int]:
    """The indices of the set bits of a non-negative int, ascending (a loop over the set bits; values below
    2^16, the per-tensor tables of an artifact, from a cache)."""
    return list(_small_set_bits(value)) if value < 1 << 16 else _loop_set_bits(value)


@functools.lru_cache(maxsize=4096)
def _small_set_bits(value: int) -> tuple[int, ...]:
    return tuple(_loop_set_bits(value))


def _loop_set_bits(value: int) -> list[int]:
    indices = []
    while value:
        low = value & -value
        indices.append(low.bit_length() - 1)
        value ^= low
    return indices


@functools.cache
def _cpu_byte_shifts(bits: int) -> Tensor:
    return torch.arange(0, 8, bits, dtype=torch.uint8)


def _byte_shifts(bits: int, device: torch.device) -> Tensor:
    """(8 // bits,) uint8 shifts of the fields in a byte (cached on the CPU; never written to)."""
    shifts = _cpu_byte_shifts(bits)
    return shifts if device.type == "cpu" else shifts.to(device)


def check_bits(bits: int) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an int in 1..8, got {bits!r}")


def check_packed(packed: Tensor, bits: int, count: int) -> None:
    expected = packed_length(count, bits)
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed must be a uint8 tensor, got {packed.dtype}")
    if packed.dim() != 1:
        raise ValueError(f"packed must be 1-D, got shape {tuple(packed.shape)}")
    if packed.numel() != expected:
        raise ValueError(
            f"packed payload has {packed.numel()} bytes, expected {expected} for {count} values of {bits} bits"
        )
    if not zero_padding(packed, count * bits):
        raise ValueError(f"padding bits of the last byte are not zero (last byte {int(packed[-1]):#04x})")


def zero_padding(packed: bytes | Tensor, used_bits: int) -> bool:
    """Whether ``packed`` (bytes, or a 1-D uint8 tensor) has exactly the bytes ``used_bits`` bits need and zero
    padding bits after them."""
    if len(packed) != (used_bits + 7) // 8:
        return False
    return not (used_bits % 8 and int(packed[-1]) >> (used_bits % 8))


def read_varying_fields(data: Tensor, offsets: Tensor, widths: Tensor, masks: Tensor | None = None) -> Tensor:
    """Field i of ``widths[i]`` ∈ 0..16 bits from bit ``offsets[i]`` of ``data`` (uint8), LSB first, in
    ``offsets``' integer dtype; ``masks`` (2^width − 1) when the caller has them. ``data`` must hold two bytes
    past the first byte of every field (pad it); no other checks."""
    masks = (torch.ones_like(widths) << widths) - 1 if masks is None else masks
    return _fields_at(data, offsets, masks, 3)


def _fields_at(data: Tensor, offsets: Tensor, masks: Tensor | int, span: int) -> Tensor:
    """The fields from bits ``offsets`` of ``data`` (uint8), LSB first, cut by ``masks``, in ``offsets``' dtype:
    a word of the ``span`` bytes from each byte on, one gather of the fields' first bytes' words, a shift. ``data``
    must hold ``span`` − 1 bytes past every field's first byte."""
    wide = data.to(offsets.dtype)
    n = wide.numel() - span + 1
    words = wide[:n]
    for j in range(1, span):
        words = words | (wide[j : j + n] << 8 * j)
    return words.index_select(0, offsets >> 3).bitwise_right_shift_(offsets & 7).bitwise_and_(masks)


@functools.cache
def set_bit_tables(dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(256,) set bits of each byte value; (256·8,) their bit indices, ascending, row-major."""
    counts = torch.tensor([bin(v).count("1") for v in range(256)], dtype=dtype)
    bits = torch.zeros(256, 8, dtype=dtype)
    for v in range(256):
        ones = [j for j in range(8) if v >> j & 1]
        bits[v, : len(ones)] = torch.tensor(ones, dtype=dtype)
    return counts, bits.reshape(-1)


def set_bit_positions(data: Tensor, dtype: torch.dtype = torch.int64) -> Tensor:
    """Stream indices (increasing, ``dtype``) of the set bits of ``data`` (uint8; bit j of byte i is 8i + j):
    ``unpack_bits(data, 1, 8 * len(data)).nonzero()`` by byte tables, in operations over the bytes and the
    set bits only (``nonzero`` over every bit costs ~4 ns a bit here)."""
    counts_of, bits_of = set_bit_tables(dtype)
    byte = data.to(dtype)
    counts = counts_of.index_select(0, byte)
    byte_of = torch.repeat_interleave(counts)  # (M,) the byte of each set bit
    before = counts.cumsum(0, dtype=dtype).sub_(counts).index_select(0, byte_of)  # set bits in earlier bytes
    rank = torch.arange(byte_of.numel(), dtype=dtype).sub_(before)  # among its byte's set bits
    bit = bits_of.index_select(0, byte.index_select(0, byte_of).mul_(8).add_(rank))
    return byte_of.mul_(8).add_(bit)


def per_element(
    counts: Sequence[int], rows: Sequence[tuple[int, ...]], dtype: torch.dtype = torch.int64
) -> tuple[Tensor, list[Tensor]]:
    """Segment s covers the next ``counts[s]`` elements. Returns each element's segment and column j of
    ``rows`` (one row of ints per segment) spread over the elements: element i gets its segment's row. One
    tensor for the rows, one gather per column (a 2-D repeat_interleave and transpose cost ~3× more)."""
    segment_of = segment_ids(counts, dtype)
    table = torch.tensor(list(zip(*rows, strict=True)), dtype=dtype)  # (columns, segments)
    return segment_of, [column.index_select(0, segment_of) for column in table]


def segment_ids(counts: Sequence[int], dtype: torch.dtype, low: bytes | None = None) -> Tensor:
    """(Σ counts,) ``dtype``: each element's segment s (segment s covers the next ``counts[s]`` elements), or,
    given ``low`` (one byte per element), s·256 + that byte. Assembled in Python: no tensor operation over the
    elements (repeat_interleave costs ~20 µs)."""
    size, shift = dtype.itemsize, 0 if low is None else 8
    ids = b"".join((s << shift).to_bytes(size, sys.byteorder) * count for s, count in enumerate(counts))
    if low is None:
        return tensor_from_bytes(ids, dtype)
    with_low = bytearray(ids)
    with_low[0 if sys.byteorder == "little" else size - 1 :: size] = low  # the lowest byte of each element
    return tensor_from_bytes(with_low, dtype)


def tensor_from_bytes(data: bytes | bytearray, dtype: torch.dtype = torch.uint8) -> Tensor:
    """A 1-D tensor over a copy of ``data`` (``torch.frombuffer`` refuses empty buffers)."""
    if not data:
        return torch.zeros(0, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype)
