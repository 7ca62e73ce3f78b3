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

import functools

import torch
from torch import Tensor

from ._bits import check_packed, pack_bits, packed_length, unpack_bits
from ._rice import RICE_HEADER_BYTES, RicePlan, rice_decode_positions, rice_encode, rice_plan

__all__ = [
    "MASK_ENCODINGS",
    "RICE_HEADER_BYTES",
    "decode_kept_positions",
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
    check_packed(packed, bits, count)
    if codebook.dim() != 1 or not 1 <= codebook.numel() <= 1 << bits:
        raise ValueError(
            f"codebook must be 1-D with 1..{1 << bits} entries for bits={bits}, got shape {tuple(codebook.shape)}"
        )
    n_levels = codebook.numel()  # K
    if codebook.device != packed.device:
        codebook = codebook.to(packed.device)
    if 8 % bits != 0:
        idx = unpack_bits(packed, bits, count)
        top = int(idx.max()) if count else 0
        if top >= n_levels:
            raise ValueError(f"level index {top} out of range for a codebook of {n_levels} entries")
        return codebook.index_select(0, idx.to(torch.int32))
    rows = packed.to(torch.int32)
    if n_levels < 1 << bits:
        bad_byte = (_byte_fields(bits) >= n_levels).any(dim=1).to(packed.device)  # (256,) bytes holding one
        if bool(bad_byte.index_select(0, rows).any()):
            raise ValueError(f"a level index is out of range for a codebook of {n_levels} entries")
        codebook = torch.cat([codebook, codebook[-1:].expand((1 << bits) - n_levels)])  # never read
    values = codebook.new_empty(packed.numel() * 8 // bits)
    _gather_byte_rows(codebook.unsqueeze(0), bits, rows, values)
    return values[:count]


_ROW_DTYPES = {2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.complex128}
"""A dtype as wide as a row of values (the values of one code byte), to gather rows as single elements."""


def _gather_byte_rows(tables: Tensor, bits: int, rows: Tensor, out: Tensor) -> None:
    """b ∈ {1, 2, 4, 8}: ``out`` (len(rows)·8/b,) gets, for each row ``g·256 + byte`` (int32), the 8/b values
    in row g of ``tables`` (G, 2^b) that the fields of ``byte`` index: a gather of whole bytes from a
    (G·256, 8/b) table, each row as one element where a dtype is that wide (3× faster)."""
    fields = _byte_fields(bits)  # (256, 8 // b) the fields of every byte value
    if tables.device.type != "cpu":
        fields = fields.to(tables.device)
    row_values = tables.index_select(1, fields.view(-1)).view(-1, 8 // bits)  # (G·256, 8 / b)
    wide = _ROW_DTYPES.get(row_values.shape[1] * row_values.element_size())
    if wide is None:
        torch.index_select(row_values, 0, rows, out=out.view(-1, 8 // bits))
    else:
        torch.index_select(row_values.view(wide).view(-1), 0, rows, out=out.view(wide))


@functools.cache
def _byte_fields(bits: int) -> Tensor:
    """(256, 8 // bits) int64: the fields of each byte value (cached; never written to)."""
    byte_values = torch.arange(256, dtype=torch.uint8)
    return unpack_bits(byte_values, bits, 256 * 8 // bits).view(256, 8 // bits).long()


def mask_cost_bytes(mask: Tensor) -> dict[str, int]:
    """Payload size in bytes of each encoding applicable to ``mask`` ("all"/"none" only when exact)."""
    _check_mask(mask)
    return _costs(mask, rice_plan(mask))


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
    plan = rice_plan(mask)
    costs = _costs(mask, plan)
    if encoding is None:
        encoding = min(costs, key=lambda name: (costs[name], MASK_ENCODINGS.index(name)))
    elif encoding not in costs:
        raise ValueError(f"mask encoding {encoding!r} cannot represent this mask; applicable: {tuple(costs)}")
    if encoding in ("all", "none"):
        return encoding, torch.empty(0, dtype=torch.uint8, device=mask.device)
    if encoding == "bitmap":
        return encoding, pack_bits(mask, 1)
    return encoding, rice_encode(plan, mask.device)


def decode_mask(encoding: str, payload: Tensor, length: int) -> Tensor:
    """Inverse of :func:`encode_mask`; also accepts a ``"rice"`` or ``"bitmap"`` payload of any mask.

    Raises ``ValueError`` for an unknown encoding, a payload of the wrong size, or a corrupted
    Rice header or stream (e.g. a count or a position beyond ``length``).

    Returns:
        1-D bool tensor of length ``length`` on ``payload.device``.
    """
    _check_payload(payload, length)
    device = payload.device
    if encoding in ("all", "none"):
        if payload.numel():
            raise ValueError(f"mask encoding {encoding!r} has an empty payload, got {payload.numel()} bytes")
        return torch.full((length,), encoding == "all", dtype=torch.bool, device=device)
    if encoding == "bitmap":
        return unpack_bits(payload, 1, length).bool()
    if encoding == "rice":
        return _rice_mask(*rice_decode_positions(payload, length), length)
    raise ValueError(f"unknown mask encoding {encoding!r}; expected one of {MASK_ENCODINGS}")


def _rice_mask(positions: Tensor, inverted: bool, length: int) -> Tensor:
    """The (length,) bool mask of decoded Rice positions (the pruned ones when ``inverted``)."""
    mask = torch.full((length,), inverted, dtype=torch.bool, device=positions.device)
    mask[positions] = not inverted
    return mask


def decode_kept_positions(encoding: str, payload: Tensor, length: int) -> Tensor:
    """The kept positions (increasing int64) of an encoded mask: ``decode_mask(...).nonzero()``, but
    straight from a Rice code of the kept positions, so a dense weight is filled by one ``scatter_`` at
    the positions (several times faster than a boolean ``masked_scatter_``)."""
    if encoding == "rice":
        _check_payload(payload, length)
        positions, inverted = rice_decode_positions(payload, length)
        if not inverted:
            return positions
        return _rice_mask(positions, inverted, length).nonzero().squeeze(1)  # decoded once, not again
    if encoding == "bitmap":
        _check_payload(payload, length)
        return unpack_bits(payload, 1, length).nonzero().squeeze(1)  # uint8 0/1: no bool copy needed
    return decode_mask(encoding, payload, length).nonzero().flatten()


def _check_payload(payload: Tensor, length: int) -> None:
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"length must be a non-negative int, got {length!r}")
    if payload.dim() != 1 or payload.dtype != torch.uint8:
        raise ValueError(f"payload must be a 1-D uint8 tensor, got {payload.dtype} {tuple(payload.shape)}")


def _check_mask(mask: Tensor) -> None:
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
    if mask.dim() != 1:
        raise ValueError(f"mask must be 1-D, got shape {tuple(mask.shape)}")


def _costs(mask: Tensor, plan: RicePlan) -> dict[str, int]:
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
