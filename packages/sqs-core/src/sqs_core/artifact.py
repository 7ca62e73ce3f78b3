"""The compressed artifact: one safetensors file (never pickle) holding a prepared model's SQS weights.

``save`` writes, per posterior (tied layers share one), the bit-packed levels of the kept weights, the
sparsity mask, the codebooks and the alternatives Bayesian averaging needs (eq. infer-theta), plus every
uncompressed tensor of the model under the plain model's names, and a JSON header with SHA-256 checksums.
``load`` validates all of it and sets the weights of a plain ``skeleton`` model (the architecture before
``prepare_``): greedy (eq. greedy), one posterior draw, or :func:`load_bayesian_average` (eq. infer-bam),
with the same draws as in memory for the same ``torch.Generator`` seed. The format: docs/artifact.md.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import secrets
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn

from ._artifact_layout import check_record, decode_posterior, decode_weight, dtype_name, encode
from ._safetensors_format import safetensors_chunks
from .discrete import DiscretePosterior
from .inference import BayesianAverage, discrete_posteriors
from .layers import SQSLayer
from .prepare import posteriors, prepared_config

__all__ = ["FORMAT_VERSION", "MAGIC", "load", "load_bayesian_average", "save"]

log = logging.getLogger(__name__)

MAGIC = "sqs"
FORMAT_VERSION = 2  # version 2 added the escaped code layout (sqs_core._codes)
READABLE_VERSIONS = (1, 2)  # a version-1 file is a version-2 file without escaped records
METADATA_KEY = "sqs"  # the safetensors metadata entry holding the JSON header
PREFIX = "@sqs/"  # tensor names of compressed blobs: PREFIX + posterior name
CRC_TABLE = PREFIX + "crc32"  # CRC-32 of every other tensor, to name the damaged one
_CHECKSUM_KEYS = {"algorithm", "header", "payload", "crc32_table"}


# -- bytes and checksums ----------------------------------------------------------------------------------
def _raw(t: torch.Tensor) -> bytes | ctypes.Array:
    """The tensor's bytes as safetensors stores them (contiguous, little-endian host), without a copy."""
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("internal: checksummed tensors must be contiguous CPU tensors")
    nbytes = t.numel() * t.element_size()
    return (ctypes.c_char * nbytes).from_address(t.data_ptr()) if nbytes else b""


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _payload_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor in sorted-name order: UTF-8 name, NUL, dtype name, NUL, shape as
    comma-separated decimals, NUL, raw bytes; so names, dtypes and shapes are covered too."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}\0{dtype_name(t.dtype)}\0{','.join(map(str, t.shape))}\0".encode())
        h.update(_raw(t))
    return h.hexdigest()


def _crc_table(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """uint8 (4·n,): the little-endian CRC-32 of each tensor but the table itself, in sorted-name order."""
    crcs = b"".join(zlib.crc32(_raw(tensors[n])).to_bytes(4, "little") for n in sorted(tensors) if n != CRC_TABLE)
    return torch.tensor(list(crcs), dtype=torch.uint8)


# -- save -------------------------------------------------------------------------------------------------
def _plain_key(key: str, sqs_paths: set[str]) -> str | None:
    """A prepared model's state key under the plain model's names (``base_layer.`` dropped); None for
    posterior tensors, which only training needs."""
    kept, here = [], None  # here: the prepared model's name of the module reached so far
    for seg in key.split("."):
        if here in sqs_paths:
            if seg == "posterior":
                return None
            if seg == "base_layer":
                here = f"{here}.{seg}"
                continue
        kept.append(seg)
        here = seg if here is None else f"{here}.{seg}"
    return ".".join(kept)


def _layer_groups(model: nn.Module) -> tuple[dict[str, list[str]], set[str]]:
    """Posterior name -> every plain layer name that uses it (tied or repeated layers); all SQS paths."""
    names = {id(p): name for name, p in posteriors(model).items()}
    paths = {path for path, m in model.named_modules(remove_duplicate=False) if isinstance(m, SQSLayer)}
    groups: dict[str, list[str]] = {name: [] for name in names.values()}
    for path, m in model.named_modules(remove_duplicate=False):
        if isinstance(m, SQSLayer):
            plain = _plain_key(path, paths)
            if plain is not None and plain not in groups[names[id(m.posterior)]]:
                groups[names[id(m.posterior)]].append(plain)
    return groups, paths


def _dense_state(model: nn.Module, sqs_paths: set[str]) -> dict[str, torch.Tensor]:
    """Every uncompressed tensor of the model state, contiguous on the CPU, storage not shared."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, value in model.state_dict().items():
        plain = _plain_key(key, sqs_paths)
        if plain is None:
            continue
        if plain.startswith(PREFIX):
            raise ValueError(f"state key {plain!r} collides with the artifact's reserved prefix {PREFIX!r}")
        t = value.detach().cpu().contiguous()
        if t.numel() and t.untyped_storage().data_ptr() in seen:
            t = t.clone()  # safetensors refuses tensors that share memory (e.g. tied dense weights)
        seen.add(t.untyped_storage().data_ptr())
        out[plain] = t
    return out


def _check_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def save(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    nonzero: float | None = None,
    per_layer: bool = False,
    include_alternatives: bool = True,
) -> None:
    """Write the compressed artifact of a prepared ``model`` to ``path`` (atomically: all or nothing).

    ``nonzero`` / ``per_layer`` decide the pruning as in :func:`sqs_core.greedy_` (None keeps what the
    pruning schedule left); ``include_alternatives`` stores what sampling and Bayesian averaging need.
    """
    from . import __version__  # here, not at import time: the package imports this module

    config = prepared_config(model)
    _check_flag("per_layer", per_layer)
    _check_flag("include_alternatives", include_alternatives)
    target = Path(os.fspath(path))
    dists = discrete_posteriors(model, nonzero=nonzero, per_layer=per_layer)
    groups, sqs_paths = _layer_groups(model)
    tensors: dict[str, torch.Tensor] = {}
    records = []
    for name, d in dists.items():
        record, blob = encode(d, alternatives=include_alternatives)
        records.append({"layers": groups[name], **record})
        tensors[PREFIX + groups[name][0]] = blob  # the first plain layer name identifies the posterior
    tensors.update(_dense_state(model, sqs_paths))
    tensors[CRC_TABLE] = _crc_table(tensors)
    header = {
        "magic": MAGIC,
        "format_version": FORMAT_VERSION,
        "library": f"sqs-core {__version__}",
        "config": config.to_dict(),
        "nonzero": nonzero,
        "per_layer": per_layer,
        "alternatives": include_alternatives,
        "compressed": records,
    }
    header["checksum"] = {
        "algorithm": "sha256",
        "header": hashlib.sha256(_canonical(header).encode()).hexdigest(),
        "payload": _payload_sha256(tensors),
        "crc32_table": zlib.crc32(_raw(tensors[CRC_TABLE])),
    }
    chunks, keep_alive = safetensors_chunks(tensors, metadata={METADATA_KEY: _canonical(header)})
    _atomic_write(target, chunks)
    del keep_alive
    n_dense = len(tensors) - len(records) - 1
    size = sum(len(c) for c in chunks)
    log.info("saved %s: %d bytes, %d compressed tensors, %d dense", target, size, len(records), n_dense)


def _atomic_write(path: Path, chunks: list[bytes | ctypes.Array]) -> None:
    """Write ``chunks`` to a temporary file beside ``path``, fsync, then rename over it; nothing is left on error."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# -- read and validate --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Artifact:
    """A validated artifact: header, compressed records (in draw order), their blobs, the dense state."""

    path: str
    header: dict[str, Any]
    records: list[dict[str, Any]]
    blobs: dict[str, torch.Tensor]
    dense: dict[str, torch.Tensor]
    file_bytes: int
    header_bytes: int  # the 8-byte length prefix and the safetensors JSON header, padding included
    index_bytes: dict[str, int]  # bytes of each tensor's own entry in the safetensors JSON header

    def weights(self) -> dict[str, torch.Tensor]:
        """Greedy weight of every posterior, keyed by its first layer name."""
        return {r["layers"][0]: decode_weight(r["layers"][0], r, self.blobs[r["layers"][0]]) for r in self.records}

    def posteriors(self) -> dict[str, DiscretePosterior]:
        return {r["layers"][0]: decode_posterior(r["layers"][0], r, self.blobs[r["layers"][0]]) for r in self.records}


def read_artifact(path: str | os.PathLike) -> Artifact:
    """Read and validate an artifact (structure, magic, version, checksums); raises ValueError if damaged."""
    where = os.fspath(path)
    data = Path(where).read_bytes()
    try:
        tensors = safetensors.torch.load(data)
        raw = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    except Exception as exc:  # safetensors' own error types: wrap them all into one clear message
        raise ValueError(f"{where}: truncated or not a safetensors file (or its header is damaged): {exc}") from None
    text = (raw.get("__metadata__") or {}).get(METADATA_KEY)
    if text is None:
        raise ValueError(f"{where}: not an SQS artifact (no {METADATA_KEY!r} entry in the safetensors metadata)")
    try:
        header = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: the SQS header is not valid JSON (damaged file?): {exc}") from None
    _check_header(where, header)
    _check_payload(where, header["checksum"], tensors)
    records, blobs, dense = _split_tensors(where, header, tensors)
    header_bytes = 8 + int.from_bytes(data[:8], "little")
    index = {n: len(_canonical({n: v})) - 1 for n, v in raw.items() if n != "__metadata__"}  # incl. a comma
    return Artifact(where, header, records, blobs, dense, len(data), header_bytes, index)


def _check_header(where: str, header: Any) -> None:
    if not isinstance(header, dict) or header.get("magic") != MAGIC:
        raise ValueError(f"{where}: not an SQS artifact (bad magic in the header)")
    version = header.get("format_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise ValueError(
            f"{where}: unsupported format version {version!r} (this library reads versions {READABLE_VERSIONS})"
        )
    checksum = header.get("checksum")
    if not isinstance(checksum, dict) or checksum.get("algorithm") != "sha256" or set(checksum) != _CHECKSUM_KEYS:
        raise ValueError(f"{where}: the header's checksum entry is damaged: {checksum!r}")
    rest = {k: v for k, v in header.items() if k != "checksum"}
    if hashlib.sha256(_canonical(rest).encode()).hexdigest() != checksum.get("header"):
        raise ValueError(f"{where}: header checksum mismatch (SHA-256 of the JSON header): the file is damaged")


def _check_payload(where: str, checksum: dict, tensors: dict[str, torch.Tensor]) -> None:
    table = tensors.get(CRC_TABLE, torch.zeros(0))
    table_ok = table.dtype == torch.uint8 and table.dim() == 1
    table_ok = table_ok and zlib.crc32(_raw(table)) == checksum["crc32_table"]
    if table_ok and _payload_sha256(tensors) == checksum["payload"]:
        return
    names = [n for n in sorted(tensors) if n != CRC_TABLE]
    if not table_ok:
        culprit = f"the checksum table {CRC_TABLE!r}"
    else:
        stored = bytes(table.tolist())
        bad = [
            n
            for i, n in enumerate(names)
            if stored[4 * i : 4 * i + 4] != zlib.crc32(_raw(tensors[n])).to_bytes(4, "little")
        ]
        culprit = f"tensor(s) {bad}" if bad else "the tensor index (names, dtypes or shapes)"
    raise ValueError(f"{where}: payload checksum mismatch (SHA-256 over all tensors): {culprit} damaged")


def _split_tensors(where: str, header: dict, tensors: dict[str, torch.Tensor]):
    records = header.get("compressed")
    if not isinstance(records, list):
        raise ValueError(f"{where}: the header has no list of compressed tensors")
    blobs = {}
    for rec in records:
        layers = rec.get("layers") if isinstance(rec, dict) else None
        if not isinstance(layers, list) or not layers or not all(isinstance(n, str) for n in layers):
            raise ValueError(f"{where}: a compressed record has no layer names: {rec!r}")
        name = layers[0]
        blob = tensors.get(PREFIX + name)
        if blob is None or blob.dtype != torch.uint8 or blob.dim() != 1:
            raise ValueError(f"{where}: compressed tensor {name!r} is missing or not a 1-D uint8 entry")
        check_record(name, rec, blob.numel())
        blobs[name] = blob
    known = {PREFIX + n for n in blobs} | {CRC_TABLE}
    stray = sorted(n for n in tensors if n.startswith(PREFIX) and n not in known)
    if stray:
        raise ValueError(f"{where}: unexpected entries {stray}")
    dense = {n: t for n, t in tensors.items() if not n.startswith(PREFIX)}
    weights = Counter(f"{layer}.weight" for rec in records for layer in rec["layers"])
    clash = sorted(w for w, count in weights.items() if count > 1 or w in dense)
    if clash:
        raise ValueError(f"{where}: {clash} are stored more than once (in two records or also as dense tensors)")
    return records, blobs, dense


# -- load -------------------------------------------------------------------------------------------------
def _load_state(art: Artifact, skeleton: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Check the full state against the skeleton's (names, shapes, dtypes), then load it strictly."""
    state = dict(art.dense)
    for rec in art.records:
        for layer in rec["layers"]:
            state[f"{layer}.weight"] = weights[rec["layers"][0]]
    expected = skeleton.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{art.path} does not match the skeleton {type(skeleton).__name__}: "
            f"missing from the file {missing}, not in the skeleton {unexpected}"
        )
    wrong = [
        f"{key!r} has shape {tuple(value.shape)} ({value.dtype}) in the file but "
        f"{tuple(expected[key].shape)} ({expected[key].dtype}) in the skeleton"
        for key, value in state.items()
        if tuple(value.shape) != tuple(expected[key].shape) or value.dtype != expected[key].dtype
    ]
    if wrong:
        raise ValueError(f"{art.path} does not match the skeleton: " + "; ".join(wrong))
    skeleton.load_state_dict(state, strict=True)


def _check_skeleton(skeleton: Any) -> None:
    if not isinstance(skeleton, nn.Module):
        raise ValueError(f"skeleton must be a torch.nn.Module, got {type(skeleton).__name__}")
    if any(isinstance(m, SQSLayer) for m in skeleton.modules()):
        raise ValueError("skeleton must be the plain model (not prepared for SQS)")


def load(
    path: str | os.PathLike,
    skeleton: nn.Module,
    *,
    mode: str = "greedy",
    generator: torch.Generator | None = None,
) -> nn.Module:
    """Set ``skeleton``'s weights from the artifact at ``path``, in place; returns ``skeleton``.

    ``mode="greedy"`` gives μ_{k*} (eq. greedy); ``mode="sample"`` one draw of eq. infer-theta from
    ``generator``, equal to :func:`sqs_core.sample_` on the saved model with the same generator state.
    """
    _check_skeleton(skeleton)
    if mode not in ("greedy", "sample"):
        raise ValueError(f"mode must be 'greedy' or 'sample', got {mode!r}")
    if mode == "greedy" and generator is not None:
        raise ValueError("generator is only used with mode='sample'")
    art = read_artifact(path)
    if mode == "greedy":
        weights = art.weights()
    else:
        _check_alternatives(art)
        weights = {name: d.weights(d.draw(generator)) for name, d in art.posteriors().items()}
    _load_state(art, skeleton, weights)
    return skeleton


def _check_alternatives(art: Artifact) -> None:
    if not art.header.get("alternatives"):
        raise ValueError(f"{art.path} was saved with include_alternatives=False: it cannot be sampled")


def load_bayesian_average(
    path: str | os.PathLike,
    skeleton: nn.Module,
    *,
    samples: int = 4,
    generator: torch.Generator | None = None,
    average: str = "outputs",
) -> BayesianAverage:
    """Bayesian averaging (eq. infer-bam) of ``samples`` draws from the artifact, over ``skeleton``.

    Its outputs equal ``BayesianAverage(model, samples=samples, nonzero=..., generator=g)`` on the saved
    model for a generator in the same state.
    """
    _check_skeleton(skeleton)
    art = read_artifact(path)
    _check_alternatives(art)
    dists = art.posteriors()
    _load_state(art, skeleton, {name: d.weights() for name, d in dists.items()})
    params = skeleton.state_dict(keep_vars=True)
    setters = {rec["layers"][0]: _setter([params[f"{n}.weight"] for n in rec["layers"]]) for rec in art.records}
    return BayesianAverage.from_parts(skeleton, dists, setters, samples=samples, generator=generator, average=average)


def _setter(targets: list[torch.Tensor]) -> Callable[[torch.Tensor], None]:
    def setter(weight: torch.Tensor) -> None:
        with torch.no_grad():
            for t in targets:
                t.copy_(weight)

    return setter
