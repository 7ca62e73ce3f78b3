"""Write the safetensors format with the standard library; read it back with ``safetensors`` itself.

``safetensors.torch.save`` imports numpy (from safetensors 0.4 on, to reach the tensor bytes), and
sqs-core depends on torch and safetensors only. The format is small and fixed (github.com/huggingface/
safetensors, "Format"): an 8-byte little-endian header length N, N bytes of UTF-8 JSON mapping each
tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (plus an optional ``__metadata__``
of string to string), padded with spaces to a multiple of 8, then the tensors' raw little-endian bytes
back to back. We lay the tensors out as safetensors does (largest alignment first, then by name), so
files load zero-copy and mmap-aligned. Reading stays with ``safetensors.torch.load``, which checks
everything (offsets cover the buffer exactly, no overlaps, dtype sizes), so a bug here cannot pass
silently: tests/core/test_safetensors_format.py reads every written file back through it.
"""

from __future__ import annotations

import ctypes
import json
import sys

import torch

__all__ = ["SAFETENSORS_DTYPES", "safetensors_chunks"]

SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


def _buffer(t: torch.Tensor) -> bytes | ctypes.Array:
    """The tensor's bytes without a copy (the caller keeps ``t`` alive while the buffer is used)."""
    nbytes = t.numel() * t.element_size()
    return (ctypes.c_char * nbytes).from_address(t.data_ptr()) if nbytes else b""


def _checked(name: str, t: torch.Tensor) -> torch.Tensor:
    if not isinstance(name, str) or not name or name == "__metadata__":
        raise ValueError(f"safetensors tensor names must be non-empty strings other than '__metadata__': {name!r}")
    if t.dtype not in SAFETENSORS_DTYPES:
        raise ValueError(f"tensor {name!r}: dtype {t.dtype} has no safetensors name")
    if t.is_sparse or t.layout != torch.strided:
        raise ValueError(f"tensor {name!r}: only dense (strided) tensors can be stored, got {t.layout}")
    return t.detach().to("cpu").contiguous()


def safetensors_chunks(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> tuple[list[bytes | ctypes.Array], list[torch.Tensor]]:
    """The file as a list of buffers to write in order, and the tensors those buffers point into.

    Keep the second list alive until the buffers are written. Raises ValueError on an unsupported
    dtype, layout or name, or on a big-endian host (the format is little-endian).
    """
    if sys.byteorder != "little":
        raise ValueError("writing safetensors files is supported on little-endian hosts only")
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ValueError("safetensors metadata must map strings to strings")
    ready = {name: _checked(name, t) for name, t in tensors.items()}
    order = sorted(ready, key=lambda n: (-ready[n].element_size(), n))
    index: dict[str, object] = {} if metadata is None else {"__metadata__": dict(metadata)}
    offset = 0
    for name in order:
        t = ready[name]
        nbytes = t.numel() * t.element_size()
        index[name] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(index, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    chunks: list[bytes | ctypes.Array] = [len(text).to_bytes(8, "little"), text]
    chunks += [_buffer(ready[name]) for name in order]
    return chunks, [ready[name] for name in order]
