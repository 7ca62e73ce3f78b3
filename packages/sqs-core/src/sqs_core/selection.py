"""Exact top-fraction selection, shared by the pruning schedule and inference (eq. for Non-zero)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ._checks import check_flag, check_real, has_nan

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


SAMPLE = 1 << 16  # scores in _kth_smallest's strided sample
SAMPLE_MARGIN = 512  # sample ranks each side of the estimate: 4 standard deviations of a quantile's rank


def _kth_smallest(scores: torch.Tensor, rank: int) -> torch.Tensor:
    """``scores.kthvalue(rank).values`` (1-based), exact and several times faster on large tensors: a sorted
    strided sample of :data:`SAMPLE` scores brackets the answer, two counts over all scores verify that the
    bracket holds it, and ``kthvalue`` runs on the scores inside the bracket only (~1.6% of them). Where
    the counts refuse the bracket (a sample far from the whole's order) it runs on all of them."""
    total = scores.numel()
    if total <= 4 * SAMPLE:
        return scores.kthvalue(rank).values
    sample = scores[:: total // SAMPLE].sort().values
    estimate = (rank - 1) * sample.numel() // total
    low_at, high_at = estimate - SAMPLE_MARGIN, estimate + SAMPLE_MARGIN
    below, bounds = 0, []  # a bracket end past the sample's is open
    if low_at > 0:
        low = sample[low_at]
        bounds.append(scores >= low)
        below = total - int(torch.count_nonzero(bounds[-1]))
    if high_at < sample.numel() - 1:
        high = sample[high_at]
        bounds.append(scores <= high)
        if int(torch.count_nonzero(bounds[-1])) < rank:
            return scores.kthvalue(rank).values
    if below >= rank:
        return scores.kthvalue(rank).values
    if len(bounds) == 2 and bool(low == high):
        return low  # a bracket of one value (many equal scores)
    inside = bounds[0] if len(bounds) == 1 else bounds[0].logical_and_(bounds[1])
    return scores[inside].kthvalue(rank - below).values


def _keep_top(scores: torch.Tensor, n_keep: int) -> torch.Tensor:
    """Bool mask keeping exactly ``n_keep`` highest scores; ties broken by flat position (first wins)."""
    total = scores.numel()
    if n_keep >= total:
        return torch.ones(total, dtype=torch.bool, device=scores.device)
    threshold = _kth_smallest(scores, total - n_keep)  # the highest score pruned: fewer than n_keep are above
    keep = scores > threshold
    need = n_keep - int(torch.count_nonzero(keep))  # ≥ 0, and fewer than the scores equal to the threshold
    if need:
        keep[torch.nonzero(scores == threshold).squeeze(1)[:need]] = True
    return keep


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
    scores: dict[str, torch.Tensor], nonzero: float, *, per_layer: bool = False
) -> dict[str, torch.Tensor]:
    """:func:`keep_top_fraction` for float scores the caller built from parameters it has checked finite (the
    pruning schedule's s̃/τ'): the same masks without a second NaN pass over every score."""
    nonzero = check_nonzero(nonzero)
    check_flag("per_layer", per_layer)
    if per_layer:
        out = {}
        for name, s in scores.items():
            flat = _flat_scores(s)
            n_keep = max(1, round(nonzero * flat.numel()))
            out[name] = _keep_top(flat, n_keep).reshape(s.shape)
        return out
    flats = [_flat_scores(s) for s in scores.values()]
    cat = torch.cat(flats) if len(flats) > 1 else flats[0]
    mask = _keep_top(cat, max(1, round(nonzero * cat.numel())))
    out, start = {}, 0
    for (name, s), flat in zip(scores.items(), flats, strict=True):
        out[name] = mask[start : start + flat.numel()].reshape(s.shape)
        start += flat.numel()
    return out
