"""Rice coding of sparsity masks (the "rice" encoding of ``sqs_core.packing``; layout in its docstring).

The coded positions p_0 < p_1 < … (the kept weights, or the pruned ones when fewer) become gaps
d_i = p_i − p_{i−1} − 1 (p_{−1} = −1), each written as a k-bit remainder d_i mod 2^k and a unary
quotient d_i >> k. Decoding returns the positions themselves, so a dense weight is filled by one
index_put instead of a boolean scatter.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import torch
from torch import Tensor

from ._bits import (
    SMALL_COUNT,
    pack_bits,
    per_element,
    read_fields,
    read_varying_fields,
    set_bit_positions,
    tensor_from_bytes,
    unpack_bits,
)

__all__ = [
    "RICE_HEADER_BYTES",
    "RICE_INVERTED",
    "RicePlan",
    "RiceStream",
    "parse_rice_header",
    "rice_decode_batch",
    "rice_decode_positions",
    "rice_decode_stream",
    "rice_encode",
    "rice_plan",
]

RICE_HEADER_BYTES = 10
"""Rice payload header: flags (1 byte), k (1 byte), position count m (uint64, little-endian)."""

RICE_INVERTED = 1  # header flag: the coded positions are the pruned ones


class RicePlan(NamedTuple):
    inverted: bool  # positions are the pruned ones
    k: int  # Rice parameter
    gaps: Tensor  # (m,) int64, d_i = p_i - p_{i-1} - 1 with p_{-1} = -1
    nbytes: int  # payload size including the header


def rice_bits(gaps: Tensor, k: int) -> int:
    """Stream length in bits: m remainders of k bits plus m unary quotients (q zeros and a one)."""
    return gaps.numel() * (k + 1) + int((gaps >> k).sum())


def rice_parameter(gaps: Tensor, span: int) -> int:
    """The k minimising the stream length for these gaps (m of them covering ``span`` entries).

    Starts from k = floor(log2(μ ln 2)), best for geometric gaps of mean μ = span / m, then walks
    downhill.  The length is convex in k (cost(k+1) - cost(k) = m - Σ ceil((d >> k) / 2) is
    non-decreasing), so the first local minimum is the global one.
    """
    scaled_mean = span / gaps.numel() * math.log(2)
    k = math.floor(math.log2(scaled_mean)) if scaled_mean >= 1 else 0
    cost = rice_bits(gaps, k)
    for step in (-1, 1):
        while k + step >= 0 and (trial := rice_bits(gaps, k + step)) < cost:
            k, cost = k + step, trial
    return k


def rice_plan(mask: Tensor) -> RicePlan:
    n = mask.numel()
    kept = int(mask.count_nonzero())
    inverted = kept > n - kept
    positions = torch.nonzero(~mask if inverted else mask).flatten()  # (m,) increasing
    gaps = torch.diff(positions, prepend=positions.new_full((1,), -1)) - 1
    m = gaps.numel()
    k = rice_parameter(gaps, int(positions[-1]) + 1) if m else 0
    nbytes = RICE_HEADER_BYTES + (rice_bits(gaps, k) + 7) // 8
    return RicePlan(inverted=inverted, k=k, gaps=gaps, nbytes=nbytes)


def rice_encode(plan: RicePlan, device: torch.device) -> Tensor:
    gaps, k = plan.gaps, plan.k
    m = gaps.numel()
    header = bytes([RICE_INVERTED if plan.inverted else 0, k]) + m.to_bytes(8, "little")
    remainders = (gaps.unsqueeze(1) >> torch.arange(k, device=gaps.device)) & 1  # (m, k), LSB first
    quotients = gaps >> k
    ends = torch.cumsum(quotients + 1, dim=0) - 1  # position of each unary terminator (a one)
    unary = torch.zeros(int(ends[-1]) + 1 if m else 0, dtype=torch.bool, device=gaps.device)
    unary[ends] = True
    stream = torch.cat([remainders.reshape(-1).bool(), unary])
    head = torch.tensor(list(header), dtype=torch.uint8, device=device)
    return torch.cat([head, pack_bits(stream, 1).to(device)])


def _read_header(payload: Tensor, length: int) -> tuple[bool, int, int]:
    return parse_rice_header(bytes(payload[:RICE_HEADER_BYTES].tolist()), payload.numel(), length)


def parse_rice_header(header: bytes, payload_bytes: int, length: int) -> tuple[bool, int, int]:
    """(inverted, k, m) from the first bytes of a Rice payload of ``payload_bytes`` bytes; ValueError if bad."""
    if payload_bytes < RICE_HEADER_BYTES:
        raise ValueError(f"rice payload needs a {RICE_HEADER_BYTES}-byte header, got {payload_bytes} bytes")
    flags, k, m = header[0], header[1], int.from_bytes(header[2:RICE_HEADER_BYTES], "little")
    if flags & ~RICE_INVERTED:
        raise ValueError(f"rice header has unknown flags {flags:#04x}")
    if m > length:
        raise ValueError(f"rice header counts {m} positions in a mask of length {length}")
    if k > length.bit_length() or k > 57:
        raise ValueError(f"rice parameter k={k} is too large for a mask of length {length}")
    return bool(flags & RICE_INVERTED), k, m


def rice_decode_positions(payload: Tensor, length: int) -> tuple[Tensor, bool]:
    """(coded positions, increasing int64; whether they are the pruned ones) of a Rice payload.

    With e_i the stream index of the i-th unary terminator (counted from the end of the remainders),
    Σ_{j≤i} q_j = e_i − i, so p_i = ((e_i − i) << k) + Σ_{j≤i} (r_j + 1) − 1
    = (e_i << k) + Σ_{j≤i} (r_j + 1 − 2^k) + 2^k − 1: one nonzero and one cumsum, no arange.
    Raises ValueError on a damaged header or stream (wrong counts, sizes, or a position ≥ ``length``).
    """
    inverted, k, m = _read_header(payload, length)
    return _decode_body(payload[RICE_HEADER_BYTES:], k, m, length), inverted


def rice_decode_stream(stream: RiceStream) -> Tensor:
    """The coded positions of one stream whose header is already parsed (:func:`rice_decode_positions`)."""
    return _decode_body(tensor_from_bytes(stream.body), stream.k, stream.m, stream.length)


def _decode_body(body: Tensor, k: int, m: int, length: int) -> Tensor:
    """The m positions coded by the bit stream ``body`` (after the header) with parameter k."""
    _check_remainders(m, k, body.numel())
    total_bits = 8 * body.numel()
    if m * k < SMALL_COUNT:  # few remainders: unpack the whole stream once and sum each remainder's bits
        stream = unpack_bits(body, 1, total_bits)
        weights = torch.arange(k, device=body.device)
        remainders = (stream[: m * k].view(m, k).long() << weights).sum(1) if k else None
        unary = stream[m * k :]
    else:  # no copy of the remainders' bits: read them as k-bit fields
        first_byte, skip = divmod(m * k, 8)
        unary = unpack_bits(body[first_byte:], 1, 8 * (body.numel() - first_byte))[skip:]
        remainders = None
    ends = torch.nonzero(unary).flatten()
    if ends.numel() != m:
        raise ValueError(f"rice stream holds {ends.numel()} unary codes, header says {m}")
    _check_end(m, k, int(ends[-1]) if m else -1, body.numel(), length)
    if not m:
        return ends
    positions = ends  # in place from here on: fresh tensors of m int64 each cost page faults
    if k:
        offsets = (read_fields(body, k, m) if remainders is None else remainders).add_(1 - (1 << k)).cumsum_(0)
        positions.bitwise_left_shift_(k).add_(offsets).add_((1 << k) - 1)
    _check_last_position(int(positions[-1]), length)
    return positions


def _check_remainders(m: int, k: int, body_bytes: int) -> None:
    if m * k > 8 * body_bytes:
        raise ValueError(f"rice stream of {8 * body_bytes} bits is too short for {m} remainders of {k} bits")


def _check_end(m: int, k: int, last_end: int, body_bytes: int, length: int) -> None:
    """The stream's bytes are exactly what its codes need (``last_end``: the last terminator's index in the
    unary part, −1 if none), and Σ q_j alone does not pass the mask's end."""
    used = m * k + last_end + 1
    if (used + 7) // 8 != body_bytes:
        raise ValueError(f"rice stream has {body_bytes} bytes, its codes need {(used + 7) // 8}")
    if m and last_end - (m - 1) > (length - 1) >> k:
        raise ValueError("rice stream codes a gap beyond the mask length")


def _check_last_position(top: int, length: int) -> None:
    if top >= length:
        raise ValueError(f"rice stream codes position {top} in a mask of length {length} (beyond its end)")


# -- many streams at once ---------------------------------------------------------------------------------
MAX_BATCH_K = 16  # rice_decode_batch reads remainders of up to this many bits (a gap mean of ~90,000)


class RiceStream(NamedTuple):
    """One Rice payload split by :func:`parse_rice_header`: the bit stream after the header, k, m, and the
    length of the mask it codes (every position must lie below it)."""

    body: bytes
    k: int
    m: int
    length: int


def rice_decode_batch(streams: list[RiceStream], shifts: list[int] | None = None) -> Tensor:
    """The coded positions of every stream, concatenated (each stream's m increasing positions in turn,
    plus the stream's entry of ``shifts`` when given):
    :func:`rice_decode_positions` of each, with ~25 tensor operations in all instead of ~10 per stream.
    Requires k ≤ :data:`MAX_BATCH_K`. Raises ValueError if a stream is inconsistent (without naming it:
    decode the streams one by one for the precise error)."""
    if not streams:
        return torch.zeros(0, dtype=torch.int64)
    counts = [s.m for s in streams]
    total_bytes, total_count, rows = 0, 0, []  # per stream: unary start bit, remainder start bit, k, first index
    for s in streams:
        if s.k > MAX_BATCH_K:
            raise ValueError(f"rice parameter k={s.k} is beyond the batch's {MAX_BATCH_K}")
        _check_remainders(s.m, s.k, len(s.body))
        rows.append((8 * total_bytes + s.m * s.k, 8 * total_bytes, s.k, total_count))
        total_bytes, total_count = total_bytes + len(s.body), total_count + s.m
    joined = b"".join(s.body for s in streams)
    data = tensor_from_bytes(joined + bytes(3))
    bound = 8 * total_bytes + max(shifts or [0]) + sum(s.m << s.k for s in streams) + max(s.length for s in streams)
    work = torch.int32 if bound < 1 << 31 else torch.int64  # int32 halves every pass (and its fresh pages)
    ends = set_bit_positions(tensor_from_bytes(_unary_only(joined, rows)), work)
    found = torch.searchsorted(ends, torch.tensor([row[0] for row in rows] + [8 * total_bytes], dtype=work)).tolist()
    if found[0] != 0 or [b - a for a, b in itertools.pairwise(found)] != counts:
        raise ValueError("a rice stream's unary code count disagrees with its header")
    # per coded position: its stream, and the stream's unary start, remainder start − first·k, k, 2^k − 1
    columns = [(a, b - first * k, k, (1 << k) - 1) for a, b, k, first in rows]
    stream_of, (unary, shifted, k, low) = per_element(counts, columns, work)
    local_end = ends.sub_(unary)
    remainders = read_varying_fields(data, torch.arange(total_count, dtype=work).mul_(k).add_(shifted), k, low)
    steps = remainders.sub_(low).cumsum_(0)  # Σ_{j≤i} (r_j + 1 − 2^k) over all streams so far
    before = torch.cat([steps.new_zeros(1), steps]).index_select(0, torch.tensor([row[3] for row in rows]))
    if shifts is not None:
        before -= torch.tensor(shifts, dtype=work)
    last = torch.tensor([row[3] + s.m - 1 for s, row in zip(streams, rows, strict=True) if s.m], dtype=torch.int64)
    last_ends = local_end.index_select(0, last).tolist()
    positions = local_end.bitwise_left_shift_(k).add_(steps).add_(low)  # in place: local_end is gone
    positions -= before.index_select(0, stream_of)
    tops = positions.index_select(0, last).tolist()
    if shifts is not None:
        used = [shift for shift, s in zip(shifts, streams, strict=True) if s.m]
        tops = [top - shift for top, shift in zip(tops, used, strict=True)]
    _check_batch_ends(streams, last_ends, tops)
    return positions.long()


def _unary_only(joined: bytes, rows: list[tuple[int, int, int, int]]) -> bytearray:
    """The streams' bytes with every remainder bit cleared: only the unary terminators stay set."""
    out = bytearray(joined)
    for unary, remainders, _, _ in rows:
        if unary > remainders:
            whole, part = divmod(unary - remainders, 8)
            start = remainders // 8
            out[start : start + whole] = bytes(whole)
            if part:
                out[start + whole] &= 0xFF ^ ((1 << part) - 1)
    return out


def _check_batch_ends(streams: list[RiceStream], last_ends: list[int], last_positions: list[int]) -> None:
    """Each stream's byte count, last gap and last position, as :func:`rice_decode_positions` checks them."""
    ends, tops = iter(last_ends), iter(last_positions)
    for s in streams:
        _check_end(s.m, s.k, next(ends) if s.m else -1, len(s.body), s.length)
        if s.m:
            _check_last_position(next(tops), s.length)
