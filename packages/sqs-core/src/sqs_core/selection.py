"""Exact top-fraction selection, shared by the pruning schedule and inference (eq. for Non-zero)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ._checks import check_flag, check_real, has_nan
from ._compiled import _Kernel

__all__ = ["check_nonzero", "keep_top_fraction", "keep_top_fraction_of_checked"]


def check_nonzero(nonzero: Any, *, name: str = "nonzero") -> float:
    """``nonzero`` as a float if it is a real number (Python or NumPy, not a bool) in (0, 1]."""
    if isinstance(nonzero, torch.Tensor):
        raise ValueError(f"{name} must be a Python number in (0, 1], got a tensor {nonzero!r}: pass float(tensor)")
    out = check_real(name, nonzero)
    if not 0.0 < out <= 1.0:
        raise ValueError(f"{name} must lie in (0, 1], got {nonzero!r}")
    return out


def _check_scores(scores: Any) -> None:
    """A ValueError unless ``scores`` is a non-empty mapping of names to real (float, integer or bool) tensors
    without NaN: a NaN has no rank, so it would be kept or pruned arbitrarily. ±inf rank last and first."""
    if not isinstance(scores, Mapping) or not scores:
        got = f"{type(scores).__name__} {scores!r:.80}"
        raise ValueError(f"scores must be a non-empty dict of name -> tensor, got {got}")
    for name, value in scores.items():
        if not isinstance(value, torch.Tensor) or value.is_complex():
            kind = f"a {value.dtype} tensor" if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"scores[{name!r}] must be a real (float, integer or bool) tensor, got {kind}")
        if has_nan(value):
            count = f"{int(torch.isnan(value).sum())} of {value.numel()}"
            raise ValueError(f"scores[{name!r}] holds NaN ({count}): NaN has no rank")


def _flat_scores(scores: torch.Tensor) -> torch.Tensor:
    """Flat scores to rank: integer keys as they are, floats (and bools) as float32."""
    flat = scores.detach().reshape(-1)
    return flat.float() if flat.is_floating_point() or flat.dtype == torch.bool else flat


SAMPLE = 1 << 16  # keys in the strided sample that brackets the threshold
SAMPLE_MARGIN = 512  # sample ranks each side of the estimate: 4 standard deviations of a quantile's rank
SPARSE = 32  # _positions looks for set bytes word by word where fewer than 1 in SPARSE are set
CHUNK = 1 << 20  # keys a pass holds at once: its masks and key buffer stay small and are reused, not mapped anew


class _Keys:
    """The keys to rank: ``flats[i]`` as they are, or where ``divisors[i]`` is a tensor, ``flats[i] / divisors[i]``
    as :func:`_flat_scores` ranks it, computed chunk by chunk and never all at once: the pruning schedule ranks
    s̃ / τ' without a copy of every gate (a fresh T-sized tensor alone cost as much as the division)."""

    def __init__(
        self, flats: list[torch.Tensor], divisors: list[torch.Tensor | None], *, compiled: bool = False
    ) -> None:
        self.flats, self.divisors = flats, divisors
        self.total = sum(flat.numel() for flat in flats)
        self._buffer: torch.Tensor | None = None
        self.compiled = compiled and all(_compilable(f, d) for f, d in zip(flats, divisors, strict=True))

    def chunks(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(flat position of the chunk's first key, the chunk's keys); the keys are valid until the next one."""
        for start, piece, divisor in self.pieces():
            yield start, self._keys(piece, divisor, reuse=True)

    def pieces(self) -> Iterator[tuple[int, torch.Tensor, torch.Tensor | None]]:
        """(flat position of the chunk's first key, the chunk of its flat tensor, that tensor's divisor or None):
        :meth:`chunks` before the division."""
        start = 0
        for flat, divisor in zip(self.flats, self.divisors, strict=True):
            for a in range(0, flat.numel(), CHUNK):
                yield start + a, flat[a : a + CHUNK], divisor
            start += flat.numel()

    def at(self, piece: torch.Tensor, divisor: torch.Tensor | None) -> torch.Tensor:
        """The keys of ``piece`` (a gather of a flat tensor's entries) as :meth:`chunks` gives them."""
        return piece if divisor is None else self._keys(piece, divisor, reuse=False)

    def sample(self, step: int) -> torch.Tensor:
        """The keys at flat positions 0, step, 2·step, ... (a copy)."""
        pieces, start = [], 0
        for flat, divisor in zip(self.flats, self.divisors, strict=True):
            pieces.append(self._keys(flat[(-start) % step :: step], divisor, reuse=False))
            start += flat.numel()
        return torch.cat(pieces)

    def _keys(self, piece: torch.Tensor, divisor: torch.Tensor | None, *, reuse: bool) -> torch.Tensor:
        if divisor is None:
            return piece
        if not (reuse and piece.dtype == torch.float32):
            return _flat_scores(piece / divisor)
        if self._buffer is None or self._buffer.numel() < piece.numel() or self._buffer.device != piece.device:
            self._buffer = torch.empty(CHUNK, dtype=torch.float32, device=piece.device)
        return torch.div(piece, divisor, out=self._buffer[: piece.numel()])


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """``torch.nonzero`` of a flat bool mask (int64, ascending), on the CPU ~3× faster where few are set (1 in 100):
    first the 8-byte words that hold a set byte, then the bytes of those words only. Where more than 1 in
    :data:`SPARSE` are set, most words hold one and plain ``nonzero`` is the faster (as on an accelerator)."""
    head = mask.numel() - mask.numel() % 8
    if mask.device.type != "cpu" or head == 0 or mask.storage_offset() % 8:
        return torch.nonzero(mask).squeeze(1)
    if int(torch.count_nonzero(mask)) * SPARSE > mask.numel():
        return torch.nonzero(mask).squeeze(1)
    words = torch.nonzero(mask[:head].view(torch.int64)).squeeze(1)
    within = torch.nonzero(mask[:head].view(-1, 8)[words].reshape(-1)).squeeze(1)
    found = words[within >> 3] * 8 + (within & 7)
    if head == mask.numel():
        return found
    return torch.cat([found, torch.nonzero(mask[head:]).squeeze(1) + head])


def _bracket(keys: _Keys, rank: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(low, high) that likely hold the ``rank``-th smallest key, from a strided sample of :data:`SAMPLE` keys: its
    order statistics ±:data:`SAMPLE_MARGIN` ranks about its estimate (``kthvalue``, not a sort of the sample: 1.9
    against 5.6 ms for 65,536 keys, Intel Xeon, 2 threads); None: that end is open."""
    if keys.total <= 4 * SAMPLE:
        return None, None
    sample = keys.sample(keys.total // SAMPLE)
    estimate = (rank - 1) * sample.numel() // keys.total
    low_at, high_at = estimate - SAMPLE_MARGIN, estimate + SAMPLE_MARGIN
    low = sample.kthvalue(low_at + 1).values if low_at > 0 else None
    high = sample.kthvalue(high_at + 1).values if high_at < sample.numel() - 1 else None
    return low, high


def _keep_top(scores: torch.Tensor | _Keys, n_keep: int) -> torch.Tensor:
    """Bool mask keeping exactly ``n_keep`` highest keys; ties broken by flat position (first wins). Exact, and
    several times faster than a ``kthvalue`` over all keys: one pass over the keys in chunks marks those above a
    bracket from :func:`_bracket` and gathers those inside it (~1.6%), whose ``kthvalue`` is the threshold.
    Where the bracket misses the threshold (a sample far from the whole's order) an open one gathers them all."""
    keys = scores if isinstance(scores, _Keys) else _Keys([scores.reshape(-1)], [None])
    if n_keep >= keys.total:
        return torch.ones(keys.total, dtype=torch.bool, device=keys.flats[0].device)
    rank = keys.total - n_keep  # the threshold is the rank-th smallest key, the highest pruned one
    low, high = _bracket(keys, rank)
    if low is not None and high is not None and bool(low == high):
        kept = _keep_top_at(keys, n_keep, rank, low)  # a bracket of one value (many equal keys)
    else:
        kept = _keep_top_in(keys, n_keep, rank, low, high)
    if kept is None:  # the bracket missed the threshold; an open one holds it
        kept = _keep_top_in(keys, n_keep, rank, None, None)
        assert kept is not None
    return kept


def _keep_top_in(
    keys: _Keys, n_keep: int, rank: int, low: torch.Tensor | None, high: torch.Tensor | None
) -> torch.Tensor | None:
    """:func:`_keep_top` with the threshold looked for in [``low``, ``high``] (None: open), or None where the
    counts show it is not there. Ties at the threshold: the first positions win."""
    keep = torch.empty(keys.total, dtype=torch.bool, device=keys.flats[0].device)
    if keys.compiled and low is not None and high is not None:
        n_below, n_above, position, value = _split_compiled(keys, low, high, keep)
    else:
        n_below, n_above, position, value = _split(keys, low, high, keep)
    if not _holds(keys.total, rank, n_below, n_above):
        return None
    threshold = value.kthvalue(rank - n_below).values
    over = value > threshold
    keep[position[over]] = True
    need = n_keep - n_above - int(torch.count_nonzero(over))  # ≥ 0, and fewer than the keys tied at the threshold
    if need:
        keep[position[value == threshold][:need]] = True
    return keep


def _split(keys: _Keys, low: torch.Tensor | None, high: torch.Tensor | None, keep: torch.Tensor):
    """One pass over the keys, chunk by chunk: ``keep`` True above ``high`` (None: nowhere), and (the count below
    ``low`` (None: 0), the count above ``high``, the positions and keys of those in between)."""
    below, above = keep.new_zeros(2, dtype=torch.int64)  # counts on the device: one sync after the pass
    positions, values = [], []
    for start, chunk in keys.chunks():
        out = keep[start : start + chunk.numel()]  # above the bracket: kept, whatever the threshold
        if high is None:
            out.zero_()
        else:
            above += torch.count_nonzero(torch.gt(chunk, high, out=out))
        if low is None:
            inside = out.logical_not()
        else:
            inside = torch.lt(chunk, low)
            below += torch.count_nonzero(inside)
            inside.logical_or_(out).logical_not_()
        found = _positions(inside)
        positions.append(found + start)
        values.append(chunk[found])
    return int(below), int(above), torch.cat(positions), torch.cat(values)


def _split_compiled(keys: _Keys, low: torch.Tensor, high: torch.Tensor, keep: torch.Tensor):
    """:func:`_split` with each chunk's division, comparisons and counts one compiled kernel
    (:func:`_split_chunk`): over 2^24 gates 30 against 40–44 ms eagerly, whose comparisons write their bool masks
    several times slower than arithmetic does; the 4096² layer's schedule update 63 against 82–84 ms (Intel Xeon,
    2 threads, session 51)."""
    below, above = keep.new_zeros(2, dtype=torch.int64)
    inside = torch.empty(min(CHUNK, keys.total), dtype=torch.uint8, device=keep.device)
    keep_bytes, positions, values = keep.view(torch.uint8), [], []
    for start, piece, divisor in keys.pieces():
        n = piece.numel()
        counts = _SPLIT_KERNEL(piece, divisor, low, high, keep_bytes[start : start + n], inside[:n])
        above += counts[0]
        below += counts[1]
        found = _positions(inside[:n].view(torch.bool))
        positions.append(found + start)
        values.append(keys.at(piece[found], divisor))
    return int(below), int(above), torch.cat(positions), torch.cat(values)


def _split_chunk(piece, divisor, low, high, keep, inside):
    """The kernel of :func:`_split_compiled`: the keys ``piece`` / ``divisor`` (None: ``piece``); ``keep`` (uint8)
    1 above ``high``, ``inside`` 1 in [``low``, ``high``], else 0; returns (count above, count below). The masks as
    int32 arithmetic, stored as bytes: inductor stores a comparison's mask as bytes lane by lane, 10× slower."""
    key = piece if divisor is None else piece / divisor
    above, below = (key > high).to(torch.int32), (key < low).to(torch.int32)
    keep.copy_(above.to(torch.uint8))
    inside.copy_((1 - above - below).to(torch.uint8))
    return above.sum(dtype=torch.int64), below.sum(dtype=torch.int64)


_SPLIT_KERNEL = _Kernel(_split_chunk)  # compiled on its first call


def _compilable(flat: torch.Tensor, divisor: torch.Tensor | None) -> bool:
    """Whether :func:`_split_compiled` gives :func:`_split`'s keys for ``flat`` and ``divisor``: float32 keys on
    the CPU, divided (if at all) by a float32 0-d tensor, so that the kernel divides as the eager pass does."""
    floats = flat.dtype == torch.float32 and (divisor is None or divisor.dtype == torch.float32)
    return floats and flat.device.type == "cpu"


def _keep_top_at(keys: _Keys, n_keep: int, rank: int, value: torch.Tensor) -> torch.Tensor | None:
    """:func:`_keep_top` where the threshold is likely ``value`` (many keys equal it), or None where the counts
    show it is not: the keys above it kept, then the first of those equal to it, chunk by chunk, without
    gathering the (perhaps all T) equal ones."""
    keep = torch.empty(keys.total, dtype=torch.bool, device=keys.flats[0].device)
    below, above = keep.new_zeros(2, dtype=torch.int64)
    for start, chunk in keys.chunks():
        above += torch.count_nonzero(torch.gt(chunk, value, out=keep[start : start + chunk.numel()]))
        below += torch.count_nonzero(torch.lt(chunk, value))
    n_below, n_above = int(below), int(above)
    if not _holds(keys.total, rank, n_below, n_above):
        return None
    need = n_keep - n_above  # ≥ 0: the rank-th smallest key is ``value``, and at most n_keep lie above it
    for start, chunk in keys.chunks():
        tied, out = chunk == value, keep[start : start + chunk.numel()]
        count = int(torch.count_nonzero(tied))
        if count >= need:
            out[torch.nonzero(tied).squeeze(1)[:need]] = True
            break
        out.logical_or_(tied)
        need -= count
    return keep


def _holds(total: int, rank: int, below: int, above: int) -> bool:
    """Whether the rank-th smallest of ``total`` keys lies in a bracket with ``below`` keys under it and ``above``
    over it."""
    return below < rank <= total - above


def keep_top_fraction(
    scores: dict[str, torch.Tensor], nonzero: float, *, per_layer: bool = False
) -> dict[str, torch.Tensor]:
    """Masks keeping the ``nonzero`` fraction of highest scores: globally over all tensors (default) or
    within each tensor. Scores below the Non-zero quantile are pruned; the kept count is
    round(nonzero · T) exactly (at least one weight). Float scores are ranked as float32, integer ones as
    they are."""
    _check_scores(scores)
    return keep_top_fraction_of_checked(scores, nonzero, per_layer=per_layer)


def keep_top_fraction_of_checked(
    scores: dict[str, torch.Tensor],
    nonzero: float,
    *,
    per_layer: bool = False,
    divisors: Mapping[str, torch.Tensor] | None = None,
    compiled: bool = False,
) -> dict[str, torch.Tensor]:
    """:func:`keep_top_fraction` for float scores the caller built from parameters it has checked finite (the
    pruning schedule's gates): the same masks without a second NaN pass over every score. ``divisors``: a
    positive 0-d tensor per name (others: none) by which that name's scores are divided before ranking, as
    ``scores[name] / divisors[name]`` would be, chunk by chunk (the schedule ranks s̃ / τ' without building it).
    ``compiled``: the pass over float32 keys on the CPU as a ``torch.compile``'d kernel (:func:`_split_compiled`;
    the same masks), for callers whose layers compile their kernels anyway (the schedule)."""
    nonzero = check_nonzero(nonzero)
    check_flag("per_layer", per_layer)
    divisors = {} if divisors is None else divisors
    flats = {name: s.detach().reshape(-1) if name in divisors else _flat_scores(s) for name, s in scores.items()}
    groups = [[name] for name in scores] if per_layer else [list(scores)]
    out = {}
    for names in groups:
        keys = _Keys([flats[n] for n in names], [divisors.get(n) for n in names], compiled=compiled)
        mask, start = _keep_top(keys, max(1, round(nonzero * keys.total))), 0
        for name in names:
            out[name] = mask[start : start + flats[name].numel()].reshape(scores[name].shape)
            start += flats[name].numel()
    return out
