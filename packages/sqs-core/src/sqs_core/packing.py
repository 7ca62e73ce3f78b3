"""Bit-level codecs for the compressed artifact: packed level indices and sparsity masks.

Every kept weight is stored as a level index ``z ∈ [0, K)`` (``K ≤ 256``), so it needs
``bits = ceil(log2 K) ∈ 1..8`` bits; the sparsity mask records which weights are kept.  All
payloads are 1-D ``uint8`` tensors, ready to be written as safetensors entries.

Bit order.  A payload is read as a little-endian bit stream: stream bit ``j`` is bit ``j % 8``
(least significant first) of byte ``j // 8``.  Multi-bit fields are written least significant
bit first, so value ``i`` of a ``bits``-wide array occupies stream bits
``[i * bits, (i + 1) * bits)``.  Unused bits of the last byte are zero, and decoders reject
payloads whose length or padding disagrees with that layout.

Everything is vectorized torch code (no Python loop over elements) and runs on the input's
device.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "MASK_ENCODINGS",
    "RICE_HEADER_BYTES",
    "decode_mask",
    "encode_mask",
    "mask_cost_bytes",
    "pack_bits",
    "packed_length",
    "unpack_bits",
    "unpack_gather",
]

MASK_ENCODINGS: tuple[str, ...] = ("all", "none", "bitmap", "rice")
"""Mask encodings, in the order ``encode_mask`` prefers them on ties."""

RICE_HEADER_BYTES = 10
"""Rice payload header: flags (1 byte), k (1 byte), position count m (uint64, little-endian)."""

_RICE_INVERTED = 1  # header flag: the coded positions are the pruned ones


def packed_length(count: int, bits: int) -> int:
    """Number of bytes ``ceil(count * bits / 8)`` that ``count`` values of ``bits`` bits occupy."""
    _check_bits(bits)
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
    _check_bits(bits)
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
    _check_packed(packed, bits, count)
    device = packed.device
    if bits == 8:
        return packed.clone()
    mask = (1 << bits) - 1
    if 8 % bits == 0:
        # bits ∈ {1, 2, 4}: every byte holds 8 // bits whole fields, so shift the bytes directly.
        shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=device)
        fields = (packed.unsqueeze(1) >> shifts).bitwise_and_(mask)  # (bytes, 8 // bits)
        return fields.reshape(-1)[:count]
    # bits ∈ {3, 5, 6, 7}: a group of 8 fields is `bits` bytes; assemble one int64 word per group.
    groups = (count + 7) // 8
    padded = torch.zeros(groups * bits, dtype=torch.int64, device=device)
    padded[: packed.numel()] = packed
    byte_shifts = torch.arange(bits, device=device) * 8
    word = (padded.view(groups, bits) << byte_shifts).sum(dim=1)  # (groups,)
    shifts = torch.arange(8, device=device) * bits
    fields = ((word.unsqueeze(1) >> shifts) & mask).to(torch.uint8)  # (groups, 8)
    return fields.reshape(-1)[:count]


def unpack_gather(packed: Tensor, bits: int, count: int, codebook: Tensor) -> Tensor:
    """Decode packed level indices straight to values: ``codebook[unpack_bits(packed, bits, count)]``.

    For ``bits ∈ {1, 2, 4, 8}`` this gathers whole bytes from a 256-row table of
    ``8 // bits`` decoded values each, which is several times faster than unpacking the indices
    and gathering them one by one.  Raises ``ValueError`` if an index is ``≥ len(codebook)``.

    Args:
        packed: payload from :func:`pack_bits`.
        bits, count: as for :func:`unpack_bits`.
        codebook: 1-D tensor of the ``K ≤ 2**bits`` level values.

    Returns:
        1-D tensor of length ``count`` with ``codebook``'s dtype, on ``packed.device``.
    """
    _check_packed(packed, bits, count)
    if codebook.dim() != 1 or not 1 <= codebook.numel() <= 1 << bits:
        raise ValueError(
            f"codebook must be 1-D with 1..{1 << bits} entries for bits={bits}, got shape {tuple(codebook.shape)}"
        )
    n_levels = codebook.numel()  # K
    codebook = codebook.to(packed.device)
    if 8 % bits != 0:
        idx = unpack_bits(packed, bits, count)
        top = int(idx.max()) if count else 0
        if top >= n_levels:
            raise ValueError(f"level index {top} out of range for a codebook of {n_levels} entries")
        return codebook.index_select(0, idx.to(torch.int32))
    byte_values = torch.arange(256, dtype=torch.uint8, device=packed.device)
    fields = unpack_bits(byte_values, bits, 256 * 8 // bits).view(256, 8 // bits).long()
    rows = packed.to(torch.int32)
    if n_levels < 1 << bits:
        bad_byte = (fields >= n_levels).any(dim=1)  # (256,) bytes holding an out-of-range index
        if bool(bad_byte.index_select(0, rows).any()):
            raise ValueError(f"a level index is out of range for a codebook of {n_levels} entries")
        fields = fields.clamp(max=n_levels - 1)
    table = codebook[fields]  # (256, 8 // bits)
    return table.index_select(0, rows).reshape(-1)[:count]


class _RicePlan(NamedTuple):
    inverted: bool  # positions are the pruned ones
    k: int  # Rice parameter
    gaps: Tensor  # (m,) int64, d_i = p_i - p_{i-1} - 1 with p_{-1} = -1
    nbytes: int  # payload size including the header


def mask_cost_bytes(mask: Tensor) -> dict[str, int]:
    """Payload size in bytes of each encoding applicable to ``mask`` ("all"/"none" only when exact)."""
    _check_mask(mask)
    return _costs(mask, _rice_plan(mask))


def encode_mask(mask: Tensor, *, encoding: str | None = None) -> tuple[str, Tensor]:
    """Encode a 1-D bool mask with the smallest applicable encoding (or the one named).

    Encodings (payload layouts):

    * ``"all"`` / ``"none"``: every entry True / False; empty payload.
    * ``"bitmap"``: ``pack_bits(mask, 1)``, one bit per entry, ``ceil(n / 8)`` bytes.
    * ``"rice"``: a :data:`RICE_HEADER_BYTES`-byte header (byte 0 flags, bit 0 set when the coded
      positions are the *pruned* ones; byte 1 the Rice parameter ``k``; bytes 2..9 the position
      count ``m`` as little-endian uint64) followed by one bit stream holding first the ``m``
      remainders ``d_i mod 2**k`` (``k`` bits each, LSB first) and then the ``m`` quotients
      ``d_i >> k`` in unary (``q`` zeros then a one).  ``d_i = p_i - p_{i-1} - 1`` are the gaps
      between successive coded positions ``p`` (``p_{-1} = -1``).  The coded positions are the
      kept ones, or the pruned ones when those are fewer.

    Args:
        mask: 1-D bool tensor, True where the weight is kept.
        encoding: force this encoding; ``ValueError`` if it is unknown or cannot represent
            ``mask`` ("all" / "none" for a mixed mask).

    Returns:
        ``(encoding, payload)`` with ``payload`` a 1-D ``uint8`` tensor on ``mask.device``.
    """
    _check_mask(mask)
    plan = _rice_plan(mask)
    costs = _costs(mask, plan)
    if encoding is None:
        encoding = min(costs, key=lambda name: (costs[name], MASK_ENCODINGS.index(name)))
    elif encoding not in costs:
        raise ValueError(f"mask encoding {encoding!r} cannot represent this mask; applicable: {tuple(costs)}")
    if encoding in ("all", "none"):
        return encoding, torch.empty(0, dtype=torch.uint8, device=mask.device)
    if encoding == "bitmap":
        return encoding, pack_bits(mask, 1)
    return encoding, _rice_encode(plan, mask.device)


def decode_mask(encoding: str, payload: Tensor, length: int) -> Tensor:
    """Inverse of :func:`encode_mask`; also accepts a ``"rice"`` or ``"bitmap"`` payload of any mask.

    Raises ``ValueError`` for an unknown encoding, a payload of the wrong size, or a corrupted
    Rice header or stream (e.g. a count or a position beyond ``length``).

    Returns:
        1-D bool tensor of length ``length`` on ``payload.device``.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"length must be a non-negative int, got {length!r}")
    if payload.dim() != 1 or payload.dtype != torch.uint8:
        raise ValueError(f"payload must be a 1-D uint8 tensor, got {payload.dtype} {tuple(payload.shape)}")
    device = payload.device
    if encoding in ("all", "none"):
        if payload.numel():
            raise ValueError(f"mask encoding {encoding!r} has an empty payload, got {payload.numel()} bytes")
        return torch.full((length,), encoding == "all", dtype=torch.bool, device=device)
    if encoding == "bitmap":
        return unpack_bits(payload, 1, length).bool()
    if encoding == "rice":
        return _rice_decode(payload, length)
    raise ValueError(f"unknown mask encoding {encoding!r}; expected one of {MASK_ENCODINGS}")


def _check_bits(bits: int) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an int in 1..8, got {bits!r}")


def _check_packed(packed: Tensor, bits: int, count: int) -> None:
    expected = packed_length(count, bits)
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed must be a uint8 tensor, got {packed.dtype}")
    if packed.dim() != 1:
        raise ValueError(f"packed must be 1-D, got shape {tuple(packed.shape)}")
    if packed.numel() != expected:
        raise ValueError(
            f"packed payload has {packed.numel()} bytes, expected {expected} for {count} values of {bits} bits"
        )
    used = count * bits % 8
    if used and int(packed[-1]) >> used:
        raise ValueError(f"padding bits of the last byte are not zero (last byte {int(packed[-1]):#04x})")


def _check_mask(mask: Tensor) -> None:
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
    if mask.dim() != 1:
        raise ValueError(f"mask must be 1-D, got shape {tuple(mask.shape)}")


def _costs(mask: Tensor, plan: _RicePlan) -> dict[str, int]:
    n = mask.numel()
    kept = int(mask.count_nonzero())
    costs: dict[str, int] = {}
    if kept == n:
        costs["all"] = 0
    if kept == 0:
        costs["none"] = 0
    costs["bitmap"] = (n + 7) // 8
    costs["rice"] = plan.nbytes
    return costs


def _rice_bits(gaps: Tensor, k: int) -> int:
    """Stream length in bits: m remainders of k bits plus m unary quotients (q zeros and a one)."""
    return gaps.numel() * (k + 1) + int((gaps >> k).sum())


def _rice_parameter(gaps: Tensor, span: int) -> int:
    """The k minimising the stream length for these gaps (m of them covering ``span`` entries).

    Starts from k = floor(log2(μ ln 2)), best for geometric gaps of mean μ = span / m, then walks
    downhill.  The length is convex in k (cost(k+1) - cost(k) = m - Σ ceil((d >> k) / 2) is
    non-decreasing), so the first local minimum is the global one.
    """
    scaled_mean = span / gaps.numel() * math.log(2)
    k = math.floor(math.log2(scaled_mean)) if scaled_mean >= 1 else 0
    cost = _rice_bits(gaps, k)
    for step in (-1, 1):
        while k + step >= 0 and (trial := _rice_bits(gaps, k + step)) < cost:
            k, cost = k + step, trial
    return k


def _rice_plan(mask: Tensor) -> _RicePlan:
    n = mask.numel()
    kept = int(mask.count_nonzero())
    inverted = kept > n - kept
    positions = torch.nonzero(~mask if inverted else mask).flatten()  # (m,) increasing
    gaps = torch.diff(positions, prepend=positions.new_full((1,), -1)) - 1
    m = gaps.numel()
    k = _rice_parameter(gaps, int(positions[-1]) + 1) if m else 0
    nbytes = RICE_HEADER_BYTES + (_rice_bits(gaps, k) + 7) // 8
    return _RicePlan(inverted=inverted, k=k, gaps=gaps, nbytes=nbytes)


def _rice_encode(plan: _RicePlan, device: torch.device) -> Tensor:
    gaps, k = plan.gaps, plan.k
    m = gaps.numel()
    header = bytes([_RICE_INVERTED if plan.inverted else 0, k]) + m.to_bytes(8, "little")
    remainders = (gaps.unsqueeze(1) >> torch.arange(k, device=gaps.device)) & 1  # (m, k), LSB first
    quotients = gaps >> k
    ends = torch.cumsum(quotients + 1, dim=0) - 1  # position of each unary terminator (a one)
    unary = torch.zeros(int(ends[-1]) + 1 if m else 0, dtype=torch.bool, device=gaps.device)
    unary[ends] = True
    stream = torch.cat([remainders.reshape(-1).bool(), unary])
    head = torch.tensor(list(header), dtype=torch.uint8, device=device)
    return torch.cat([head, pack_bits(stream, 1).to(device)])


def _rice_decode(payload: Tensor, length: int) -> Tensor:
    if payload.numel() < RICE_HEADER_BYTES:
        raise ValueError(f"rice payload needs a {RICE_HEADER_BYTES}-byte header, got {payload.numel()} bytes")
    header = bytes(payload[:RICE_HEADER_BYTES].tolist())
    flags, k, m = header[0], header[1], int.from_bytes(header[2:], "little")
    if flags & ~_RICE_INVERTED:
        raise ValueError(f"rice header has unknown flags {flags:#04x}")
    if m > length:
        raise ValueError(f"rice header counts {m} positions in a mask of length {length}")
    if k > length.bit_length():
        raise ValueError(f"rice parameter k={k} is too large for a mask of length {length}")
    body = payload[RICE_HEADER_BYTES:]
    stream = unpack_bits(body, 1, 8 * body.numel()).bool()
    if m * k > stream.numel():
        raise ValueError(f"rice stream of {stream.numel()} bits is too short for {m} remainders of {k} bits")
    shifts = torch.arange(k, device=payload.device)
    remainders = (stream[: m * k].view(m, k).long() << shifts).sum(dim=1)  # (m,)
    ends = torch.nonzero(stream[m * k :]).flatten()
    if ends.numel() != m:
        raise ValueError(f"rice stream holds {ends.numel()} unary codes, header says {m}")
    used = m * k + (int(ends[-1]) + 1 if m else 0)
    if (used + 7) // 8 != body.numel():
        raise ValueError(f"rice stream has {body.numel()} bytes, its codes need {(used + 7) // 8}")
    mask = torch.zeros(length, dtype=torch.bool, device=payload.device)
    if m:
        quotients = torch.diff(ends, prepend=ends.new_full((1,), -1)) - 1
        if int(quotients.max()) > (length - 1) >> k:
            raise ValueError("rice stream codes a gap beyond the mask length")
        positions = torch.cumsum((quotients << k) + remainders + 1, dim=0) - 1
        if int(positions[-1]) >= length:
            raise ValueError(f"rice stream codes position {int(positions[-1])} in a mask of length {length}")
        mask[positions] = True
    return ~mask if flags & _RICE_INVERTED else mask
