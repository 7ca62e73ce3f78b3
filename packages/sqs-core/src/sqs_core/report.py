"""Compression report of an artifact: the paper's rate next to what the file really costs.

The paper's compression rate (eq. compression-rate) over the compressed layers is

    rate = 32·T / (Σ_l log2(K_l)·nnz_l + 32·K_total)

with T the compressed weights (a tied tensor counted once), nnz_l the kept weights of tensor l, and
K_total every codebook entry the file stores (K per window that holds a kept weight). It ignores where
the non-zeros are; ``paper_plus_mask_rate`` adds one mask bit per weight (+T bits). ``file_rate`` is
32·T over the bits of everything stored for the compressed tensors: their blobs, the CRC table and their
share of the file header (the whole header but the dense tensors' own index entries). Per layer, that
shared overhead (header share and CRC table) is split in proportion to T. Every number is measured from
the file; for an in-memory model the report saves it to a temporary file first.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ._artifact_file import read_artifact, record_name
from ._artifact_layout import GROUPS, field_bits, parameter_names
from .artifact import save

__all__ = ["CompressionReport", "LayerReport", "compression_report"]


def _rate(weights: int, bits: float) -> float:
    return 32 * weights / bits if bits > 0 else math.inf


@dataclass(frozen=True, kw_only=True)
class LayerReport:
    """One compressed tensor (its first layer's name; tied layers are listed in ``layers``; ``parameter`` the layer's
    compressed parameter, ``weight`` but for nn.MultiheadAttention's ``in_proj_weight`` or a registered type's)."""

    name: str
    layers: tuple[str, ...]
    T: int
    nnz: int
    K: int
    bits: int  # ceil(log2 K): the paper's index width
    windows: int  # windows whose codebook is stored
    paper_rate: float
    bytes_indices: int
    bytes_mask: int
    bytes_codebook: int
    bytes_alternatives: int
    bytes_shared: float  # this tensor's share of the header and CRC table
    file_rate: float
    effective_bits_per_weight: float
    parameter: str = "weight"


@dataclass(frozen=True, kw_only=True)
class CompressionReport:
    """Sizes and rates of one artifact; see the module docstring for every definition."""

    path: str | None
    format_version: int
    nonzero: float | None  # the non-zero rate requested at save (None: the pruning schedule's)
    layers: tuple[LayerReport, ...]
    compressed_weights: int  # T
    nonzero_weights: int  # Σ nnz
    codebook_entries: int  # K_total
    paper_bytes: float  # (Σ log2 K · nnz + 32·K_total) / 8
    paper_plus_mask_bytes: float  # paper_bytes + T / 8
    paper_rate: float
    paper_plus_mask_rate: float
    compressed_bytes: int  # everything stored for the compressed tensors, header share included
    file_rate: float
    effective_bits_per_weight: float
    alternative_bytes: int  # the part of compressed_bytes only Bayesian averaging / sampling needs
    header_bytes: int
    dense_bytes: int  # uncompressed tensors and their index entries
    file_bytes: int
    fp32_bytes: int  # 4 bytes per element of the model state (a tied tensor once)
    model_rate: float  # fp32_bytes / file_bytes

    @property
    def nonzero_rate(self) -> float:
        return self.nonzero_weights / self.compressed_weights if self.compressed_weights else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["nonzero_rate"] = self.nonzero_rate
        return out

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **{"indent": 2, **kwargs})

    def __str__(self) -> str:
        head = (
            "layer",
            "T",
            "nnz",
            "K",
            "bits",
            "W",
            "paper×",
            "index B",
            "mask B",
            "codebook B",
            "alt B",
            "file×",
            "bits/w",
        )
        rows = [head]
        for r in self.layers:
            rows.append(
                (
                    r.name if r.parameter == "weight" else f"{r.name}.{r.parameter}",
                    f"{r.T:,}",
                    f"{r.nnz:,}",
                    str(r.K),
                    str(r.bits),
                    str(r.windows),
                    f"{r.paper_rate:.2f}",
                    f"{r.bytes_indices:,}",
                    f"{r.bytes_mask:,}",
                    f"{r.bytes_codebook:,}",
                    f"{r.bytes_alternatives:,}",
                    f"{r.file_rate:.2f}",
                    f"{r.effective_bits_per_weight:.3f}",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
        lines = [
            f"SQS artifact {self.path or '(in memory)'} (format {self.format_version}): "
            f"{len(self.layers)} compressed tensor(s), {self.compressed_weights:,} weights, "
            f"{100 * self.nonzero_rate:.2f}% non-zero"
        ]
        for row in rows:
            cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
            lines.append("  ".join(cells))
        lines += [
            f"paper rate {self.paper_rate:.2f}x | paper + 1 mask bit/weight "
            f"{self.paper_plus_mask_rate:.2f}x | "
            f"file {self.file_rate:.2f}x ({self.effective_bits_per_weight:.3f} bits/weight, "
            f"{self.compressed_bytes:,} B incl. {self.alternative_bytes:,} B of alternatives)",
            f"whole file {self.file_bytes:,} B (header {self.header_bytes:,} B, "
            f"dense {self.dense_bytes:,} B) "
            f"vs fp32 {self.fp32_bytes:,} B: {self.model_rate:.2f}x",
        ]
        return "\n".join(lines)


def compression_report(path_or_model: str | os.PathLike | nn.Module, *, nonzero: float | None = None):
    """The :class:`CompressionReport` of an artifact file, or of a prepared model saved with ``nonzero``."""
    if not isinstance(path_or_model, (str, os.PathLike, nn.Module)):
        raise ValueError(
            "path_or_model must be an artifact's path (str or os.PathLike) or a prepared torch.nn.Module, "
            f"got {path_or_model!r} ({type(path_or_model).__name__})"
        )
    if isinstance(path_or_model, nn.Module):
        with tempfile.TemporaryDirectory(prefix="sqs-report-") as folder:
            path = Path(folder) / "model.sqs"
            save(path_or_model, path, nonzero=nonzero)
            return _report(path, in_memory=True)
    if nonzero is not None:
        raise ValueError("nonzero applies to an in-memory model; a file's pruning was fixed when it was saved")
    return _report(path_or_model, in_memory=False)


def _report(path: str | os.PathLike, *, in_memory: bool, art=None) -> CompressionReport:
    """The report of the artifact at ``path``; ``art``: that file's read_artifact result, if the caller has it."""
    art = read_artifact(path) if art is None else art
    blob_bytes = {record_name(r): art.blobs[record_name(r)].numel() for r in art.records}
    dense_index = sum(art.index_bytes[n] for n in art.dense)
    dense_payload = sum(t.numel() * t.element_size() for t in art.dense.values())
    dense_bytes = dense_payload + dense_index
    compressed_bytes = art.file_bytes - dense_bytes  # blobs, CRC table and the rest of the header
    shared = compressed_bytes - sum(blob_bytes.values())
    total_t = sum(_numel(r["shape"]) for r in art.records)
    layers = tuple(_layer(r, shared * _numel(r["shape"]) / max(total_t, 1)) for r in art.records)
    index_bits = sum(math.log2(r.K) * r.nnz for r in layers)
    entries = sum(r.windows * r.K for r in layers)
    paper_bits = index_bits + 32 * entries
    fp32 = 4 * (total_t + sum(t.numel() for t in art.dense.values()))
    return CompressionReport(
        path=None if in_memory else os.fspath(path),
        format_version=art.header["format_version"],
        nonzero=art.header.get("nonzero"),
        layers=layers,
        compressed_weights=total_t,
        nonzero_weights=sum(r.nnz for r in layers),
        codebook_entries=entries,
        paper_bytes=paper_bits / 8,
        paper_plus_mask_bytes=(paper_bits + total_t) / 8,
        paper_rate=_rate(total_t, paper_bits),
        paper_plus_mask_rate=_rate(total_t, paper_bits + total_t),
        compressed_bytes=compressed_bytes,
        file_rate=_rate(total_t, 8 * compressed_bytes),
        effective_bits_per_weight=8 * compressed_bytes / total_t if total_t else 0.0,
        alternative_bytes=sum(r.bytes_alternatives for r in layers),
        header_bytes=art.header_bytes,
        dense_bytes=dense_bytes,
        file_bytes=art.file_bytes,
        fp32_bytes=fp32,
        model_rate=fp32 / art.file_bytes,
    )


def _numel(shape: list[int]) -> int:
    return math.prod(shape)


def _layer(rec: dict[str, Any], shared: float) -> LayerReport:
    sizes = rec["sections"]
    group = {g: sum(sizes.get(s, 0) for s in names) for g, names in GROUPS.items()}
    t, k, nnz, windows = _numel(rec["shape"]), rec["K"], rec["kept"], rec["stored_windows"]
    total = sum(group.values()) + shared
    return LayerReport(
        name=rec["layers"][0],
        layers=tuple(rec["layers"]),
        parameter=parameter_names(rec)[0],
        T=t,
        nnz=nnz,
        K=k,
        bits=field_bits(k),
        windows=windows,
        paper_rate=_rate(t, math.log2(k) * nnz + 32 * windows * k),
        bytes_indices=group["indices"],
        bytes_mask=group["mask"],
        bytes_codebook=group["codebook"],
        bytes_alternatives=group["alternatives"],
        bytes_shared=shared,
        file_rate=_rate(t, 8 * total),
        effective_bits_per_weight=8 * total / t if t else 0.0,
    )
