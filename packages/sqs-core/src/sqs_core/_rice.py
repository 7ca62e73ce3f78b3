"""Rice coding of sparsity masks (the "rice" encoding of ``sqs_core.packing``; layout in its docstring).

The coded positions p_0 < p_1 < … (the kept weights, or the pruned ones when fewer) become gaps
d_i = p_i − p_{i−1} − 1 (p_{−1} = −1), each written as a k-bit remainder d_i mod 2^k and a unary
quotient d_i >> k. Decoding returns the positions themselves, so a dense weight is filled by one
index_put instead of a boolean scatter.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from ._bits import SMALL_COUNT, pack_bits, read_fields, unpack_bits

__all__ = ["RICE_HEADER_BYTES", "RICE_INVERTED", "RicePlan", "rice_decode_positions", "rice_encode", "rice_plan"]

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
    if payload.numel() < RICE_HEADER_BYTES:
        raise ValueError(f"rice payload needs a {RICE_HEADER_BYTES}-byte header, got {payload.numel()} bytes")
    header = bytes(payload[:RICE_HEADER_BYTES].tolist())
    flags, k, m = header[0], header[1], int.from_bytes(header[2:], "little")
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
    body = payload[RICE_HEADER_BYTES:]
    total_bits = 8 * body.numel()
    if m * k > total_bits:
        raise ValueError(f"rice stream of {total_bits} bits is too short for {m} remainders of {k} bits")
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
    last_end = int(ends[-1]) if m else -1
    used = m * k + last_end + 1
    if (used + 7) // 8 != body.numel():
        raise ValueError(f"rice stream has {body.numel()} bytes, its codes need {(used + 7) // 8}")
    if not m:
        return ends, inverted
    if last_end - (m - 1) > (length - 1) >> k:  # Σ q_j alone already passes the mask's end
        raise ValueError("rice stream codes a gap beyond the mask length")
    positions = ends  # in place from here on: fresh tensors of m int64 each cost page faults
    if k:
        offsets = (read_fields(body, k, m) if remainders is None else remainders).add_(1 - (1 << k)).cumsum_(0)
        positions.bitwise_left_shift_(k).add_(offsets).add_((1 << k) - 1)
    if int(positions[-1]) >= length:
        raise ValueError(f"rice stream codes position {int(positions[-1])} in a mask of length {length}")
    return positions, inverted
