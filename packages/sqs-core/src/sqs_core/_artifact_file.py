"""The artifact's container: which safetensors entries hold what, checksums, and reading with validation.

Format version 2 (docs/artifact.md, sections 1–6): the safetensors metadata entry ``sqs`` holds a small
JSON object (magic, version, checksums); the rest of the header (library, config, pruning, the compressed
records) is zlib-compressed canonical JSON in the ``@sqs/header`` tensor; the records' blobs are
concatenated, in record order, in ``@sqs/blobs``; ``@sqs/crc32`` names damaged tensors. A 20-layer
model's records take ~8 KB as escaped JSON in the metadata, ~1.5 KB compressed, and one blob tensor saves
an index entry per layer: for small models that is several percent of the file.

Version 1 (read, no longer written) kept the whole header in the metadata and one ``@sqs/<name>``
tensor per record.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from ._artifact_layout import FLOAT_DTYPES, check_record, decode_posterior, dtype_name, record_name, weight_keys
from ._batch_decode import decode_weights
from .discrete import DiscretePosterior

MAGIC = "sqs"
FORMAT_VERSION = 2  # version 2: compressed header tensor, one blob tensor, escaped code layout (sqs_core._codes)
READABLE_VERSIONS = (1, 2)
METADATA_KEY = "sqs"  # the safetensors metadata entry holding the JSON header (v2: magic, version, checksum)
PREFIX = "@sqs/"  # reserved tensor-name prefix
HEADER_TENSOR = PREFIX + "header"  # v2: zlib(canonical JSON of the header body)
BLOBS_TENSOR = PREFIX + "blobs"  # v2: every record's blob, in record order
CRC_TABLE = PREFIX + "crc32"  # CRC-32 of every other tensor, to name the damaged one
MAX_HEADER_BYTES = 1 << 26  # a decompressed header larger than this is refused (no decompression bombs)
_CHECKSUM_KEYS = {"algorithm", "header", "payload", "crc32_table"}


# -- bytes and checksums ----------------------------------------------------------------------------------
def raw_bytes(t: torch.Tensor) -> bytes | ctypes.Array:
    """The tensor's bytes as safetensors stores them (contiguous, little-endian host), without a copy."""
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("internal: checksummed tensors must be contiguous CPU tensors")
    nbytes = t.numel() * t.element_size()
    return (ctypes.c_char * nbytes).from_address(t.data_ptr()) if nbytes else b""


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def header_sha256(header: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the whole header (metadata fields and body) without ``checksum``."""
    return hashlib.sha256(canonical({k: v for k, v in header.items() if k != "checksum"}).encode()).hexdigest()


def _payload_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor in sorted-name order: UTF-8 name, NUL, dtype name, NUL, shape as
    comma-separated decimals, NUL, raw bytes; so names, dtypes and shapes are covered too."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}\0{dtype_name(t.dtype)}\0{','.join(map(str, t.shape))}\0".encode())
        h.update(raw_bytes(t))
    return h.hexdigest()


def _crc_table(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """uint8 (4·n,): the little-endian CRC-32 of each tensor but the table itself, in sorted-name order."""
    crcs = b"".join(zlib.crc32(raw_bytes(tensors[n])).to_bytes(4, "little") for n in sorted(tensors) if n != CRC_TABLE)
    return torch.tensor(list(crcs), dtype=torch.uint8)


# -- writing ----------------------------------------------------------------------------------------------
def container(
    body: dict[str, Any], blobs: list[torch.Tensor], dense: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, safetensors metadata) of a version-2 file. ``body["compressed"]`` are the records, each
    given its blob's CRC-32 (``crc32``) so that a damaged blob is named by layer."""
    for record, blob in zip(body["compressed"], blobs, strict=True):
        record["crc32"] = zlib.crc32(raw_bytes(blob))
    packed = zlib.compress(canonical(body).encode(), 9)
    tensors = dict(dense)
    tensors[HEADER_TENSOR] = torch.frombuffer(bytearray(packed), dtype=torch.uint8)
    tensors[BLOBS_TENSOR] = torch.cat(blobs) if blobs else torch.zeros(0, dtype=torch.uint8)
    meta: dict[str, Any] = {"magic": MAGIC, "format_version": FORMAT_VERSION}
    meta["checksum"] = seal(meta | body, tensors)
    return tensors, {METADATA_KEY: canonical(meta)}


def seal(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Add the CRC table to ``tensors`` and return the ``checksum`` entry for ``header`` (the whole header,
    without ``checksum``) and every tensor (section 5 of docs/artifact.md)."""
    tensors[CRC_TABLE] = _crc_table(tensors)
    return {
        "algorithm": "sha256",
        "header": header_sha256(header),
        "payload": _payload_sha256(tensors),
        "crc32_table": zlib.crc32(raw_bytes(tensors[CRC_TABLE])),
    }


# -- reading ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Artifact:
    """A validated artifact: header, compressed records (in draw order), their blobs, the dense state."""

    path: str
    header: dict[str, Any]  # the whole header: metadata fields and (v2) the decompressed body
    records: list[dict[str, Any]]
    blobs: dict[str, torch.Tensor]
    dense: dict[str, torch.Tensor]
    file_bytes: int
    header_bytes: int  # length prefix, safetensors JSON header with padding, and (v2) the header tensor
    index_bytes: dict[str, int]  # bytes of each tensor's own entry in the safetensors JSON header

    def weights(self, into: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Greedy weight of every posterior, keyed by its record's name (:func:`record_name`; decoded in batches:
        the tensors may be views of shared buffers); written into the tensors of ``into`` where given (keyed the
        same, of the records' shapes), nothing written unless every weight decodes."""
        return decode_weights(self.records, self.blobs, into)

    def posteriors(self) -> dict[str, DiscretePosterior]:
        """The discrete posterior of every record, keyed by its record's name; refuses alternative
        probabilities that are NaN, infinite or negative (they would make every draw meaningless)."""
        out = {}
        for rec in self.records:
            name = record_name(rec)
            d = out[name] = decode_posterior(name, rec, self.blobs[name])
            if not bool(torch.isfinite(d.alt_probs).all()) or bool((d.alt_probs < 0).any()):
                raise ValueError(
                    f"{self.path}: compressed tensor {name!r} has alternative probabilities that are NaN, "
                    "infinite or negative: the file is damaged or was saved from a non-finite posterior"
                )
        return out


def check_path(name: str, value: Any) -> str:
    """``value`` as a ``str`` path if it is a non-empty ``str`` or ``os.PathLike`` without NUL characters,
    else a ValueError naming ``name`` (``""`` would otherwise mean the current folder)."""
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name} must be a file path (str or os.PathLike), got {value!r} ({type(value).__name__})")
    where = os.fsdecode(os.fspath(value))
    if not where or "\0" in where:
        raise ValueError(f"{name} must name a file (non-empty, without NUL characters), got {where!r}")
    return where


def read_artifact(path: str | os.PathLike) -> Artifact:
    """Read and validate an artifact (structure, magic, version, checksums, finite codebooks); raises
    ValueError if damaged."""
    where = check_path("path", path)
    data = Path(where).read_bytes()
    try:
        tensors = safetensors.torch.load(data)
        raw = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    except Exception as exc:  # safetensors' own error types: wrap them all into one clear message
        raise ValueError(f"{where}: truncated or not a safetensors file (or its header is damaged): {exc}") from None
    text = (raw.get("__metadata__") or {}).get(METADATA_KEY)
    if text is None:
        raise ValueError(f"{where}: not an SQS artifact (no {METADATA_KEY!r} entry in the safetensors metadata)")
    meta = _parse_json(where, text)
    _check_meta(where, meta)
    _check_payload(where, meta["checksum"], tensors)
    header = meta if meta["format_version"] == 1 else meta | _body(where, tensors)
    if header_sha256(header) != meta["checksum"]["header"]:
        raise ValueError(f"{where}: header checksum mismatch (SHA-256 of the JSON header): the file is damaged")
    records, blobs, dense = _split_tensors(where, header, tensors)
    header_bytes = 8 + int.from_bytes(data[:8], "little")
    header_bytes += tensors[HEADER_TENSOR].numel() if HEADER_TENSOR in tensors else 0
    index = {n: len(canonical({n: v})) - 1 for n, v in raw.items() if n != "__metadata__"}  # incl. a comma
    return Artifact(where, header, records, blobs, dense, len(data), header_bytes, index)


def _parse_json(where: str, text: str | bytes) -> Any:
    """The header's JSON; a ValueError naming the file for text that is not JSON, holds NaN or Infinity (Python's
    json reads them; they failed later, in the checksum, without the file's name) or nests beyond Python's
    recursion limit (a RecursionError before)."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise ValueError(f"{where}: the SQS header is not valid JSON (damaged file?): {exc}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_meta(where: str, meta: Any) -> None:
    if not isinstance(meta, dict) or meta.get("magic") != MAGIC:
        raise ValueError(f"{where}: not an SQS artifact (bad magic in the header)")
    version = meta.get("format_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise ValueError(
            f"{where}: unsupported format version {version!r} (this library reads versions {READABLE_VERSIONS})"
        )
    checksum = meta.get("checksum")
    if not isinstance(checksum, dict) or checksum.get("algorithm") != "sha256" or set(checksum) != _CHECKSUM_KEYS:
        raise ValueError(f"{where}: the header's checksum entry is damaged: {checksum!r}")
    if version == 2 and set(meta) != {"magic", "format_version", "checksum"}:
        raise ValueError(f"{where}: unexpected fields in the metadata header: {sorted(meta)}")


def _body(where: str, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The decompressed, parsed ``@sqs/header`` of a version-2 file."""
    packed = _uint8_entry(where, tensors, HEADER_TENSOR)
    inflate = zlib.decompressobj()
    try:
        text = inflate.decompress(bytes(raw_bytes(packed)), MAX_HEADER_BYTES)
    except zlib.error as exc:
        raise ValueError(f"{where}: the header tensor {HEADER_TENSOR!r} does not decompress: {exc}") from None
    if inflate.unconsumed_tail or not inflate.eof:
        raise ValueError(f"{where}: the header tensor is truncated or decompresses beyond {MAX_HEADER_BYTES} bytes")
    body = _parse_json(where, text)
    if not isinstance(body, dict) or set(body) & {"magic", "format_version", "checksum"}:
        raise ValueError(f"{where}: the compressed header must be a JSON object without magic, version or checksum")
    return body


def _check_payload(where: str, checksum: dict, tensors: dict[str, torch.Tensor]) -> None:
    table = tensors.get(CRC_TABLE, torch.zeros(0))
    table_ok = table.dtype == torch.uint8 and table.dim() == 1
    table_ok = table_ok and zlib.crc32(raw_bytes(table)) == checksum["crc32_table"]
    if table_ok and _payload_sha256(tensors) == checksum["payload"]:
        return
    names, detail = [n for n in sorted(tensors) if n != CRC_TABLE], ""
    if not table_ok:
        culprit = f"the checksum table {CRC_TABLE!r}"
    else:
        stored = bytes(table.tolist())
        bad = [
            n
            for i, n in enumerate(names)
            if stored[4 * i : 4 * i + 4] != zlib.crc32(raw_bytes(tensors[n])).to_bytes(4, "little")
        ]
        culprit = f"tensor(s) {bad}" if bad else "the tensor index (names, dtypes or shapes)"
        if BLOBS_TENSOR in bad and HEADER_TENSOR not in bad:
            detail = _damaged_blobs(where, tensors)
    raise ValueError(f"{where}: payload checksum mismatch (SHA-256 over all tensors): {culprit} damaged{detail}")


def _damaged_blobs(where: str, tensors: dict[str, torch.Tensor]) -> str:
    """' (the blob(s) of [...])', the damaged records by their CRC-32s (the header itself is intact)."""
    try:
        records = _body(where, tensors)["compressed"]
        blobs = _slices(where, records, tensors[BLOBS_TENSOR])
        bad = [n for n, r in zip(blobs, records, strict=True) if zlib.crc32(raw_bytes(blobs[n])) != r.get("crc32")]
    except (ValueError, KeyError, TypeError):
        return ""
    return f" (the blob(s) of {bad})" if bad else ""


def _slices(where: str, records: list, blobs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each record's blob, cut from ``@sqs/blobs`` by the records' section sizes (in record order)."""
    out, start = {}, 0
    for rec in records:
        sections = rec.get("sections") if isinstance(rec, dict) else None
        sizes = sections.values() if isinstance(sections, dict) else [None]
        if not all(isinstance(v, int) and v >= 0 for v in sizes):
            raise ValueError(f"{where}: a compressed record has bad section sizes: {sections!r}")
        size = sum(sizes)
        out[_record_name(where, rec)] = blobs[start : start + size]
        start += size
    if start != blobs.numel():
        raise ValueError(
            f"{where}: the records' sections add up to {start} bytes, {BLOBS_TENSOR!r} has {blobs.numel()}"
        )
    return out


def _record_name(where: str, rec: Any) -> str:
    """:func:`record_name` of a record whose ``layers`` and ``parameters`` are checked first."""
    layers = rec.get("layers") if isinstance(rec, dict) else None
    if not isinstance(layers, list) or not layers or not all(isinstance(n, str) for n in layers):
        raise ValueError(f"{where}: a compressed record has no layer names: {rec!r}")
    names = rec.get("parameters")
    if names is not None and not (
        isinstance(names, list)
        and len(names) == len(layers)
        and all(isinstance(n, str) and n.isidentifier() for n in names)
    ):
        raise ValueError(f"{where}: record {layers[0]!r} has bad parameter names {names!r} (one identifier per layer)")
    return record_name(rec)


def _split_tensors(where: str, header: dict, tensors: dict[str, torch.Tensor]):
    records = header.get("compressed")
    if not isinstance(records, list):
        raise ValueError(f"{where}: the header has no list of compressed tensors")
    if header["format_version"] == 1:
        names = [_record_name(where, r) for r in records]
        blobs = {n: _uint8_entry(where, tensors, PREFIX + n) for n in names}
        known = {PREFIX + n for n in blobs} | {CRC_TABLE}
    else:
        blobs = _slices(where, records, _uint8_entry(where, tensors, BLOBS_TENSOR))
        known = {HEADER_TENSOR, BLOBS_TENSOR, CRC_TABLE}
    if len(blobs) != len(records):
        raise ValueError(f"{where}: two compressed records share a name (first layer and parameter)")
    for rec, (name, blob) in zip(records, blobs.items(), strict=True):
        check_record(name, rec, blob.numel())
        _check_codebook(where, name, rec, blob)
    stray = sorted(n for n in tensors if n.startswith(PREFIX) and n not in known)
    if stray:
        raise ValueError(f"{where}: unexpected entries {stray}")
    dense = {n: t for n, t in tensors.items() if not n.startswith(PREFIX)}
    weights = Counter(key for rec in records for key in weight_keys(rec))
    clash = sorted(w for w, count in weights.items() if count > 1 or w in dense)
    if clash:
        raise ValueError(f"{where}: {clash} are stored more than once (in two records or also as dense tensors)")
    return records, blobs, dense


def _check_codebook(where: str, name: str, rec: dict, blob: torch.Tensor) -> None:
    """Refuse NaN or infinite levels μ_wk: they would decode to NaN or infinite weights. The codebook is the
    blob's first section (docs/artifact.md) and small (W'·K <= 256² levels): checking it costs nothing."""
    levels = blob[: rec["sections"].get("codebook", 0)].clone().view(FLOAT_DTYPES[rec["dtype"]])
    bad = int((~torch.isfinite(levels)).sum())
    if bad:
        raise ValueError(
            f"{where}: compressed tensor {name!r} has {bad} NaN or infinite codebook level(s): the file is "
            "damaged or was saved from a non-finite posterior"
        )


def _uint8_entry(where: str, tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    t = tensors.get(name)
    if t is None or t.dtype != torch.uint8 or t.dim() != 1:
        raise ValueError(f"{where}: {name!r} is missing or not a 1-D uint8 entry")
    return t
