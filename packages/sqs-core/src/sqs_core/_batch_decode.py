"""The greedy weights (eq. greedy) of all compressed tensors of an artifact, decoded together.

Tensor by tensor (:func:`~sqs_core._artifact_layout.decode_weight`) a small layer costs ~60 tensor
operations, and a bitmap mask's ``nonzero`` is slow (~4 ns per weight here): a ResNet-20 took ~4 ms,
7e7 weights/s. Here the records of one dtype are decoded with a fixed number of operations:

1. :mod:`sqs_core._batch_plan` reads each record's tables from its bytes in Python.
2. Codes to values: per code width b, one gather of every record's packed code bytes through a table of
   each record's 256 byte values (odd b: one unpack and one gather); the escaped weights' values are
   overwritten by one scatter at the positions one batched Rice decode gives.
3. Values to weights: all bitmap masks by one gather, each weight taking the value at its rank among the
   kept weights (the exclusive prefix count of its byte plus its rank within the byte) or a +0 sentinel;
   all Rice masks by one scatter at their decoded positions; an ``"all"`` mask's weight is its values.

The weights returned are views of shared buffers. Records the batch does not cover (codes over 8 bits,
inverted Rice masks, bitmap escape lists, empty tensors), large layers with a long Rice mask (batching
pays for many small tensors; one large one decodes faster alone) and records whose tables are inconsistent
are decoded one by one; if a batched check fails, every record of the batch is, so the error names the
tensor.
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict

import torch
from torch import Tensor

from ._artifact_layout import FLOAT_DTYPES, decode_weight
from ._batch_codes import CodeStream, decode_code_streams
from ._batch_plan import RecordPlan, plan_record
from ._bits import set_bit_tables, tensor_from_bytes
from ._rice import RiceStream, rice_decode_batch, rice_decode_stream

_ORDER = {"bitmap": 0, "rice": 1, "all": 2}  # bitmap records first: their values, then the +0 sentinel
RICE_BATCH_LIMIT = 8192
"""Rice streams with more positions are decoded alone (the single-stream decoder costs fewer operations per
position), and records whose Rice mask has that many go through decode_weight whole: a lone 4096² layer
at 25% decoded 0.8x as fast batched."""
BITMAP_CHUNK_BYTES = 8192
"""Mask bytes per step of the bitmap gather: its 256 KiB int32 index is reused. One index for a whole model
(4 bytes per weight) costs more in fresh-page faults than the gather itself (~1 µs per 4 KiB page here)."""


def decode_weights(records: list[dict], blobs: dict[str, Tensor]) -> dict[str, Tensor]:
    """Greedy weight of every record, keyed by its first layer name; equal to ``decode_weight`` of each."""
    out: dict[str, Tensor] = {}
    groups: dict[str, list[RecordPlan]] = defaultdict(list)
    for rec in records:
        name = rec["layers"][0]
        plan = plan_record(name, rec, blobs[name])
        if plan is None or (plan.mask == "rice" and plan.kept >= RICE_BATCH_LIMIT):  # long Rice mask: alone
            out[name] = decode_weight(name, rec, blobs[name])
        else:
            groups[rec["dtype"]].append(plan)
    for dtype, plans in groups.items():
        try:
            out |= _decode_group(sorted(plans, key=lambda p: _ORDER[p.mask]), FLOAT_DTYPES[dtype])
        except ValueError:
            by_name = {r["layers"][0]: r for r in records}
            for p in plans:  # raises the error naming the damaged tensor
                decode_weight(p.name, by_name[p.name], blobs[p.name])
            raise RuntimeError("internal: the batched decoder rejected records that decode one by one") from None
    return {rec["layers"][0]: out[rec["layers"][0]] for rec in records}


def _decode_group(plans: list[RecordPlan], dtype: torch.dtype) -> dict[str, Tensor]:
    codebook = tensor_from_bytes(b"".join(p.codebook for p in plans), dtype)
    codebook = torch.cat([codebook, codebook.new_zeros(1)])  # the last entry: +0, the pruned weights' value
    offsets, base = [], 0
    for p in plans:
        offsets.append(base)
        base += len(p.codebook) // codebook.element_size()
    values = _kept_values(plans, codebook, offsets)  # bitmap records' values, +0, the others' values
    starts, start = [], 0  # where each record's values begin in ``values``
    for i, p in enumerate(plans):
        start += p.mask != "bitmap" and (i == 0 or plans[i - 1].mask == "bitmap")  # past the sentinel
        starts.append(start)
        start += p.kept
    _apply_escapes(plans, codebook, offsets, values, starts)
    return _place(plans, values, starts)


# -- codes to values --------------------------------------------------------------------------------------
def _kept_values(plans: list[RecordPlan], codebook: Tensor, offsets: list[int]) -> Tensor:
    """Every record's kept values in plan order, with the +0 sentinel after the bitmap records'."""
    streams = [
        CodeStream(p.codes, p.kept, p.code_bits, [off + e for e in p.table])
        for p, off in zip(plans, offsets, strict=True)
    ]
    pieces = decode_code_streams(streams, codebook)
    split = sum(p.mask == "bitmap" for p in plans)
    return torch.cat([*pieces[:split], codebook[-1:], *pieces[split:]])


def _apply_escapes(plans: list[RecordPlan], codebook: Tensor, offsets: list[int], values: Tensor, starts: list[int]):
    """Overwrite the escaped weights' values: S's entry of each escape code, at the escaped kept ranks."""
    ranks, codes = [], []
    for i, p in enumerate(plans):
        if p.escape_stream is not None:
            ranks.append((p.escape_stream, starts[i]))
            codes.append(CodeStream(p.escape_codes, p.escape_stream.m, p.escape_bits, [offsets[i] + e for e in p.rest]))
    if ranks:
        _scatter_rice(values, ranks, decode_code_streams(codes, codebook))


def _scatter_rice(target: Tensor, streams: list[tuple[RiceStream, int]], values: list[Tensor]) -> None:
    """``target[shift + p] = value`` for each stream's coded positions p and its values. Streams of fewer
    than RICE_BATCH_LIMIT positions are decoded together; longer ones alone, by the single-stream decoder,
    which costs fewer operations per position."""
    small = [i for i, (stream, _) in enumerate(streams) if stream.m < RICE_BATCH_LIMIT]
    if small:
        at = rice_decode_batch([streams[i][0] for i in small], [streams[i][1] for i in small])
        target.scatter_(0, at, torch.cat([values[i] for i in small]))
    for (stream, shift), piece in zip(streams, values, strict=True):
        if stream.m >= RICE_BATCH_LIMIT:
            target.scatter_(0, rice_decode_stream(stream).add_(shift), piece)


# -- values to weights ------------------------------------------------------------------------------------
@functools.cache
def _byte_ranks() -> Tensor:
    """(256, 8) int32: the rank of bit j among the set bits of byte value v, or 2^30 where bit j is clear
    (clamped to the sentinel's index)."""
    counts, bits = set_bit_tables(torch.int64)
    ranks = torch.full((256, 8), 1 << 30, dtype=torch.int32)
    for v in range(256):
        ranks[v, bits[8 * v : 8 * v + counts[v]]] = torch.arange(int(counts[v]), dtype=torch.int32)
    return ranks


def _place(plans: list[RecordPlan], values: Tensor, starts: list[int]) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    bitmaps = [p for p in plans if p.mask == "bitmap"]
    if bitmaps:
        out |= _place_bitmaps(bitmaps, values, sum(p.kept for p in bitmaps))  # the sentinel follows them
    rice = [(p, start) for p, start in zip(plans, starts, strict=True) if p.mask == "rice"]
    if rice:
        out |= _place_rice(rice, values)
    for p, start in zip(plans, starts, strict=True):
        if p.mask == "all":
            out[p.name] = values[start : start + p.kept].view(p.shape)
    return out


def _place_bitmaps(plans: list[RecordPlan], values: Tensor, n_bitmap: int) -> dict[str, Tensor]:
    """Weight i of a bitmap record takes the value at its rank among the kept weights, or +0 (the sentinel
    at ``n_bitmap``): no ``nonzero`` over the weights and no scatter."""
    counts_of, ranks_of = set_bit_tables(torch.int32)[0], _byte_ranks()
    data = tensor_from_bytes(b"".join(p.mask_bytes for p in plans)).int()
    counts = counts_of.index_select(0, data)
    kept_before = counts.cumsum(0, dtype=torch.int32)
    ends, end = [], 0
    for p in plans:
        end += len(p.mask_bytes)
        ends.append(end - 1)
    totals = kept_before.index_select(0, torch.tensor(ends, dtype=torch.int64)).tolist()
    if [b - a for a, b in itertools.pairwise([0, *totals])] != [p.kept for p in plans]:
        raise ValueError("a bitmap mask keeps a number of weights other than its record's")
    first = kept_before.sub_(counts).unsqueeze(1)  # kept weights before each byte
    dense = values.new_empty(8 * data.numel())
    index = torch.empty(min(data.numel(), BITMAP_CHUNK_BYTES), 8, dtype=torch.int32)
    for a in range(0, data.numel(), BITMAP_CHUNK_BYTES):  # a reused, cache-sized index: no fresh pages
        b = min(a + BITMAP_CHUNK_BYTES, data.numel())
        rows = torch.index_select(ranks_of, 0, data[a:b], out=index[: b - a])
        flat = rows.add_(first[a:b]).view(-1).clamp_(max=n_bitmap)
        torch.index_select(values, 0, flat, out=dense[8 * a : 8 * b])
    out, start = {}, 0
    for p in plans:
        out[p.name] = dense[start : start + p.numel].view(p.shape)
        start += 8 * len(p.mask_bytes)
    return out


def _place_rice(plans: list[tuple[RecordPlan, int]], values: Tensor) -> dict[str, Tensor]:
    """Records with a Rice mask (each with where its values begin): one scatter at their decoded positions."""
    streams, pieces, regions, region = [], [], [], 0
    for p, start in plans:
        if p.mask_stream is not None:
            streams.append((p.mask_stream, region))
            pieces.append(values[start : start + p.kept])
        regions.append(region)
        region += p.numel
    dense = values.new_zeros(region)
    _scatter_rice(dense, streams, pieces)
    return {p.name: dense[at : at + p.numel].view(p.shape) for (p, _), at in zip(plans, regions, strict=True)}
