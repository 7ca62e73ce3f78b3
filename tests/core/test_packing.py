"""Tests for sqs_core.packing: bit packing of level indices and sparsity-mask codecs.

The layout is checked against an independent reference built from Python integers: the packed
stream is the little-endian byte string of ``sum(v_i << (i * bits))``.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sqs_core._bits import PYTHON_BITS, SMALL_COUNT, read_fields, set_bit_indices
from sqs_core.packing import (
    MASK_ENCODINGS,
    RICE_HEADER_BYTES,
    decode_kept_positions,
    decode_mask,
    encode_mask,
    mask_cost_bytes,
    pack_bits,
    packed_length,
    unpack_bits,
    unpack_gather,
)

BITS = st.integers(min_value=1, max_value=8)


@st.composite
def packed_values(draw: st.DrawFn, max_size: int = 80) -> tuple[int, list[int]]:
    """(bits, values) with every value in [0, 2**bits)."""
    bits = draw(BITS)
    values = draw(st.lists(st.integers(0, (1 << bits) - 1), max_size=max_size))
    return bits, values


# Densities from empty to full, including the tiny and dense ones where Rice coding pays.
DENSITIES = st.one_of(
    st.sampled_from([0.0, 0.002, 0.02, 0.1, 0.5, 0.9, 0.98, 0.998, 1.0]),
    st.floats(min_value=0.0, max_value=1.0),
)


@st.composite
def masks(draw: st.DrawFn, max_length: int = 600) -> torch.Tensor:
    """A 1-D bool mask of any length and density (Bernoulli entries from a drawn seed)."""
    length = draw(st.integers(0, max_length))
    density = draw(DENSITIES)
    seed = draw(st.integers(0, 2**32 - 1))
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(length, generator=generator) < density


def _reference_pack(values: list[int], bits: int) -> bytes:
    stream = sum(v << (i * bits) for i, v in enumerate(values))
    return stream.to_bytes((len(values) * bits + 7) // 8, "little")


def _reference_rice_bytes(mask: torch.Tensor) -> int:
    """Smallest Rice payload over every k, from the gaps computed in plain Python."""
    kept = mask.tolist()
    coded = not (sum(kept) > len(kept) - sum(kept))  # code the rarer value
    positions = [i for i, x in enumerate(kept) if x == coded]
    gaps = [b - a - 1 for a, b in zip([-1, *positions], positions, strict=False)]
    best = min(len(gaps) * (k + 1) + sum(d >> k for d in gaps) for k in range(40))
    return RICE_HEADER_BYTES + (best + 7) // 8


# --- pack_bits / unpack_bits -------------------------------------------------------------------


@given(packed_values())
def test_pack_matches_reference_layout_and_round_trips(case: tuple[int, list[int]]) -> None:
    bits, values = case
    tensor = torch.tensor(values, dtype=torch.int64)
    packed = pack_bits(tensor, bits)
    assert packed.dtype == torch.uint8
    assert packed.numel() == packed_length(len(values), bits) == math.ceil(len(values) * bits / 8)
    assert bytes(packed.tolist()) == _reference_pack(values, bits)
    unpacked = unpack_bits(packed, bits, len(values))
    assert unpacked.dtype == torch.uint8
    assert unpacked.tolist() == values


@given(packed_values())
def test_last_byte_padding_is_zero(case: tuple[int, list[int]]) -> None:
    bits, values = case
    # All-ones values make every used bit 1, so any stray padding bit would show.
    ones = torch.full((len(values),), (1 << bits) - 1, dtype=torch.uint8)
    packed = pack_bits(ones, bits)
    used = len(values) * bits % 8
    if used:
        assert int(packed[-1]) == (1 << used) - 1
    assert all(byte == 255 for byte in packed[: len(values) * bits // 8].tolist())


def test_pack_known_bytes() -> None:
    assert pack_bits(torch.tensor([1, 2, 3, 0]), 2).tolist() == [0b00_11_10_01]
    assert pack_bits(torch.tensor([5, 3]), 3).tolist() == [0b00_011_101]
    assert pack_bits(torch.tensor([True, False, True]), 1).tolist() == [0b101]
    assert pack_bits(torch.tensor([], dtype=torch.int64), 5).numel() == 0


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64, torch.int16])
def test_pack_accepts_integer_dtypes(dtype: torch.dtype) -> None:
    values = torch.tensor([0, 7, 3, 5, 1], dtype=dtype)
    assert unpack_bits(pack_bits(values, 3), 3, 5).tolist() == values.tolist()


@given(packed_values().filter(lambda case: len(case[1]) > 0))
def test_unpack_rejects_truncated_or_overlong(case: tuple[int, list[int]]) -> None:
    bits, values = case
    packed = pack_bits(torch.tensor(values), bits)
    expected = packed.numel()
    with pytest.raises(ValueError, match=f"has {expected - 1} bytes, expected {expected}"):
        unpack_bits(packed[:-1], bits, len(values))
    longer = torch.cat([packed, torch.zeros(1, dtype=torch.uint8)])
    with pytest.raises(ValueError, match=f"has {expected + 1} bytes, expected {expected}"):
        unpack_bits(longer, bits, len(values))


def test_unpack_rejects_nonzero_padding() -> None:
    packed = pack_bits(torch.tensor([1, 2, 3]), 2)
    packed[-1] |= 0b1100_0000
    with pytest.raises(ValueError, match="padding"):
        unpack_bits(packed, 2, 3)


@pytest.mark.parametrize("bits", [0, 9, -1, True, 2.0])
def test_bits_out_of_range(bits: object) -> None:
    with pytest.raises(ValueError, match="bits"):
        pack_bits(torch.tensor([0, 1]), bits)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bits"):
        unpack_bits(torch.zeros(1, dtype=torch.uint8), bits, 1)  # type: ignore[arg-type]


def test_pack_and_unpack_validate_arguments() -> None:
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        pack_bits(torch.tensor([0, 4]), 2)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        pack_bits(torch.tensor([-1, 0]), 2)
    with pytest.raises(TypeError, match="integer"):
        pack_bits(torch.tensor([0.0, 1.0]), 2)
    with pytest.raises(ValueError, match="1-D"):
        pack_bits(torch.zeros(2, 2, dtype=torch.int64), 2)
    with pytest.raises(TypeError, match="uint8"):
        unpack_bits(torch.zeros(1, dtype=torch.int64), 2, 4)
    with pytest.raises(ValueError, match="count"):
        unpack_bits(torch.zeros(1, dtype=torch.uint8), 2, -4)


@given(packed_values(), st.data())
def test_unpack_gather_matches_codebook_lookup(case: tuple[int, list[int]], data: st.DataObject) -> None:
    bits, values = case
    n_levels = data.draw(st.integers(max(values, default=0) + 1, 1 << bits), label="K")
    codebook = torch.linspace(-1.0, 1.0, n_levels, dtype=torch.float64)
    packed = pack_bits(torch.tensor(values, dtype=torch.int64), bits)
    decoded = unpack_gather(packed, bits, len(values), codebook)
    assert decoded.dtype == torch.float64
    assert torch.equal(decoded, codebook[torch.tensor(values, dtype=torch.int64)])


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_unpack_gather_rejects_index_beyond_codebook(bits: int) -> None:
    packed = pack_bits(torch.tensor([0, (1 << bits) - 1, 1]), bits)
    with pytest.raises(ValueError, match="out of range"):
        unpack_gather(packed, bits, 3, torch.zeros((1 << bits) - 1))
    with pytest.raises(ValueError, match="codebook"):
        unpack_gather(packed, bits, 3, torch.zeros((1 << bits) + 1))


# --- sparsity masks ----------------------------------------------------------------------------


@given(masks())
def test_every_applicable_encoding_round_trips_at_its_cost(mask: torch.Tensor) -> None:
    costs = mask_cost_bytes(mask)
    assert {"bitmap", "rice"} <= set(costs) <= set(MASK_ENCODINGS)
    for encoding, cost in costs.items():
        name, payload = encode_mask(mask, encoding=encoding)
        assert name == encoding
        assert payload.dtype == torch.uint8 and payload.numel() == cost
        assert torch.equal(decode_mask(name, payload, mask.numel()), mask)
        assert torch.equal(decode_kept_positions(name, payload, mask.numel()), mask.nonzero().flatten())


@given(
    st.binary(min_size=0, max_size=40),
    st.integers(1, 57),
    st.integers(0, 40),
    st.integers(0, 7),
)
def test_read_fields_matches_python_integers(raw: bytes, bits: int, count: int, start: int) -> None:
    count = min(count, max(0, (8 * len(raw) - start) // bits))
    stream = torch.tensor(list(raw), dtype=torch.uint8)
    whole = int.from_bytes(raw, "little")
    want = [(whole >> (start + i * bits)) & ((1 << bits) - 1) for i in range(count)]
    assert read_fields(stream, bits, count, start).tolist() == want


@given(masks())
def test_chosen_encoding_is_smallest_and_round_trips(mask: torch.Tensor) -> None:
    name, payload = encode_mask(mask)
    costs = mask_cost_bytes(mask)
    assert payload.numel() == min(costs.values()) <= costs["bitmap"] == math.ceil(mask.numel() / 8)
    assert torch.equal(decode_mask(name, payload, mask.numel()), mask)


@given(masks(max_length=300))
def test_rice_parameter_is_optimal(mask: torch.Tensor) -> None:
    assert mask_cost_bytes(mask)["rice"] == _reference_rice_bytes(mask)


@pytest.mark.parametrize("length", [0, 1, 9, 1000])
def test_constant_masks_use_empty_payloads(length: int) -> None:
    for value, expected in ((True, "all"), (False, "none")):
        mask = torch.full((length,), value)
        name, payload = encode_mask(mask)
        assert name == expected or length == 0
        assert payload.numel() == 0
        assert torch.equal(decode_mask(name, payload, length), mask)


@pytest.mark.parametrize("density", [0.01, 0.05, 0.2, 0.8, 0.95, 0.99])
def test_rice_is_near_entropy_for_sparse_and_dense_masks(density: float) -> None:
    # Bernoulli(p) masks carry n·H(p) bits; Rice on geometric gaps stays within a few percent,
    # and coding the pruned positions makes dense masks as cheap as sparse ones.
    n = 20_000
    mask = torch.rand(n, generator=torch.Generator().manual_seed(0)) < density
    p = mask.double().mean().item()  # the realized density: the entropy of this very mask
    entropy_bytes = -n * (p * math.log2(p) + (1 - p) * math.log2(1 - p)) / 8
    name, payload = encode_mask(mask)
    assert name == "rice"
    assert payload.numel() <= 1.06 * entropy_bytes + RICE_HEADER_BYTES
    assert payload[0].item() == int(density > 0.5)  # the inverted flag


def test_encode_mask_validates_arguments() -> None:
    with pytest.raises(TypeError, match="bool"):
        encode_mask(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="1-D"):
        encode_mask(torch.zeros(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="'all' cannot represent"):
        encode_mask(torch.tensor([True, False]), encoding="all")
    with pytest.raises(ValueError, match="'zip' cannot represent"):
        encode_mask(torch.tensor([True, False]), encoding="zip")


def _rice_payload(mask: torch.Tensor) -> torch.Tensor:
    return encode_mask(mask, encoding="rice")[1].clone()


SPARSE = torch.zeros(100, dtype=torch.bool).index_fill_(0, torch.tensor([3, 40, 41, 97]), True)


def test_decode_mask_rejects_bad_payloads() -> None:
    with pytest.raises(ValueError, match="unknown mask encoding"):
        decode_mask("zip", torch.zeros(0, dtype=torch.uint8), 4)
    with pytest.raises(ValueError, match="empty payload"):
        decode_mask("all", torch.zeros(1, dtype=torch.uint8), 4)
    with pytest.raises(ValueError, match="expected 2"):
        decode_mask("bitmap", torch.zeros(1, dtype=torch.uint8), 9)
    with pytest.raises(ValueError, match="header"):
        decode_mask("rice", torch.zeros(RICE_HEADER_BYTES - 1, dtype=torch.uint8), 4)
    with pytest.raises(ValueError, match="length"):
        decode_mask("none", torch.zeros(0, dtype=torch.uint8), -1)


def test_decode_mask_rejects_corrupted_rice_header() -> None:
    payload = _rice_payload(SPARSE)
    assert torch.equal(decode_mask("rice", payload, 100), SPARSE)
    too_many = payload.clone()
    too_many[2:10] = torch.tensor(list((101).to_bytes(8, "little")), dtype=torch.uint8)
    with pytest.raises(ValueError, match="101 positions in a mask of length 100"):
        decode_mask("rice", too_many, 100)
    fewer = payload.clone()
    fewer[2] -= 1
    with pytest.raises(ValueError, match="unary codes"):
        decode_mask("rice", fewer, 100)
    flags = payload.clone()
    flags[0] = 4
    with pytest.raises(ValueError, match="flags"):
        decode_mask("rice", flags, 100)
    big_k = payload.clone()
    big_k[1] = 60
    with pytest.raises(ValueError, match="k=60"):
        decode_mask("rice", big_k, 100)


def test_decode_mask_rejects_truncated_overlong_or_misplaced_rice_stream() -> None:
    payload = _rice_payload(SPARSE)
    with pytest.raises(ValueError, match="rice"):
        decode_mask("rice", payload[:-1], 100)
    with pytest.raises(ValueError, match="rice stream has"):
        decode_mask("rice", torch.cat([payload, torch.zeros(1, dtype=torch.uint8)]), 100)
    with pytest.raises(ValueError, match="position 97 in a mask of length 90"):
        decode_mask("rice", payload, 90)


@given(masks(max_length=200), st.data())
def test_decode_mask_corruption_raises_value_error_or_decodes(mask: torch.Tensor, data: st.DataObject) -> None:
    payload = _rice_payload(mask)
    index = data.draw(st.integers(0, payload.numel() - 1), label="byte")
    payload[index] ^= data.draw(st.integers(1, 255), label="xor")
    try:
        decoded = decode_mask("rice", payload, mask.numel())
    except ValueError:
        return
    assert decoded.dtype == torch.bool and decoded.shape == mask.shape


@pytest.mark.parametrize("bits", [3, 5, 6, 7])
@pytest.mark.parametrize("count", [SMALL_COUNT - 1, SMALL_COUNT, SMALL_COUNT + 13])
def test_odd_widths_on_both_sides_of_the_small_count_path(bits: int, count: int) -> None:
    """Below SMALL_COUNT odd widths unpack by gathering bytes, from it on by byte columns: both exact."""
    values = torch.randint(0, 1 << bits, (count,), generator=torch.Generator().manual_seed(bits * count))
    packed = pack_bits(values, bits)
    assert bytes(packed.tolist()) == _reference_pack(values.tolist(), bits)
    assert torch.equal(unpack_bits(packed, bits, count).long(), values)
    assert torch.equal(read_fields(packed, bits, count), values)


@pytest.mark.parametrize("length", [700, 30_000, 200_000])
@pytest.mark.parametrize("density", [0.01, 0.3, 0.8])
def test_rice_decode_on_both_sides_of_the_small_stream_path(length: int, density: float) -> None:
    """Short Rice streams unpack whole (remainders summed from bits), long ones read k-bit fields: both exact."""
    mask = torch.rand(length, generator=torch.Generator().manual_seed(length)) < density
    encoding, payload = encode_mask(mask, encoding="rice")
    assert torch.equal(decode_mask(encoding, payload, length), mask)
    assert torch.equal(decode_kept_positions(encoding, payload, length), mask.nonzero().squeeze(1))


@given(masks(max_length=600), st.booleans())
def test_set_bit_indices_equals_nonzero(mask: torch.Tensor, large: bool) -> None:
    """The Python-integer path (small streams) and the tensor path give the set bits' indices alike."""
    # above PYTHON_BITS the tensor path, up to it the Python-integer path
    mask = torch.cat([mask, torch.zeros(PYTHON_BITS, dtype=torch.bool), mask]) if large else mask[:PYTHON_BITS]
    packed = pack_bits(mask, 1)
    assert torch.equal(set_bit_indices(packed, mask.numel()), mask.nonzero().squeeze(1))


def test_set_bit_indices_checks_size_and_padding() -> None:
    with pytest.raises(ValueError, match="padding bits"):
        set_bit_indices(torch.tensor([0b1000_0001], dtype=torch.uint8), 5)
    with pytest.raises(ValueError, match="expected 1"):
        set_bit_indices(torch.tensor([1, 0], dtype=torch.uint8), 5)
