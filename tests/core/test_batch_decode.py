"""The batched greedy decoder (Artifact.weights, load) against the one-tensor-at-a-time decoder.

``decode_weight`` is the reference (its own round trip is tested in test_artifact.py); the batch must give
the same bits for every layout a record can have, and the same named errors for damaged records.
"""

from __future__ import annotations

import itertools
from unittest.mock import patch

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sqs_core import _batch_codes, _batch_decode
from sqs_core._artifact_layout import FLOAT_DTYPES, decode_weight, encode
from sqs_core._batch_codes import CodeStream, decode_code_buffer
from sqs_core._batch_decode import decode_weights
from sqs_core._batch_plan import plan_record
from sqs_core._bits import pack_bits, read_varying_fields, set_bit_positions
from sqs_core._rice import RICE_HEADER_BYTES, RiceStream, parse_rice_header, rice_decode_batch
from sqs_core.discrete import DiscretePosterior
from sqs_core.packing import decode_kept_positions, encode_mask


@st.composite
def posteriors(draw: st.DrawFn) -> DiscretePosterior:
    """A greedy DiscretePosterior whose levels are skewed (so the escaped layout is often chosen) and whose
    keep rate selects every mask encoding ("all", bitmap, Rice)."""
    numel = draw(st.integers(1, 3000))
    k, w = draw(st.sampled_from([2, 4, 16])), draw(st.integers(1, 3))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    keep = torch.rand(numel, generator=gen) < draw(st.sampled_from([0.05, 0.3, 0.5, 0.9, 1.0]))
    central = torch.rand(numel, generator=gen) < draw(st.sampled_from([0.5, 0.97, 1.0]))
    window_ids = torch.where(central, 0, torch.randint(0, w, (numel,), generator=gen))
    dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    codebook = torch.randn(w, k, generator=gen).to(dtype)
    codebook[0, 0] = -0.0  # a kept −0 must stay −0, a pruned weight is +0
    return DiscretePosterior(
        shape=(numel,) if draw(st.booleans()) else (1, numel),
        codebook=codebook,
        window_ids=window_ids.to(torch.uint8),
        greedy=torch.randint(0, k, (numel,), generator=gen, dtype=torch.uint8),
        keep=keep,
        alt_index=torch.zeros(0, dtype=torch.long),
        alt_probs=torch.zeros(0, k),
    )


def _records(dists: list[DiscretePosterior]) -> tuple[list[dict], dict[str, torch.Tensor]]:
    records, blobs = [], {}
    for i, d in enumerate(dists):
        record, blob = encode(d, alternatives=False)
        records.append(record | {"layers": [f"layer{i}"]})
        blobs[f"layer{i}"] = blob
    return records, blobs


def _assert_bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b))


@given(
    dists=st.lists(posteriors(), min_size=1, max_size=6),
    varying_limit=st.sampled_from([0, 1 << 15]),
    group_limits=st.sampled_from([(1 << 30, 1 << 20), (4000, 1 << 20), (1 << 30, 2)]),
)
def test_batch_equals_one_by_one(dists, varying_limit, group_limits):
    """With the default limit these small records' codes take the varying-width pass; with 0, a pass per width.
    Small group limits (values, records) send the records past them to the one-by-one decoder; every values
    buffer stays within the bound the limit is checked against."""
    group_limit, group_records = group_limits
    records, blobs = _records(dists)
    buffers = []

    def recording(streams, codebook):
        values, starts = decode_code_buffer(streams, codebook)
        buffers.append(values.numel())
        return values, starts

    with (
        patch.object(_batch_codes, "VARYING_LIMIT", varying_limit),
        patch.object(_batch_decode, "GROUP_LIMIT", group_limit),
        patch.object(_batch_decode, "GROUP_RECORDS", group_records),
        patch.object(_batch_decode, "decode_code_buffer", recording),
    ):
        got = decode_weights(records, blobs)
    assert all(1 < size <= group_limit for size in buffers)  # no empty batch: its buffer would be the +0 alone
    assert len(buffers) <= len(records)
    assert list(got) == [r["layers"][0] for r in records]
    for rec in records:
        name = rec["layers"][0]
        _assert_bits_equal(got[name], decode_weight(name, rec, blobs[name]))


@given(dists=st.lists(posteriors(), min_size=1, max_size=6), data=st.data())
def test_decoding_into_tensors_writes_them(dists, data):
    """Targets of the right shape and dtype are written and returned (contiguous ones directly, others by a
    copy); records without a target get new tensors."""
    records, blobs = _records(dists)
    into = {}
    for rec in records:
        shape, dtype = rec["shape"], FLOAT_DTYPES[rec["dtype"]]
        kind = data.draw(st.sampled_from(["none", "contiguous", "strided"]))
        if kind == "contiguous":
            into[rec["layers"][0]] = torch.full(shape, 7.0, dtype=dtype)
        elif kind == "strided":
            into[rec["layers"][0]] = torch.full([*shape, 2], 7.0, dtype=dtype)[..., 0]
    got = decode_weights(records, blobs, into)
    for rec in records:
        name = rec["layers"][0]
        _assert_bits_equal(got[name], decode_weight(name, rec, blobs[name]))
        if name in into:
            assert got[name] is into[name]


def _windowed(n: int, keep_rate: float) -> DiscretePosterior:
    """n weights, 30% of them spread over 3 windows of K = 4: the escaped layout lists ~20% of the kept ones."""
    gen = torch.Generator().manual_seed(0)
    window_ids = torch.where(torch.rand(n, generator=gen) < 0.7, 0, torch.randint(0, 3, (n,), generator=gen))
    return DiscretePosterior(
        shape=(n,),
        codebook=torch.randn(3, 4, generator=gen),
        window_ids=window_ids.to(torch.uint8),
        greedy=torch.randint(0, 4, (n,), generator=gen, dtype=torch.uint8),
        keep=torch.rand(n, generator=gen) < keep_rate,
        alt_index=torch.zeros(0, dtype=torch.long),
        alt_probs=torch.zeros(0, 4),
    )


def test_group_limit_counts_escape_values():
    """A record whose weights fit under the group limit but whose kept values plus escape values do not is
    decoded alone: the batch's int32 indices (a bitmap index adds 2^30) must stay below the limit."""
    n = 3900
    records, blobs = _records([_windowed(n, keep_rate=1.0)])
    assert records[0]["escaped"] > 4000 - n  # kept values and escape values exceed the limit
    buffers = []

    def recording(streams, codebook):
        values, starts = decode_code_buffer(streams, codebook)
        buffers.append(values.numel())
        return values, starts

    with patch.object(_batch_decode, "GROUP_LIMIT", 4000), patch.object(_batch_decode, "decode_code_buffer", recording):
        got = decode_weights(records, blobs)
    assert buffers == []  # decoded alone
    _assert_bits_equal(got["layer0"], decode_weight("layer0", records[0], blobs["layer0"]))


def test_long_escape_list_matches_one_by_one():
    """An escape list of RICE_BATCH_LIMIT or more positions is decoded by the single-stream decoder and its
    values, views of the same buffer, are scattered into it."""
    records, blobs = _records([_windowed(120_000, keep_rate=0.5)])
    assert records[0]["escaped"] >= _batch_decode.RICE_BATCH_LIMIT
    got = decode_weights(records, blobs)
    _assert_bits_equal(got["layer0"], decode_weight("layer0", records[0], blobs["layer0"]))


def test_targets_must_name_records_of_their_shape():
    records, blobs = _records(_two_small())
    with pytest.raises(ValueError, match="names no compressed tensor"):
        decode_weights(records, blobs, {"layer9": torch.zeros(40)})
    with pytest.raises(ValueError, match="wrong shape"):
        decode_weights(records, blobs, {"layer0": torch.zeros(41)})


def test_a_damaged_batch_writes_no_target():
    records, blobs = _damaged_pair()
    into = {r["layers"][0]: torch.full(r["shape"], 7.0) for r in records}
    with pytest.raises(ValueError, match="layer1"):
        decode_weights(records, blobs, into)
    assert all(bool((t == 7.0).all()) for t in into.values())


def test_the_batch_covers_every_mask_and_code_layout():
    """Bitmap, Rice and "all" masks, plain and escaped codes are all planned (not left to decode_weight)."""
    torch.manual_seed(0)
    dists = []
    for keep_rate, central in ((0.5, 0.97), (0.05, 0.99), (1.0, 0.97), (0.5, 1.0), (0.05, 1.0)):
        n = 20000
        dists.append(
            DiscretePosterior(
                shape=(n,),
                codebook=torch.randn(3, 4),
                window_ids=torch.where(torch.rand(n) < central, 0, torch.randint(0, 3, (n,))).to(torch.uint8),
                greedy=torch.randint(0, 4, (n,), dtype=torch.uint8),
                keep=torch.rand(n) < keep_rate,
                alt_index=torch.zeros(0, dtype=torch.long),
                alt_probs=torch.zeros(0, 4),
            )
        )
    records, blobs = _records(dists)
    assert [r["mask"] for r in records] == ["bitmap", "rice", "all", "bitmap", "rice"]
    assert ["escaped" in r for r in records] == [True, True, True, False, False]
    assert all(plan_record(r["layers"][0], r, blobs[r["layers"][0]]) is not None for r in records)
    got = decode_weights(records, blobs)
    for rec in records:
        _assert_bits_equal(got[rec["layers"][0]], decode_weight(rec["layers"][0], rec, blobs[rec["layers"][0]]))


@given(
    masks=st.lists(st.tuples(st.integers(0, 2000), st.sampled_from([0.001, 0.05, 0.3, 0.5])), max_size=5),
    seed=st.integers(0, 2**16),
)
def test_rice_decode_batch_equals_one_by_one(masks, seed):
    gen = torch.Generator().manual_seed(seed)
    streams, expected, shifts = [], [], []
    for length, rate in masks:
        mask = torch.rand(length, generator=gen) < rate
        _, payload = encode_mask(mask, encoding="rice")
        raw = bytes(payload.tolist())
        inverted, k, m = parse_rice_header(raw, len(raw), length)
        if inverted:
            continue
        shift = int(torch.randint(0, 10**6, (1,), generator=gen))
        streams.append(RiceStream(raw[RICE_HEADER_BYTES:], k, m, length))
        expected.append(decode_kept_positions("rice", payload, length) + shift)
        shifts.append(shift)
    got = rice_decode_batch(streams, shifts)
    assert torch.equal(got, torch.cat(expected) if expected else torch.zeros(0, dtype=torch.int64))


def test_rice_decode_batch_rejects_a_short_stream():
    _, payload = encode_mask(torch.rand(500, generator=torch.Generator().manual_seed(0)) < 0.1, encoding="rice")
    raw = bytes(payload.tolist())
    _, k, m = parse_rice_header(raw, len(raw), 500)
    with pytest.raises(ValueError, match="rice stream"):
        rice_decode_batch([RiceStream(raw[RICE_HEADER_BYTES:-1], k, m, 500)])
    with pytest.raises(ValueError, match="beyond"):
        rice_decode_batch([RiceStream(raw[RICE_HEADER_BYTES:], k, m, 100)])


@given(data=st.binary(max_size=600))
def test_set_bit_positions_equals_nonzero(data):
    packed = torch.tensor(list(data), dtype=torch.uint8)
    expected = torch.tensor([8 * i + j for i, byte in enumerate(data) for j in range(8) if byte >> j & 1])
    assert torch.equal(set_bit_positions(packed), expected.long())


@given(data=st.binary(min_size=1, max_size=64), fields=st.lists(st.tuples(st.integers(0, 10**4), st.integers(0, 16))))
def test_read_varying_fields(data, fields):
    fields = [(offset % (8 * len(data)), width) for offset, width in fields]
    value = int.from_bytes(data, "little")
    expected = [(value >> offset) & ((1 << width) - 1) for offset, width in fields]
    padded = torch.tensor([*data, 0, 0, 0], dtype=torch.uint8)
    offsets = torch.tensor([o for o, _ in fields], dtype=torch.int64)
    widths = torch.tensor([w for _, w in fields], dtype=torch.int64)
    assert read_varying_fields(padded, offsets, widths).tolist() == expected


@given(
    streams=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 700), st.integers(0, 2**16)), min_size=1, max_size=6)
)
def test_code_streams_equal_a_table_lookup(streams):
    codebook = torch.cat([torch.randn(300), torch.zeros(1)])
    cases, expected = [], []
    for bits, count, seed in streams:
        gen = torch.Generator().manual_seed(seed)
        size = int(torch.randint(1, (1 << bits) + 1, (1,), generator=gen))
        table = torch.randint(0, 300, (size,), generator=gen)
        codes = torch.randint(0, size, (count,), generator=gen)
        packed = bytes(pack_bits(codes, bits).tolist()) if bits else b""
        cases.append(CodeStream(packed, count, bits, table.tolist()))
        expected.append(codebook[table[codes]])
    for limit in (0, 1 << 15):  # a pass per width; one varying-width pass
        with patch.object(_batch_codes, "VARYING_LIMIT", limit):
            for got, want in zip(_decoded(cases, codebook), expected, strict=True):
                assert torch.equal(got, want)


def _decoded(streams: list[CodeStream], codebook: torch.Tensor) -> list[torch.Tensor]:
    buffer, starts = decode_code_buffer(streams, codebook)
    assert buffer[-1].item() == 0 and not torch.signbit(buffer[-1])  # the +0 last entry
    return [buffer[start : start + s.n_codes] for s, start in zip(streams, starts, strict=True)]


def test_code_past_its_table_is_rejected():
    codebook = torch.cat([torch.randn(8), torch.zeros(1)])
    for bits, limit in itertools.product((2, 3), (0, 1 << 15)):
        packed = bytes(pack_bits(torch.tensor([0, 1, 3, 0]), bits).tolist())
        with patch.object(_batch_codes, "VARYING_LIMIT", limit), pytest.raises(ValueError, match="past its table"):
            _decoded([CodeStream(packed, 4, bits, [5, 6, 7])], codebook)


def test_damaged_record_in_a_batch_names_its_tensor():
    records, blobs = _damaged_pair()
    with pytest.raises(ValueError, match="layer1"):
        decode_weights(records, blobs)


def _damaged_pair() -> tuple[list[dict], dict[str, torch.Tensor]]:
    """A bitmap whose kept count disagrees with the header passes the plan; the batch's count check fails and
    the one-by-one decoder names the tensor."""
    torch.manual_seed(0)
    n = 64
    dists = [
        DiscretePosterior(
            shape=(n,),
            codebook=torch.randn(1, 4),
            window_ids=torch.zeros(n, dtype=torch.uint8),
            greedy=torch.randint(0, 4, (n,), dtype=torch.uint8),
            keep=torch.arange(n) % 2 == 0,
            alt_index=torch.zeros(0, dtype=torch.long),
            alt_probs=torch.zeros(0, 4),
        )
        for _ in range(2)
    ]
    records, blobs = _records(dists)
    assert records[1]["mask"] == "bitmap"
    mask_start = records[1]["sections"]["codebook"]
    blobs["layer1"] = blobs["layer1"].clone()
    blobs["layer1"][mask_start] ^= 0x02  # one more kept weight
    assert plan_record("layer1", records[1], blobs["layer1"]) is not None
    return records, blobs


def test_a_batch_that_disagrees_with_the_reference_is_an_internal_error(monkeypatch):
    records, blobs = _records(_two_small())

    def refuse(*args):
        raise ValueError("forced")

    monkeypatch.setattr(_batch_decode, "_decode_group", refuse)
    with pytest.raises(RuntimeError, match="internal"):
        decode_weights(records, blobs)


def _two_small() -> list[DiscretePosterior]:
    torch.manual_seed(1)
    return [
        DiscretePosterior(
            shape=(40,),
            codebook=torch.randn(1, 2),
            window_ids=torch.zeros(40, dtype=torch.uint8),
            greedy=torch.randint(0, 2, (40,), dtype=torch.uint8),
            keep=torch.rand(40) < 0.5,
            alt_index=torch.zeros(0, dtype=torch.long),
            alt_probs=torch.zeros(0, 2),
        )
    ]
