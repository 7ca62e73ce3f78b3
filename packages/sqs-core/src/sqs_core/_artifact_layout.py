"""Byte layout of one compressed tensor inside an SQS artifact (the format is specified in docs/artifact.md).

A :class:`~sqs_core.discrete.DiscretePosterior` becomes one 1-D ``uint8`` blob, the concatenation of the
sections of :data:`SECTIONS` (empty ones take no bytes), plus a JSON record of the numbers needed to read it:

* ``codebook``  (W', K) levels μ_wk of the windows holding at least one kept weight, in the weight's dtype.
* ``mask``      the pruning decision (T,) encoded by :func:`~sqs_core.packing.encode_mask`.
* ``used``      one bit per codebook entry (row-major): used by the greedy level of some kept weight.
* ``codes``     per kept weight (flat order), the rank of its (window, level) entry among the used
                entries, ``code_bits = ceil(log2 U)`` bits each (U used entries; low 8 bits here when
                ``code_bits > 8``, the rest in ``codes_hi``); or the escaped layout of
                :mod:`sqs_core._codes` (sections ``primary``, ``escapes``, ``escape_codes``), if smaller.
* ``alt_mask``  which kept weights have alternatives (a mask over the kept weights, encode_mask again).
* ``alt_sets`` (layout "bitmap": K bits per alternative weight, level k set when its probability > 0) or
  ``alt_counts`` + ``alt_levels`` (layout "csr": count − 1 in ceil(log2 K) bits, then the levels,
  ascending, in ceil(log2 K) bits), whichever is smaller.
* ``alt_probs`` the non-zero probabilities, float16, in the same (row, ascending level) order.

Joint (window, level) codes over the used entries never take more bits than separate level and window
streams (U ≤ W'·K), and decode with a single table gather.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._bits import set_bit_indices
from ._codes import (
    CODE_SECTIONS,
    check_code_record,
    check_mask_encoding,
    decode_ranks,
    decode_values,
    encode_codes,
    field_bits,
)
from .discrete import DiscretePosterior
from .packing import (
    decode_kept_positions,
    decode_mask,
    encode_mask,
    pack_bits,
    packed_length,
    unpack_bits,
)

SECTIONS = (
    "codebook",
    "mask",
    "used",
    "codes",
    "codes_hi",
    "primary",
    "escapes",
    "escape_codes",
    "alt_mask",
    "alt_sets",
    "alt_counts",
    "alt_levels",
    "alt_probs",
)
# How the report groups the sections.
GROUPS = {
    "codebook": ("codebook",),
    "mask": ("mask",),
    "indices": ("used", *CODE_SECTIONS),
    "alternatives": ("alt_mask", "alt_sets", "alt_counts", "alt_levels", "alt_probs"),
}
MAX_NUMEL = 1 << 62  # weights a record's shape may hold (torch's sizes are int64)
FLOAT_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _as_bytes(t: Tensor) -> Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def record_name(rec: dict) -> str:
    """A record's name (its blob's and its posterior's, in the file): its first layer's name, followed by
    ``.{parameter}`` where that layer compresses another parameter than ``weight`` (so that the records of a module
    with several compressed parameters, an LSTM's, have names of their own)."""
    parameter = parameter_names(rec)[0]
    return rec["layers"][0] if parameter == "weight" else f"{rec['layers'][0]}.{parameter}"


def weight_keys(rec: dict) -> list[str]:
    """The state keys of a record's tensor, one per layer: ``{layer}.weight``, or ``{layer}.{parameter}`` where
    the record lists ``parameters`` (one per layer; ``in_proj_weight`` of an nn.MultiheadAttention)."""
    return [f"{layer}.{name}" for layer, name in zip(rec["layers"], parameter_names(rec), strict=True)]


def parameter_names(rec: dict) -> list[str]:
    """The parameter each of a record's layers compresses (``weight`` where the record lists none)."""
    return rec.get("parameters") or ["weight"] * len(rec["layers"])


# -- encoding ---------------------------------------------------------------------------------------------
def encode(d: DiscretePosterior, *, alternatives: bool) -> tuple[dict[str, Any], Tensor]:
    """(record, blob) for one posterior; the record lacks the caller's names (``layers``)."""
    keep = d.keep.reshape(-1).detach().cpu().bool()
    k = int(d.codebook.shape[1])
    windows = d.window_ids.reshape(-1).cpu().long()
    levels = d.greedy.reshape(-1).cpu().long()
    full = d.codebook.detach().cpu()  # (W, K)
    kept_windows = windows[keep]
    stored = torch.zeros(full.shape[0], dtype=torch.bool)
    stored[kept_windows] = True
    remap = torch.cumsum(stored, 0) - 1  # window id -> row of the stored codebook
    codebook = full[stored].contiguous()  # (W', K)
    joint = remap[kept_windows] * k + levels[keep]  # (n,) entry of the stored codebook
    used = torch.zeros(codebook.numel(), dtype=torch.bool)
    used[joint] = True
    code_index = (torch.cumsum(used, 0) - 1)[joint]  # (n,) rank among the used entries
    n_used = int(used.sum())
    code_fields, code_sections = encode_codes(code_index, n_used)
    mask_encoding, mask_payload = encode_mask(keep)
    sections = {"codebook": _as_bytes(codebook), "mask": mask_payload.cpu(), "used": pack_bits(used, 1)}
    sections |= code_sections
    record: dict[str, Any] = {
        "shape": list(d.shape),
        "dtype": dtype_name(full.dtype),
        "K": k,
        "windows": int(full.shape[0]),
        "stored_windows": int(codebook.shape[0]),
        "kept": int(keep.sum()),
        "codes_used": n_used,
        "mask": mask_encoding,
        "alternatives": 0,
    }
    record |= code_fields
    if alternatives:
        _encode_alternatives(d, keep, k, record, sections)
    record["sections"] = {name: int(s.numel()) for name, s in sections.items() if s.numel()}
    blob = torch.cat([sections[name] for name in SECTIONS if name in sections])
    return record, blob


def _encode_alternatives(d, keep: Tensor, k: int, record: dict, sections: dict) -> None:
    rank = torch.full((keep.numel(),), -1, dtype=torch.long)
    rank[keep] = torch.arange(int(keep.sum()))
    alt_rank = rank[d.alt_index.cpu().long()]
    chosen = alt_rank >= 0  # pruned weights need no alternatives: their value is 0 whatever the level
    alt_rank, order = alt_rank[chosen].sort()
    probs = d.alt_probs.detach().cpu().float()[chosen][order]  # (n_a, K), rows by increasing position
    if not alt_rank.numel():
        return
    present = probs > 0
    counts = present.sum(1)
    if bool((counts == 0).any()):
        raise ValueError("every alternatives row needs a positive probability")
    alt_mask = torch.zeros(int(keep.sum()), dtype=torch.bool)
    alt_mask[alt_rank] = True
    record["alt_mask"], sections["alt_mask"] = encode_mask(alt_mask)
    n_alt, n_entries, bits = int(alt_rank.numel()), int(present.sum()), field_bits(k)  # bits >= 1: K >= 2
    csr_bytes = packed_length(n_alt, bits) + packed_length(n_entries, bits)
    if packed_length(n_alt * k, 1) <= csr_bytes:
        record["alt_layout"] = "bitmap"
        sections["alt_sets"] = pack_bits(present.reshape(-1), 1)
    else:
        record["alt_layout"] = "csr"
        sections["alt_counts"] = pack_bits(counts - 1, bits)
        sections["alt_levels"] = pack_bits(present.nonzero()[:, 1], bits)
    sections["alt_probs"] = _as_bytes(probs[present].half())
    record["alternatives"] = n_alt
    record["alt_entries"] = n_entries


# -- decoding ---------------------------------------------------------------------------------------------
def check_record(name: str, rec: Any, blob_bytes: int) -> None:
    """Raise ValueError when a record's numbers are inconsistent (before any tensor is decoded)."""
    if not isinstance(rec, dict):
        raise ValueError(f"compressed tensor {name!r}: record must be a JSON object")
    ints = ("K", "windows", "stored_windows", "kept", "codes_used", "code_bits", "alternatives")
    for key in ints:
        if isinstance(rec.get(key), bool) or not isinstance(rec.get(key), int) or rec[key] < 0:
            raise ValueError(f"compressed tensor {name!r}: field {key!r} must be an int >= 0, got {rec.get(key)!r}")
    shape = rec.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise ValueError(f"compressed tensor {name!r}: bad shape {shape!r}")
    if not isinstance(rec.get("dtype"), str) or rec["dtype"] not in FLOAT_DTYPES:
        raise ValueError(f"compressed tensor {name!r}: unsupported dtype {rec.get('dtype')!r}")
    numel = _numel(shape)
    if numel >= MAX_NUMEL:
        raise ValueError(f"compressed tensor {name!r}: shape {shape} holds {numel} weights, beyond {MAX_NUMEL}")
    _check_mask_field(name, rec.get("mask"), rec["kept"], numel)
    entries = rec["stored_windows"] * rec["K"]
    if not (
        2 <= rec["K"] <= 256
        and rec["stored_windows"] <= rec["windows"] <= 256
        and rec["kept"] <= numel
        and rec["codes_used"] <= entries
        and rec["alternatives"] <= rec["kept"]
        and (rec["kept"] == 0) == (rec["codes_used"] == 0)
    ):
        raise ValueError(f"compressed tensor {name!r}: inconsistent record {rec}")
    sections = rec.get("sections")
    if not isinstance(sections, dict) or not set(sections) <= set(SECTIONS):
        raise ValueError(f"compressed tensor {name!r}: bad sections {sections!r}")
    sizes = {s: sections.get(s, 0) for s in SECTIONS}
    if not all(isinstance(v, int) and v >= 0 for v in sizes.values()) or sum(sizes.values()) != blob_bytes:
        raise ValueError(f"compressed tensor {name!r}: sections {sections} do not add up to {blob_bytes} bytes")
    itemsize = torch.empty(0, dtype=FLOAT_DTYPES[rec["dtype"]]).element_size()
    expected = {"codebook": entries * itemsize, "used": packed_length(entries, 1)}
    bad = {s: (sizes[s], n) for s, n in expected.items() if sizes[s] != n}
    if bad:
        raise ValueError(f"compressed tensor {name!r}: section sizes (stored, expected) {bad}")
    check_code_record(name, rec, sizes)


def _check_mask_field(name: str, mask: Any, kept: int, numel: int) -> None:
    """The mask encoding is known, and "all" / "none" agree with the kept count: checked from the header alone,
    before a decoder allocates the shape's weights (a crafted shape of 2^30 with "all" and 96 kept asked for 8 GiB)."""
    check_mask_encoding(name, "mask", mask)
    if (mask == "all" and kept != numel) or (mask == "none" and kept != 0):
        raise ValueError(f"compressed tensor {name!r}: mask {mask!r} with {kept} of {numel} weights kept")


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _split(rec: dict, blob: Tensor) -> dict[str, Tensor]:
    out, start = {}, 0
    empty = blob[:0]
    for name in SECTIONS:
        size = rec["sections"].get(name, 0)
        out[name] = blob[start : start + size] if size else empty  # most sections are empty: one view
        start += size
    return out


class _Decoded:
    """The parts shared by greedy decoding and the full discrete posterior."""

    def __init__(self, name: str, rec: dict, blob: Tensor) -> None:
        self.name, self.rec, self.parts = name, rec, _split(rec, blob)
        self.numel = _numel(rec["shape"])
        self.positions = decode_kept_positions(rec["mask"], self.parts["mask"], self.numel)  # (n,) increasing
        if self.positions.numel() != rec["kept"]:
            raise ValueError(
                f"compressed tensor {name!r}: the mask keeps {self.positions.numel()} weights, "
                f"the header says {rec['kept']}"
            )
        dtype = FLOAT_DTYPES[rec["dtype"]]
        self.codebook = self.parts["codebook"].clone().view(dtype).reshape(rec["stored_windows"], rec["K"])
        self.entries = set_bit_indices(self.parts["used"], self.codebook.numel())  # (U,) into the codebook
        if self.entries.numel() != rec["codes_used"]:
            raise ValueError(
                f"compressed tensor {name!r}: {self.entries.numel()} used codebook entries, "
                f"the header says {rec['codes_used']}"
            )

    @property
    def keep(self) -> Tensor:
        """(T,) bool, True at the kept positions."""
        keep = torch.zeros(self.numel, dtype=torch.bool)
        keep[self.positions] = True
        return keep

    def code_index(self) -> Tensor:
        """(n,) each kept weight's rank among the used entries."""
        return decode_ranks(self.name, self.rec, self.parts)

    def kept_values(self) -> Tensor:
        table = self.codebook.reshape(-1)[self.entries]  # (U,) the values the codes index
        return decode_values(self.name, self.rec, self.parts, table)


def decode_weight(name: str, rec: dict, blob: Tensor) -> Tensor:
    """The greedy sparse quantized weight (eq. greedy), θ's shape; pruned weights are +0."""
    dec = _Decoded(name, rec, blob)
    out = torch.zeros(dec.numel, dtype=dec.codebook.dtype)
    out.scatter_(0, dec.positions, dec.kept_values())  # positions are distinct: scatter_ is index_put, faster
    return out.reshape(rec["shape"])


def decode_posterior(name: str, rec: dict, blob: Tensor) -> DiscretePosterior:
    """The discrete inference distribution restricted to the kept weights (pruned ones have level 0)."""
    dec = _Decoded(name, rec, blob)
    k = rec["K"]
    joint = dec.entries[dec.code_index()]  # (n,) flat stored-codebook entry of each kept weight
    window_ids = torch.zeros(dec.numel, dtype=torch.uint8)
    greedy = torch.zeros(dec.numel, dtype=torch.uint8)
    window_ids[dec.positions] = (joint // k).to(torch.uint8)
    greedy[dec.positions] = (joint % k).to(torch.uint8)
    keep = dec.keep
    alt_index, alt_probs = _decode_alternatives(rec, dec.parts, keep)
    # A fully pruned tensor stores no codebook row; one row of zeros lets weights() index something.
    codebook = dec.codebook if dec.codebook.shape[0] else dec.codebook.new_zeros(1, k)
    return DiscretePosterior(
        shape=tuple(rec["shape"]),
        codebook=codebook,
        window_ids=window_ids,
        greedy=greedy,
        keep=keep,
        alt_index=alt_index,
        alt_probs=alt_probs,
    )


def _decode_alternatives(rec: dict, parts: dict[str, Tensor], keep: Tensor) -> tuple[Tensor, Tensor]:
    k, n_alt = rec["K"], rec["alternatives"]
    if n_alt == 0:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, k)
    alt_mask = decode_mask(str(rec.get("alt_mask")), parts["alt_mask"], rec["kept"])
    ranks = alt_mask.nonzero().squeeze(1)
    if ranks.numel() != n_alt:
        raise ValueError(f"the alternatives mask marks {ranks.numel()} weights, the header says {n_alt}")
    alt_index = keep.nonzero().squeeze(1)[ranks]  # (n_a,) flat positions, increasing
    n_entries, bits = rec.get("alt_entries"), field_bits(k)
    if not isinstance(n_entries, int) or not n_alt <= n_entries <= n_alt * k:
        raise ValueError(f"bad alternative entry count {n_entries!r}")
    layout = rec.get("alt_layout")
    if layout == "bitmap":
        present = unpack_bits(parts["alt_sets"], 1, n_alt * k).bool().reshape(n_alt, k)
        if int(present.sum()) != n_entries or not bool(present.any(1).all()):
            raise ValueError("the alternatives' level sets disagree with the header")
        rows, cols = present.nonzero().unbind(1)
    elif layout == "csr":
        counts = unpack_bits(parts["alt_counts"], bits, n_alt).long() + 1
        if int(counts.sum()) != n_entries:
            raise ValueError(f"the alternatives' counts add up to {int(counts.sum())}, not {n_entries}")
        rows = torch.repeat_interleave(torch.arange(n_alt), counts)
        cols = unpack_bits(parts["alt_levels"], bits, n_entries).long()
        if n_entries and int(cols.max()) >= k:
            raise ValueError(f"an alternative level is out of range for K={k}")
    else:
        raise ValueError(f"unknown alternatives layout {layout!r}")
    if parts["alt_probs"].numel() != 2 * n_entries:
        raise ValueError(f"alt_probs has {parts['alt_probs'].numel()} bytes, expected {2 * n_entries}")
    probs = torch.zeros(n_alt, k)
    probs[rows, cols] = parts["alt_probs"].clone().view(torch.float16).float()
    return alt_index, probs
