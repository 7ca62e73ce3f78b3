"""The greedy weights (eq. greedy) of all compressed tensors of an artifact, decoded together.

Tensor by tensor (:func:`~sqs_core._artifact_layout.decode_weight`) a small layer costs ~60 tensor
operations, and a bitmap mask's ``nonzero`` is slow (~4 ns per weight here): a ResNet-20 took ~4 ms,
7e7 weights/s. Here the records of one dtype are decoded with a fixed number of operations:

1. :mod:`sqs_core._batch_plan` reads each record's tables from its bytes in Python.
2. Codes to values (:mod:`sqs_core._batch_codes`): every record's kept values, and the escaped layout's
   escape values, land in one buffer (one pass per code width) whose last entry is +0; the escaped weights'
   values are overwritten by one scatter at the positions one batched Rice decode gives.
3. Values to weights: all Rice masks by one scatter at their decoded positions; an ``"all"`` mask's weight
   is its values; all bitmap masks last, by gathers, each weight taking the value at its record's start plus
   its rank among the kept weights (the exclusive prefix count of its byte plus its rank within the byte) or
   the +0 entry. Given target tensors (``load``: the skeleton's weights), the gathers write straight into
   them, after every check of the batch.

The weights returned are views of shared buffers. Records the batch does not cover (codes over 8 bits,
inverted Rice masks, bitmap escape lists, empty tensors), large layers with a long Rice mask (batching
pays for many small tensors; one large one decodes faster alone) and records whose tables are inconsistent
are decoded one by one; if a batched check fails, every record of the batch is, so the error names the
tensor.
"""

from __future__ import annotations

import functools
from collections import defaultdict

import torch
from torch import Tensor

from ._artifact_layout import FLOAT_DTYPES, decode_weight, record_name
from ._batch_codes import CodeStream, decode_code_buffer
from ._batch_plan import RecordPlan, plan_record
from ._bits import set_bit_tables, tensor_from_bytes
from ._rice import RiceStream, rice_decode_batch, rice_decode_stream

RICE_BATCH_LIMIT = 8192
"""Rice streams with more positions are decoded alone (the single-stream decoder costs fewer operations per
position), and records whose Rice mask has that many go through decode_weight whole: a lone 4096² layer
at 25% decoded 0.8x as fast batched."""
GROUP_LIMIT = 1 << 30
"""Bound on the weights and values of one batch (:func:`_buffer_bound`): its indices are int32, and a bitmap
index adds 2^30 to mark a pruned weight."""
GROUP_RECORDS = 1 << 20
"""Records of one batch: the byte pass indexes row g·256 + byte of a table per code stream (int32, and each
escaped record adds a stream)."""
BITMAP_CHUNK_BYTES = 8192
"""Mask bytes per step of the bitmap gather: its 256 KiB int32 index is reused. One index for a whole model
(4 bytes per weight) costs more in fresh-page faults than the gather itself (~1 µs per 4 KiB page here)."""


def decode_weights(
    records: list[dict], blobs: dict[str, Tensor], into: dict[str, Tensor] | None = None
) -> dict[str, Tensor]:
    """Greedy weight of every record, keyed by its first layer name; equal to ``decode_weight`` of each.

    ``into`` (tensors of the records' shapes and dtypes, keyed by first layer name): each such weight is
    written into its tensor, which is returned in its place. Bitmap-masked weights are decoded straight into
    CPU, contiguous targets (no fresh pages, no copy); the others are copied. Nothing is written unless every
    record decodes."""
    targets = _targets(records, into or {})
    out: dict[str, Tensor] = {}
    groups: dict[str, list[RecordPlan]] = defaultdict(list)
    sizes: dict[str, int] = defaultdict(int)
    for rec in records:
        name, dtype = record_name(rec), rec["dtype"]
        plan = plan_record(name, rec, blobs[name])
        if plan is None or _alone(plan, sizes[dtype], len(groups.get(dtype, ()))):
            out[name] = decode_weight(name, rec, blobs[name])
        else:
            groups[dtype].append(plan)
            sizes[dtype] += _buffer_bound(plan)
    # a group writes its targets after its last check; with several groups, later ones could still fail
    direct = targets if len(groups) == 1 else {}
    for dtype, plans in groups.items():
        try:
            out |= _decode_group(plans, FLOAT_DTYPES[dtype], direct)
        except ValueError:
            by_name = {record_name(r): r for r in records}
            for p in plans:  # raises the error naming the damaged tensor
                decode_weight(p.name, by_name[p.name], blobs[p.name])
            raise RuntimeError("internal: the batched decoder rejected records that decode one by one") from None
    for name, target in (into or {}).items():
        if out[name] is not target:
            out[name] = target.copy_(out[name])
    return {record_name(rec): out[record_name(rec)] for rec in records}


def _alone(plan: RecordPlan, group_size: int, group_records: int) -> bool:
    """Whether the record is decoded by itself: a long Rice mask (faster alone), or a full batch."""
    long_rice = plan.mask == "rice" and plan.kept >= RICE_BATCH_LIMIT
    return long_rice or group_size + _buffer_bound(plan) >= GROUP_LIMIT or group_records >= GROUP_RECORDS


def _buffer_bound(plan: RecordPlan) -> int:
    """A bound on the entries the record adds to its group's buffers: its weights (or, in the values buffer,
    its kept values and padding fields, < 16 more, and its escape values, at most as many as it keeps)."""
    return plan.numel + 16 + (plan.escape_stream.m if plan.escape_stream is not None else 0)


def _targets(records: list[dict], into: dict[str, Tensor]) -> dict[str, Tensor]:
    """Check ``into`` (only compressed tensors, each of its record's shape); return the tensors the decoder may
    write directly: on the CPU, contiguous, of the record's dtype (the others get a copy)."""
    kinds = {record_name(r): (tuple(r["shape"]), FLOAT_DTYPES[r["dtype"]]) for r in records}
    unknown = sorted(set(into) - set(kinds))
    if unknown:
        raise ValueError(f"into names no compressed tensor: {unknown}")
    wrong = [f"{n!r} {tuple(t.shape)} (file: {kinds[n][0]})" for n, t in into.items() if tuple(t.shape) != kinds[n][0]]
    if wrong:
        raise ValueError("into has tensors of the wrong shape: " + ", ".join(wrong))
    return {n: t for n, t in into.items() if t.device.type == "cpu" and t.is_contiguous() and t.dtype == kinds[n][1]}


def _decode_group(plans: list[RecordPlan], dtype: torch.dtype, targets: dict[str, Tensor]) -> dict[str, Tensor]:
    codebook = tensor_from_bytes(b"".join(p.codebook for p in plans), dtype)
    codebook = torch.cat([codebook, codebook.new_zeros(1)])  # the last entry: +0, the pruned weights' value
    offsets, base = [], 0
    for p in plans:
        offsets.append(base)
        base += len(p.codebook) // codebook.element_size()
    streams = [
        CodeStream(p.codes, p.kept, p.code_bits, [off + e for e in p.table])
        for p, off in zip(plans, offsets, strict=True)
    ]
    escaped = [(i, p.escape_stream) for i, p in enumerate(plans) if p.escape_stream is not None]
    streams += [  # the escape codes: read in the same pass as the primary codes of their width
        CodeStream(plans[i].escape_codes, ranks.m, plans[i].escape_bits, [offsets[i] + e for e in plans[i].rest])
        for i, ranks in escaped
    ]
    values, starts = decode_code_buffer(streams, codebook)  # record i's kept values from starts[i]; +0 last
    if escaped:  # overwrite the escaped weights' values, at their kept ranks, by their escape codes' values
        pieces = [values[at : at + ranks.m] for (_, ranks), at in zip(escaped, starts[len(plans) :], strict=True)]
        _scatter_rice(values, [(ranks, starts[i]) for i, ranks in escaped], pieces)
    return _place(plans, values, starts[: len(plans)], targets)


# -- codes to values --------------------------------------------------------------------------------------
def _scatter_rice(target: Tensor, streams: list[tuple[RiceStream, int]], values: list[Tensor]) -> None:
    """``target[shift + p] = value`` for each stream's coded positions p and its values (which may be views of
    ``target``). Streams of fewer than RICE_BATCH_LIMIT positions are decoded together; longer ones alone, by
    the single-stream decoder, which costs fewer operations per position."""
    small = [i for i, (stream, _) in enumerate(streams) if stream.m < RICE_BATCH_LIMIT]
    if small:
        at = rice_decode_batch([streams[i][0] for i in small], [streams[i][1] for i in small])
        target.scatter_(0, at, torch.cat([values[i] for i in small]))
    for (stream, shift), piece in zip(streams, values, strict=True):
        if stream.m >= RICE_BATCH_LIMIT:
            target.scatter_(0, rice_decode_stream(stream).add_(shift), piece.clone())  # scatter_ refuses aliases


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


def _place(plans: list[RecordPlan], values: Tensor, starts: list[int], targets: dict[str, Tensor]) -> dict[str, Tensor]:
    """Values to weights; the bitmap records last (their targets are written after every check)."""
    out: dict[str, Tensor] = {}
    rice = [(p, start) for p, start in zip(plans, starts, strict=True) if p.mask == "rice"]
    if rice:
        out |= _place_rice(rice, values)
    for p, start in zip(plans, starts, strict=True):
        if p.mask == "all":
            out[p.name] = values[start : start + p.kept].view(p.shape)
    bitmaps = [(p, start) for p, start in zip(plans, starts, strict=True) if p.mask == "bitmap"]
    if bitmaps:
        out |= _place_bitmaps(bitmaps, values, targets)
    return out


def _place_bitmaps(
    plans: list[tuple[RecordPlan, int]], values: Tensor, targets: dict[str, Tensor]
) -> dict[str, Tensor]:
    """Weight i of a bitmap record (with where its values begin) takes the value at its record's start plus
    its rank among the record's kept weights, or +0 (``values``' last entry): no ``nonzero`` over the
    weights and no scatter. Written into the record's entry of ``targets`` if any, else into a new buffer."""
    counts_of, ranks_of = set_bit_tables(torch.int32)[0], _byte_ranks()
    data = tensor_from_bytes(b"".join(p.mask_bytes for p, _ in plans)).int()
    counts = counts_of.index_select(0, data)
    first_bytes, steps, ends, end, before = [], [], [], 0, 0
    for p, start in plans:  # each record's first byte steps the running count up to the record's start
        first_bytes.append(end)
        steps.append(start - before)
        end, before = end + len(p.mask_bytes), start + p.kept
        ends.append(end - 1)
    shifted = counts.index_add(0, torch.tensor(first_bytes), torch.tensor(steps, dtype=torch.int32))
    kept_before = shifted.cumsum_(0)  # inclusive: the value index after each byte's kept weights
    totals = kept_before.index_select(0, torch.tensor(ends, dtype=torch.int64)).tolist()
    if totals != [start + p.kept for p, start in plans]:
        raise ValueError("a bitmap mask keeps a number of weights other than its record's")
    first = kept_before.sub_(counts).unsqueeze(1)  # the value index of each byte's first kept weight
    runs, out = _bitmap_runs([p for p, _ in plans], values, targets)
    sentinel = values.numel() - 1  # the +0 entry
    index = torch.empty(min(data.numel(), BITMAP_CHUNK_BYTES), 8, dtype=torch.int32)
    for a in range(0, data.numel(), BITMAP_CHUNK_BYTES):  # a reused, cache-sized index: no fresh pages
        b = min(a + BITMAP_CHUNK_BYTES, data.numel())
        rows = torch.index_select(ranks_of, 0, data[a:b], out=index[: b - a])
        flat = rows.add_(first[a:b]).view(-1).clamp_(max=sentinel)
        for lo, hi, numel, dest in runs:  # the runs of weights within these bytes: one gather each
            e0, e1 = 8 * max(lo, a), min(8 * min(hi, b), 8 * lo + numel)  # stream bits: 8 per mask byte
            if e1 > e0:
                torch.index_select(values, 0, flat[e0 - 8 * a : e1 - 8 * a], out=dest[e0 - 8 * lo : e1 - 8 * lo])
    return out


def _bitmap_runs(
    plans: list[RecordPlan], values: Tensor, targets: dict[str, Tensor]
) -> tuple[list[tuple[int, int, int, Tensor]], dict[str, Tensor]]:
    """(first byte, end byte, weights, destination) of each run of mask bytes that one gather writes: each
    record with a target, and each stretch of records without one (into a new buffer, 8 weights per mask
    byte, the padding bits' too); and the weights."""
    dense = values.new_empty(8 * sum(len(p.mask_bytes) for p in plans if p.name not in targets))
    runs: list[tuple[int, int, int, Tensor]] = []
    out, byte, at, stretch = {}, 0, 0, False  # stretch: the last run is a stretch of dense records
    for p in plans:
        size = len(p.mask_bytes)
        if p.name in targets:
            out[p.name] = targets[p.name]
            runs.append((byte, byte + size, p.numel, targets[p.name].view(-1)))
        else:
            out[p.name] = dense[at : at + p.numel].view(p.shape)
            if stretch:
                lo, _, _, dest = runs.pop()
                runs.append((lo, byte + size, 8 * (byte + size - lo), dest))
            else:
                runs.append((byte, byte + size, 8 * size, dense[at:]))
            at += 8 * size
        byte, stretch = byte + size, p.name not in targets
    return runs, out


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
