"""The stdlib safetensors writer: every file it writes reads back exactly through safetensors itself."""

from __future__ import annotations

import json

import pytest
import safetensors
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sqs_core._safetensors_format import SAFETENSORS_DTYPES, safetensors_chunks

_DTYPES = sorted(SAFETENSORS_DTYPES, key=str)


def _write(tensors, metadata=None) -> bytes:
    chunks, _alive = safetensors_chunks(tensors, metadata)
    return b"".join(bytes(c) for c in chunks)


def _random(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(
        0,
        256,
        (int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size(),),
        generator=g,
        dtype=torch.uint8,
    )
    return raw.view(dtype).reshape(shape) if raw.numel() else torch.empty(shape, dtype=dtype)


_shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)
_entries = st.dictionaries(
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8).filter(
        lambda n: n != "__metadata__"
    ),
    st.tuples(st.sampled_from(_DTYPES), _shapes, st.integers(0, 2**31)),
    max_size=6,
)


@settings(max_examples=60)
@given(_entries, st.booleans())
def test_written_files_read_back_exactly_through_safetensors(entries, with_metadata):
    tensors = {name: _random(dtype, shape, seed) for name, (dtype, shape, seed) in entries.items()}
    metadata = {"sqs": json.dumps({"k": [1, 2]}), "ü": "ß"} if with_metadata else None
    data = _write(tensors, metadata)
    assert (8 + int.from_bytes(data[:8], "little")) % 8 == 0  # tensor data starts 8-byte aligned
    back = safetensors.torch.load(data)
    assert back.keys() == tensors.keys()
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert torch.equal(back[name].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    assert header.get("__metadata__") == metadata


def test_non_contiguous_and_shared_tensors_are_written_as_values(tmp_path):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    tensors = {"t": base.t(), "a": base, "b": base}  # transposed view and shared storage
    path = tmp_path / "x.safetensors"
    path.write_bytes(_write(tensors))
    with safetensors.safe_open(str(path), framework="pt") as f:
        for name, t in tensors.items():
            assert torch.equal(f.get_tensor(name), t)


@pytest.mark.parametrize(
    ("tensors", "metadata", "message"),
    [
        ({"x": torch.zeros(2, dtype=torch.complex64)}, None, "dtype torch.complex64"),
        ({"": torch.zeros(2)}, None, "non-empty strings"),
        ({"__metadata__": torch.zeros(2)}, None, "other than '__metadata__'"),
        ({"x": torch.zeros(2)}, {"a": 1}, "map strings to strings"),
        ({"x": torch.zeros(2, 2).to_sparse()}, None, "dense"),
    ],
)
def test_rejects_what_the_format_cannot_hold(tensors, metadata, message):
    with pytest.raises(ValueError, match=message):
        safetensors_chunks(tensors, metadata)
