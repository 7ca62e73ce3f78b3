"""The per-kept-weight codes of one compressed tensor: fixed-width ranks, or a primary stream with escapes.

Each kept weight's value is one of the U *used* codebook entries (section 3 of docs/artifact.md); its code
is the entry's rank r ∈ [0, U). Two layouts, the encoder keeps whichever is smaller:

* **plain** (format version 1): every code in ``code_bits = bits(U)`` bits (``codes``, and ``codes_hi``
  for the bits above 8).
* **escaped** (version 2, record fields ``escaped`` and ``escape_mask``): the 2^b most frequent used
  entries form the primary set P (``primary``: one bit per used entry, set for P). Every kept weight has a
  b-bit code, its rank within P (``codes``, b = ``code_bits`` < bits(U)); the weights whose entry is not in
  P (the *escaped* ones) are listed by ``escapes``, an ``encode_mask`` payload over the n kept weights
  (rank order), and their true entry's rank within S = used \\ P follows in ``escape_codes``, bits(U − 2^b)
  bits each. An escaped weight's primary code is 0 and is ignored.

With outlier windows nearly every kept weight sits in the central window, so its 2^b = K entries take
log2 K bits (the paper formula's charge) and the few tail weights pay for their positions instead of
every weight paying a window bit. Decoding gathers all n primary codes through one table and overwrites
the escaped ones: no boolean scatter over n.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._bits import set_bit_indices
from .packing import (
    MASK_ENCODINGS,
    decode_kept_positions,
    encode_mask,
    pack_bits,
    packed_length,
    unpack_bits,
    unpack_gather,
)

CODE_SECTIONS = ("codes", "codes_hi", "primary", "escapes", "escape_codes")
ESCAPE_RECORD_BYTES = 64
"""A conservative charge for the escaped layout's extra header fields (~50 B of record JSON before the
header is compressed), added when choosing the layout so that it is used only where it makes the file
smaller."""

_EMPTY = torch.zeros(0, dtype=torch.uint8)


def field_bits(n: int) -> int:
    """ceil(log2 n): the bits that index one of n symbols (0 when n ≤ 1)."""
    return (n - 1).bit_length() if n > 1 else 0


def _pack(values: Tensor, bits: int) -> Tensor:
    return pack_bits(values, bits) if bits else _EMPTY


def _unpack(packed: Tensor, bits: int, count: int) -> Tensor:
    if bits == 0:
        if packed.numel():
            raise ValueError(f"a 0-bit stream must be empty, got {packed.numel()} bytes")
        return torch.zeros(count, dtype=torch.uint8)
    return unpack_bits(packed, bits, count)


# -- encoding ---------------------------------------------------------------------------------------------
def encode_codes(ranks: Tensor, n_used: int) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(record fields, sections) coding ``ranks`` (n,) int64 in [0, U) in the smaller layout."""
    bits = field_bits(n_used)
    plain = {
        "codes": _pack(ranks & 0xFF if bits > 8 else ranks, min(bits, 8)),
        "codes_hi": _pack(ranks >> 8, bits - 8) if bits > 8 else _EMPTY,
    }
    # the smallest layout, ties to the earliest of plain, then primary_bits 1, 2, ...: each escaped candidate is
    # built only while its size without the escape mask's payload (exact, from the counts) could still win
    best: tuple[int, int, dict[str, Any], dict[str, Tensor]] = (_size(plain), 0, {"code_bits": bits}, plain)
    counts = torch.bincount(ranks, minlength=n_used)
    by_count = torch.argsort(-counts, stable=True)  # most used first, ties by lower rank
    covered = torch.cumsum(counts[by_count], 0)
    candidates = []
    for primary_bits in range(1, min(bits, 9)):
        if field_bits(n_used - (1 << primary_bits)) <= 8:
            escaped = ranks.numel() - int(covered[(1 << primary_bits) - 1])
            candidates.append((_size_without_mask(ranks.numel(), n_used, escaped, primary_bits), primary_bits))
    for floor, primary_bits in sorted(candidates):
        if floor > best[0]:
            break
        fields, sections = _escaped_layout(ranks, n_used, by_count[: 1 << primary_bits], primary_bits)
        size = _size(sections) + ESCAPE_RECORD_BYTES
        if (size, primary_bits) < best[:2]:
            best = (size, primary_bits, fields, sections)
    return best[2], best[3]


def _size_without_mask(n: int, n_used: int, escaped: int, primary_bits: int) -> int:
    """The escaped layout's bytes (with ESCAPE_RECORD_BYTES) but for the escape mask's payload: a lower bound."""
    escape_bits = field_bits(n_used - (1 << primary_bits))
    codes = packed_length(n, primary_bits) + packed_length(n_used, 1)
    return codes + (packed_length(escaped, escape_bits) if escape_bits else 0) + ESCAPE_RECORD_BYTES


def _escaped_layout(
    ranks: Tensor, n_used: int, primary_ranks: Tensor, primary_bits: int
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    in_primary = torch.zeros(n_used, dtype=torch.bool)
    in_primary[primary_ranks] = True
    within = torch.cumsum(in_primary, 0) - 1  # rank within P (for P's entries)
    within_rest = torch.cumsum(~in_primary, 0) - 1  # rank within S (for the others)
    escaped = ~in_primary[ranks]  # (n,)
    primary_codes = torch.where(escaped, 0, within[ranks])
    escape_bits = field_bits(n_used - (1 << primary_bits))
    mask_encoding, mask_payload = encode_mask(escaped)
    sections = {
        "codes": pack_bits(primary_codes, primary_bits),
        "primary": pack_bits(in_primary, 1),
        "escapes": mask_payload.cpu(),
        "escape_codes": _pack(within_rest[ranks[escaped]], escape_bits),
    }
    fields = {"code_bits": primary_bits, "escaped": int(escaped.sum()), "escape_mask": mask_encoding}
    return fields, sections


def _size(sections: dict[str, Tensor]) -> int:
    return sum(int(s.numel()) for s in sections.values())


# -- validation -------------------------------------------------------------------------------------------
def check_mask_encoding(name: str, field: str, value: Any) -> None:
    """A ValueError unless a record's mask field (``mask``, ``escape_mask``) names a known encoding."""
    if not isinstance(value, str) or value not in MASK_ENCODINGS:
        raise ValueError(f"compressed tensor {name!r}: field {field!r} must be one of {MASK_ENCODINGS}, got {value!r}")


def check_code_record(name: str, rec: dict, sizes: dict[str, int]) -> None:
    """Raise ValueError unless the record's code fields and computable code-section sizes agree."""
    n, used, bits = rec["kept"], rec["codes_used"], rec["code_bits"]
    if "escaped" not in rec and "escape_mask" not in rec:
        expected = {"codes": packed_length(n, min(bits, 8)) if bits else 0}
        expected["codes_hi"] = packed_length(n, bits - 8) if bits > 8 else 0
        expected |= {"primary": 0, "escapes": 0, "escape_codes": 0}
        if bits != field_bits(used):
            raise ValueError(f"compressed tensor {name!r}: code_bits {bits} does not index {used} used entries")
    else:
        escaped, escape_mask = rec.get("escaped"), rec.get("escape_mask")
        if isinstance(escaped, bool) or not isinstance(escaped, int) or not 0 <= escaped <= n:
            raise ValueError(f"compressed tensor {name!r}: field 'escaped' must be an int in [0, {n}], got {escaped!r}")
        check_mask_encoding(name, "escape_mask", escape_mask)
        if not (1 <= bits <= 8 and (1 << bits) < used and field_bits(used - (1 << bits)) <= 8):
            raise ValueError(f"compressed tensor {name!r}: bad escaped layout (code_bits {bits}, {used} used entries)")
        expected = {"codes": packed_length(n, bits), "codes_hi": 0, "primary": packed_length(used, 1)}
        rest_bits = field_bits(used - (1 << bits))
        expected["escape_codes"] = packed_length(escaped, rest_bits) if rest_bits else 0
    bad = {s: (sizes[s], size) for s, size in expected.items() if sizes[s] != size}
    if bad:
        raise ValueError(f"compressed tensor {name!r}: section sizes (stored, expected) {bad}")


# -- decoding ---------------------------------------------------------------------------------------------
def decode_ranks(name: str, rec: dict, parts: dict[str, Tensor]) -> Tensor:
    """(n,) int64: each kept weight's rank among the U used entries."""
    bits, n, n_used = rec["code_bits"], rec["kept"], rec["codes_used"]
    if "escaped" not in rec:
        ranks = _unpack(parts["codes"], min(bits, 8), n).long()
        if bits > 8:
            ranks |= _unpack(parts["codes_hi"], bits - 8, n).long() << 8
    else:
        primary_ranks, rest_ranks = _primary_split(name, rec, parts)
        ranks = primary_ranks[unpack_bits(parts["codes"], bits, n).long()]
        escape_at, escape_codes = _escapes(name, rec, parts)
        ranks[escape_at] = rest_ranks[escape_codes]
    if n and int(ranks.max()) >= n_used:
        raise ValueError(f"compressed tensor {name!r}: code {int(ranks.max())} out of range for {n_used} used entries")
    return ranks


def decode_values(name: str, rec: dict, parts: dict[str, Tensor], table: Tensor) -> Tensor:
    """(n,) the kept weights' values, ``table[rank]`` with ``table`` (U,) the used entries' levels."""
    bits, n = rec["code_bits"], rec["kept"]
    if "escaped" not in rec:
        if 1 <= bits <= 8:
            return unpack_gather(parts["codes"], bits, n, table)  # the fast path
        return table[decode_ranks(name, rec, parts)]
    primary_ranks, rest_ranks = _primary_split(name, rec, parts)
    values = unpack_gather(parts["codes"], bits, n, table[primary_ranks])
    escape_at, escape_codes = _escapes(name, rec, parts)
    values.scatter_(0, escape_at, table[rest_ranks][escape_codes])  # distinct positions
    return values


def _primary_split(name: str, rec: dict, parts: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(P's ranks, S's ranks), each increasing."""
    primary = set_bit_indices(parts["primary"], rec["codes_used"])
    if primary.numel() != 1 << rec["code_bits"]:
        raise ValueError(
            f"compressed tensor {name!r}: the primary set has {primary.numel()} entries, "
            f"code_bits {rec['code_bits']} needs {1 << rec['code_bits']}"
        )
    in_primary = set(primary.tolist())
    rest = [r for r in range(rec["codes_used"]) if r not in in_primary]
    return primary, torch.tensor(rest, dtype=torch.int64)


def _escapes(name: str, rec: dict, parts: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(ranks among the kept weights of the escaped ones, increasing; their codes within S)."""
    at = decode_kept_positions(str(rec["escape_mask"]), parts["escapes"], rec["kept"])
    if at.numel() != rec["escaped"]:
        raise ValueError(
            f"compressed tensor {name!r}: the escape mask marks {at.numel()} weights, the header says {rec['escaped']}"
        )
    rest = rec["codes_used"] - (1 << rec["code_bits"])
    bits = field_bits(rest)
    codes = _unpack(parts["escape_codes"], bits, at.numel()).long()
    if codes.numel() and rest < 1 << bits and int(codes.max()) >= rest:  # a full width cannot overflow
        raise ValueError(f"compressed tensor {name!r}: escape code {int(codes.max())} out of range for {rest} entries")
    return at, codes
