"""Certified one-hot responsibilities: K-independent work for the weights whose φ is one-hot.

At the paper's τ = 5e-4 almost every row φ(θ_i) of eq. compute-phi-k is one-hot to far below float
precision: θ^avg_i = λ̃_i μ_{k*_i}, and the only non-zero gradient of the mixture part is the one that
reaches μ_{k*_i}. Evaluating all K components for such a weight (the T·K work) is wasted. Here each
weight is *certified* one-hot with O(1) work, from a bound rather than a heuristic:

1. The range of the tensor's weights is cut into B bins (:func:`bin_count`); each bin belongs to the
   window whose weights it holds. For each bin b and component k of that window the largest log density
   any θ in the bin can have is exact: Q_bk = log π_k − log σ_k − ½log 2π − ½ dist(μ_k, bin)²/σ_k².
   Per bin keep the best component j_b and the next two values U_b ≥ U3_b (a (B, K) table per call:
   B·K work, independent of T).
2. For θ_i in bin b, q* = q_{j_b}(θ_i); every other component has q_j ≤ U_b.
3. The bound on the gap between the stage-2 logit of j_b and that of any other component:
   ``standard``: (q* − U_b)/τ;  ``paper``: (1 − r) / ((1 + r + (K−2) r₃) τ) with r = exp(e^{U_b} − e^{q*})
   and r₃ the same from the third-largest Q_bk: upper bounds on the ratios of the rivals' e^{π N} to the
   winner's (eq. compute-phi-k).
4. A weight is certified when the gap is ≥ :data:`CERTIFY_MARGIN` + log K. The gap grows with q*, so
   this is q* ≥ q_min(b), i.e. |θ_i − μ_{j_b}| ≤ radius_b: per weight, one bin lookup and one comparison.
   j_b is then argmax_k φ_k and every other φ_j is below e^{-40}, and so are their contributions to
   θ^avg and Var_q. Their contributions to the gradients carry an extra factor |∂q_j/∂μ_j|/τ ≈ d/(σ²τ)
   (d the distance to the component): about e^{20} for the σ ≈ 1e-4, d ≈ 1e-3 of a 4096² layer, e^{31}
   in the extreme d = 1, σ = 1e-5, so dropped gradient terms stay below e^{-9} of the kept one.

Weights that are not certified (ties between two components, weights far from every component under
the paper's formula, large τ) take their bin's nearby components or the full K-component path in
:mod:`sqs_core.chunked`. Under the paper's formula a bin where every component is lumped (:data:`ALL_LUMPED`:
φ = 1/K exactly) and one component has the largest log π N at every θ of the bin (sqs_core._settled) is
*settled* (:data:`LUMPED_SETTLED`): its weights' m = Σ_k μ_k / K and k* are the bin's, which both training steps
evaluate with the certified weights (a quarter of a trained 4096² layer's kept weights, late in training:
sqs_core._one_hot, sqs_core._fused).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import torch

from ._bounds import _blocked_bin_bounds, _peak_log_density
from ._indices import flat_indices, grouped_by_class
from ._nearby import nearby_tables
from ._settled import settled_columns, window_mean
from ._wide import wide_widths
from .mixture import PAPER_CLAMP

__all__ = [
    "ALL_LUMPED",
    "CERTIFIED",
    "CERTIFY_MARGIN",
    "LUMPED_SCAN",
    "LUMPED_SETTLED",
    "NARROW",
    "NARROW_WIDTHS",
    "NEARBY",
    "NEARBY_WIDTHS",
    "BinTable",
    "bin_components",
    "bin_count",
    "bin_index",
    "bin_of",
    "bin_table",
    "certify_one_hot",
    "check_finite_range",
    "classify",
    "columns_of",
    "components_of_bins",
    "flat_indices",
    "lump_log_density",
    "owns_bin",
    "uncovered_blocks",
    "window_value_ranges",
]

CERTIFY_MARGIN = 40.0  # nats: every non-winning φ_j ≤ e^{-40} on a certified weight
NEARBY = 32  # components an uncovered weight is evaluated on when the others are negligible (paper formula)
NARROW_WIDTHS = (4, 8, 16)  # a bin takes the narrowest of these that leaves only negligible components out
NARROW = NARROW_WIDTHS[-1]  # every bin's table holds its NARROW + 1 largest bounds; the bins that need more, NEARBY + 1
NEARBY_WIDTHS = (*NARROW_WIDTHS, *range(NARROW + 1, NEARBY + 1))  # every width a bin can take; above NARROW, at
# most _wide.WIDE_CLASSES of them in one table, chosen from its bins' needs (_nearby_table)
CERTIFIED = 255  # the class (:func:`classify`) of a certified weight
ALL_LUMPED = 1  # the class of a weight in a bin where every component is lumped (paper formula): φ = 1/K exactly
LUMPED_SCAN = NEARBY_WIDTHS[0]  # an ALL_LUMPED weight's k*: the argmax of log π N over its bin's first columns
LUMPED_SETTLED = 254  # the class of a weight in an all-lumped bin whose k* is one component throughout (_settled)


def lump_log_density(dtype: torch.dtype) -> float:
    """log π N below which e^{π N} rounds to exactly 1 in ``dtype`` (π N < eps/2): such components are
    indistinguishable in the paper's first softmax, so the full evaluation gives them one shared φ too."""
    return math.log(torch.finfo(dtype).eps) - 1.0


MIN_BINS, MAX_BINS = 256, 1 << 16  # bins: T/4 within these, so the table costs ≤ T·K/4


def bin_count(num_weights: int) -> int:
    """Bins for a tensor of ``num_weights`` weights; about 2K/bins of them share a bin with a boundary."""
    return max(MIN_BINS, min(MAX_BINS, num_weights // 4))


@dataclass(frozen=True)
class BinTable:
    """Bins over the range of one tensor's weights. A bin is *owned* by the one window whose weights
    fall in it (windows are value intervals), or by none (−1) where the ranges of two windows meet."""

    low: float  # left edge of bin 0 (the smallest weight)
    inv_width: float  # bins per unit of θ
    owner: torch.Tensor  # (B,) uint8 window id, 255 for no owner
    best: torch.Tensor  # (B,) uint8 component j_b within the owner's K (LUMPED_SETTLED bins: their k*)
    mean_radius: torch.Tensor  # (2, B): μ_{j_b} (LUMPED_SETTLED: Σ_k μ_k / K), and the radius |θ − μ_{j_b}| ≤ radius
    # that certifies (−1: none)
    several_windows: bool  # whether a weight's window must be checked against the bin's owner
    nearby: torch.Tensor  # (B, table_columns(K)) int32 flat indices w·K + k of the bin's largest Q_bk, largest first
    near_width: torch.Tensor  # (B,) uint8: the fewest leading ``nearby`` columns (one of NEARBY_WIDTHS) outside
    # which every component has Q_bk ≤ lump_log_density (paper formula), 0 where even NEARBY leave some out,
    # ALL_LUMPED where every component does, LUMPED_SETTLED where moreover one component is k* throughout
    lumpable: tuple[int, ...]  # the classes ALL_LUMPED, LUMPED_SETTLED and NEARBY_WIDTHS some bin's near_width holds
    codes: torch.Tensor  # (B,) int32 best | near_width << 8 | owner << 16: the compiled certificate's one lookup

    @property
    def any_lumpable(self) -> bool:
        """Whether some bin takes the nearby or the all-lumped evaluation."""
        return bool(self.lumpable)


def bin_table(
    theta, window_ids, means, log_stds, log_mixing, kind: str, temperature: float, window_ranges=None, *, bounds=None
) -> BinTable:
    """The table for the flat weights ``theta`` (windows ``window_ids``) and (W, K) component parameters
    (no graph): B·K work plus one min/max pass over the weights. Valid for exactly these weights.
    ``window_ranges`` (W, 2), each window's smallest and largest weight, if the caller has them cached.
    ``bounds``: sqs_core._bounds._bin_bounds compiled (sqs_core._fused); eagerly its blocked form."""
    bounds = bounds or _blocked_bin_bounds
    th, (num_windows, k) = theta.detach(), means.shape
    means, log_stds, log_mixing = means.detach(), log_stds.detach(), log_mixing.detach()
    if window_ranges is None:
        window_ranges = window_value_ranges(th, window_ids, num_windows)
    lo, hi = float(window_ranges[:, 0].min()), float(window_ranges[:, 1].max())
    check_finite_range(lo, hi)
    bins = bin_count(th.numel())
    span = hi - lo  # overflows for float64 weights near ±1.8e308
    width = max(span, 1e-30) / bins if math.isfinite(span) else hi / bins - lo / bins
    edges = lo + width * torch.arange(bins + 1, dtype=torch.float64, device=means.device)
    # each bin is padded by 1% of its width on both sides, so θ rounded into a neighbouring bin stays covered
    left = (edges[:-1] - 0.01 * width).to(means.dtype)
    right = (edges[1:] + 0.01 * width).to(means.dtype)
    owner = _bin_owners(window_ranges, num_windows, left, right)
    row = owner.clamp(min=0)  # each bin's owner's components
    width_top = max(3, NARROW + 1)
    padding = max(0, width_top - k)  # −inf columns, so that topk finds width_top values for any K
    bound_rows = bounds(left, right, row, means, log_stds, log_mixing, padding)
    top = torch.topk(bound_rows, width_top, dim=1)
    j = top.indices[:, 0]
    log_std_j = log_stds[row, j]
    peak = _peak_log_density(log_mixing[row, j], log_std_j)
    # q_j(θ) = peak_j − ½ z² ≥ q_min  ⟺  |z| ≤ √(2·slack),  slack = peak_j − q_min
    slack = _certifying_slack(peak, top.values[:, 1], top.values[:, 2], kind, temperature, k)
    radius = torch.exp(log_std_j) * torch.sqrt(2 * slack.clamp(min=0))
    radius = torch.where((slack >= 0) & (owner >= 0), radius, torch.full_like(radius, -1.0))
    mean_radius = torch.stack([means[row, j], radius])  # rows: contiguous, as the gathers of classify want
    near_width = _near_widths(top.values, owner, kind, k, means.dtype)
    nearby = _nearby_table(top.indices, bound_rows, near_width, owner, kind, k, means.dtype)
    j = j.clone()  # a view of top.indices
    _settle(near_width, j, mean_radius, nearby, (left, right), (means, log_stds, log_mixing, row))
    owner_u8, best_u8 = owner.to(torch.uint8), j.to(torch.uint8)
    present = set(torch.unique(near_width).tolist())  # B entries; on a GPU one wait, where a class's nonzero is one
    lumpable = tuple(w for w in (ALL_LUMPED, LUMPED_SETTLED, *NEARBY_WIDTHS) if w in present)
    codes = best_u8.int() | (near_width.int() << 8) | (owner_u8.int() << 16)
    several = num_windows > 1
    return BinTable(lo, 1.0 / width, owner_u8, best_u8, mean_radius, several, nearby, near_width, lumpable, codes)


def _settle(near_width, best, mean_radius, nearby, edges, params):
    """In place: the all-lumped bins whose k* is one component throughout (sqs_core._settled) take the class
    :data:`LUMPED_SETTLED` in ``near_width``, that component as ``best`` and their window's Σ_k μ_k / K (the m of
    every all-lumped weight, sqs_core._nearby.lumped_moments) as ``mean_radius``'s mean, and radius −1: certify none.
    ``edges``: the bins' padded (left, right); ``params``: (W, K) μ, log σ, log π and each bin's window row."""
    lumped = flat_indices(near_width == ALL_LUMPED)
    if not lumped.numel():
        return
    means, log_stds, log_mix, row = params
    scan = nearby.index_select(0, lumped)[:, :LUMPED_SCAN].long()
    low, high = (e.index_select(0, lumped).double() for e in edges)
    column = settled_columns(scan, nearby_tables(means, log_stds, log_mix), low, high, means.dtype)
    bins = lumped[column >= 0]
    if not bins.numel():
        return
    rows, k = row.index_select(0, bins), means.shape[1]
    near_width[bins] = LUMPED_SETTLED
    best[bins] = column[column >= 0] - rows * k
    mean_radius[0, bins] = window_mean(means).index_select(0, rows)
    mean_radius[1, bins] = -1.0  # the radius was μ_{j_b}'s (no weight of a lumped bin is near it), not the mean's


def _near_widths(top_values, owner, kind, k, dtype):
    """(B,) uint8: per bin the narrowest w in NARROW_WIDTHS whose (w+1)-th largest bound Q_bk is at
    most :func:`lump_log_density` (0: none; :func:`_nearby_table` gives the wider ones). Under the paper's
    formula a component whose e^{π N} rounds to 1 shares one φ with all such, so the bin's weights need only
    their w largest components plus one lumped term. :data:`ALL_LUMPED` where even the largest bound is that
    small: every φ is then exactly 1/K, and m = Σ_k μ_k / K needs no component evaluated."""
    widths = torch.zeros(owner.shape, dtype=torch.uint8, device=owner.device)
    if kind != "paper":
        return widths
    owned, lump = owner >= 0, lump_log_density(dtype)
    for w in sorted(NARROW_WIDTHS, reverse=True):  # the narrowest that fits wins
        if k > w:
            widths.masked_fill_(owned & (top_values[:, w] <= lump), w)
    return widths.masked_fill_(owned & (top_values[:, 0] <= lump), ALL_LUMPED)


def _nearby_table(top_indices, bound_rows, near_width, owner, kind, k, dtype):
    """(B, :func:`table_columns`) int32 flat indices w·K + k of each bin's largest bounds, largest first (int32: see
    _one_hot._flat_index). Every bin has its NARROW largest from ``top_indices``; a bin that needs more (its
    window's, paper formula, ``near_width`` 0 and K > NEARBY) gets its NEARBY largest from a topk of its own
    row of ``bound_rows``, and in ``near_width`` (in place), where at most NEARBY components matter, one of the
    widths sqs_core._wide chooses for this table's wide bins (0: all K). Such bins are few (bunched means), and a
    topk of NEARBY + 1 over every bin took 51 against 34 ms for NARROW + 1 (65,536 bins × 64 components, Intel
    Xeon, 2 threads). The columns past NARROW of the other bins are never read."""
    row, columns = owner.clamp(min=0), table_columns(k, kind)
    nearby = torch.empty((row.numel(), columns), dtype=torch.int32, device=row.device)
    narrow = min(NARROW, columns)
    nearby[:, :narrow] = (top_indices[:, :narrow].clamp(max=k - 1) + row[:, None] * k).int()
    nearby[:, narrow:] = nearby[:, :1]
    if kind != "paper" or k <= NEARBY:
        return nearby
    wide = flat_indices((near_width == 0) & (owner >= 0))
    if wide.numel():
        top = torch.topk(bound_rows.index_select(0, wide), NEARBY + 1, dim=1)
        nearby[wide] = (top.indices[:, :NEARBY] + row[wide, None] * k).int()
        need = (top.values > lump_log_density(dtype)).sum(1)  # > NARROW; NEARBY + 1: more than NEARBY matter
        near_width[wide] = wide_widths(need, NARROW, NEARBY)
    return nearby


def check_finite_range(low: float, high: float) -> None:
    """A FloatingPointError where the weights' smallest ``low`` or largest ``high`` is NaN or inf: no bin holds such
    a weight (a NaN cast to a bin index is undefined: the compiled kernels would read out of bounds)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        raise FloatingPointError(
            f"the weights θ hold NaN or inf (smallest {low}, largest {high}): a diverged training step "
            "(train_weight=True) or a non-finite checkpoint; restore θ from a checkpoint or lower the learning rate"
        )


def bin_index(theta: torch.Tensor, table: BinTable) -> torch.Tensor:
    """The bin of each weight (int32)."""
    return bin_of(theta, table.low, table.inv_width, table.owner.numel())


def bin_of(theta, low, inv_width, count):
    """The bin (int32) of weights ``theta`` in ``count`` bins from ``low``, ``inv_width`` bins per unit: the one
    expression of :func:`bin_index` and of the compiled kernels (sqs_core._fused), which pass ``low`` and
    ``inv_width`` as 0-d tensors so that their values are not baked into the graphs. Clamped as a float,
    then truncated to int32: the same bins as truncating first, and AVX2 has no float → int64 conversion
    (inductor emulates it lane by lane)."""
    return ((theta - low) * inv_width).clamp(0, count - 1).int()


def window_value_ranges(theta: torch.Tensor, window_ids: torch.Tensor, num_windows: int) -> torch.Tensor:
    """(W, 2): the smallest and the largest weight of each window (±inf for an empty one)."""
    if num_windows == 1:
        return torch.stack(torch.aminmax(theta.detach())).reshape(1, 2)
    ids = window_ids.long()
    low = torch.full((num_windows,), math.inf, dtype=theta.dtype, device=theta.device)
    low = low.scatter_reduce(0, ids, theta, "amin")
    high = torch.full((num_windows,), -math.inf, dtype=theta.dtype, device=theta.device)
    high = high.scatter_reduce(0, ids, theta, "amax")
    return torch.stack([low, high], dim=1)


def _bin_owners(window_ranges, num_windows, left, right):
    """(B,) the window whose weights' range meets each bin, −1 where two ranges meet it."""
    if num_windows == 1:
        return torch.zeros(left.numel(), dtype=torch.long, device=left.device)
    ranges = window_ranges.to(left.dtype)
    meets = (ranges[None, :, 0] <= right[:, None]) & (ranges[None, :, 1] >= left[:, None])
    first = meets.to(torch.uint8).argmax(1)
    return torch.where(meets.sum(1) == 1, first, torch.full_like(first, -1))


def _certifying_slack(peak, rival, third, kind, temperature, k):
    """peak − q_min, with q_min the smallest q* of the best component for which the stage-2 gap reaches the
    margin, given the runner-up bound U and third bound U3 (−inf where no q* can, +inf for K = 1). Formed as
    (peak − U) − (q_min − U): q_min − U can lie below the float resolution of U (e^U ≈ 2·10^5, a σ of 10^-6), where
    q_min itself rounded to U and a weight tied between two identical components was certified (session 63)."""
    need = temperature * (CERTIFY_MARGIN + math.log(k))  # the gap in stage-1 units (φ' differences)
    if kind == "standard":
        return (peak - rival) - need
    if kind != "paper":
        raise ValueError(f"unknown responsibility kind {kind!r}; expected 'paper' or 'standard'")
    if need >= 1 or k == 1:  # φ' differences never exceed 1
        return torch.full_like(rival, -math.inf if need >= 1 else math.inf)
    # With a* = e^{q*}, x = a* − e^U: r = e^{-x}, r3 = c3·e^{-x}, c3 = exp(e^{U3} − e^U); the gap
    # (1 − r)/(1 + r + (K−2) r3) ≥ need  ⟺  x ≥ log(1 + need(1 + (K−2) c3)) − log(1 − need);
    # q_min = log(e^U + x_min) = U + log1p(x_min / e^U), or log x_min where e^U underflows to 0.
    a_rival = torch.exp(rival.clamp(max=PAPER_CLAMP))
    c3 = torch.exp(torch.exp(third.clamp(max=PAPER_CLAMP)) - a_rival)
    x_min = torch.log1p(need * (1 + (k - 2) * c3)) - math.log1p(-need)
    above = torch.log1p(x_min / a_rival)  # q_min − U (inf where a_rival is 0: the other branch)
    some = a_rival > 0
    slack = torch.where(some, (peak - rival) - above, peak - torch.log(x_min))
    q_min = torch.where(some, rival + above, torch.log(x_min))
    return torch.where(q_min <= PAPER_CLAMP, slack, torch.full_like(slack, -math.inf))  # a is clamped at e^80


def certify_one_hot(theta: torch.Tensor, window_ids: torch.Tensor, table: BinTable):
    """(k* uint8 within the window, μ_{k*}, certified bool), each (n,), for flat weights ``theta`` of the
    tensor the table was built for. Where certified, k* = argmax_k φ_k(θ_i) and φ is one-hot."""
    kstar, mean, classes = classify(theta, window_ids, table)
    return kstar, mean, classes == CERTIFIED


def classify(theta: torch.Tensor, window_ids: torch.Tensor, table: BinTable, keep: torch.Tensor | None = None):
    """(k*, μ_{k*}, class uint8) as :func:`certify_one_hot`, the class saying how each weight is evaluated:
    :data:`CERTIFIED`; a width in NEARBY_WIDTHS or :data:`ALL_LUMPED` (its bin's ``near_width``, where the bin
    is its window's); 0: on all K.

    With the pruning ``keep`` mask a pruned weight is classed :data:`CERTIFIED` too, at its bin's best component
    (the training forward's skip). Exact: its λ̃ is 0, so θ^avg = λ̃ Σ_k φ_k μ_k = 0 and Var_q = σ_0² whatever φ,
    every gradient through φ carries the factor λ̃, and its gate-KL term −log(1 − λ) has no k*; so the nearby and
    all-K evaluations shrink with the non-zero rate. Only its k* differs from the argmax (what
    ``SpikeGMMPosterior.kl`` reuses until the next forward; ``set_mask_`` drops it when a weight returns)."""
    b = bin_index(theta, table)
    # 1-D gathers from contiguous rows (B floats each): 2.5× faster than one of (B, 2) rows and a copy
    mean, radius = (row.index_select(0, b) for row in table.mean_radius)
    owns = owns_bin(table, b, window_ids)
    certified, widths = (theta - mean).abs() <= radius, table.near_width.index_select(0, b)
    if owns is not True:  # several windows (with one, an & with True copied the mask: 0.29 ms per 2^20)
        certified &= owns
        widths *= owns
    if keep is not None:
        certified |= ~keep  # 50× faster than a masked_fill_ of the classes by a random mask
    # torch.where(certified, CERTIFIED, width) as an OR with 0 or 255 (= CERTIFIED, every bit): 11× faster
    classes = widths.bitwise_or_(certified.view(torch.uint8) * CERTIFIED)
    return table.best.index_select(0, b), mean, classes


def uncovered_blocks(
    classes: torch.Tensor,
    table: BinTable,
    k: int,
    block_elements: int,
    index_dtype: torch.dtype = torch.int64,
    *,
    settled_inline: bool = False,
) -> Iterator[tuple[torch.Tensor, int]]:
    """(indices, class) of the weights :func:`classify` did not certify, in non-empty blocks of
    ``block_elements`` // :func:`columns_of` (all K: class 0, ``block_elements`` // K), the classes in the order
    of ``table.lumpable`` then 0, each class's indices ascending: one ``nonzero`` over all weights
    (:func:`flat_indices` with ``index_dtype``), then one stable sort of the uncovered weights' classes, which
    cuts them into classes at once. Against a ``nonzero`` per class over the uncovered (session 39's code), on
    the 3.7M uncovered weights of five classes of the 4096² layer's step-300 state: 35 against 52 ms (Intel
    Xeon, 2 threads). Weights of class :data:`LUMPED_SETTLED` come as ALL_LUMPED blocks, or with ``settled_inline``
    (both training steps, which evaluate them with the certified ones) not at all."""
    last = LUMPED_SETTLED if settled_inline else CERTIFIED
    uncovered = flat_indices(classes, index_dtype, test=partial(_below, last=last))
    groups = [(uncovered, 0)]
    if uncovered.numel() and table.any_lumpable:
        grouped, spans = grouped_by_class(uncovered, classes.index_select(0, uncovered))
        order = (*(w for w in table.lumpable if w < last), 0)
        if not set(spans) <= set(order):  # a class no bin has: classes and table do not belong together
            raise RuntimeError(f"uncovered weights of classes {sorted(set(spans) - set(order))} outside {order}")
        groups = [(grouped[spans[w][0] : sum(spans[w])], w) for w in order if w in spans]
    for indices, width in ((i, ALL_LUMPED if w == LUMPED_SETTLED else w) for i, w in groups):
        for block in torch.split(indices, max(1, block_elements // (columns_of(width) or k))):
            if block.numel():
                yield block, width


def _below(classes: torch.Tensor, last: int) -> torch.Tensor:
    """Non-zero exactly where ``classes`` < ``last``: for uint8 classes and ``last`` CERTIFIED (255) or
    LUMPED_SETTLED (254), ~c or (~c) >> 1 (uint8, which ``nonzero`` takes as it is), else ``classes < last``. Eager
    comparisons write their bool output several times slower than byte arithmetic: over 16.8M classes 11–12 against
    1.6–1.7 ms (Intel Xeon, 2 threads, session 51)."""
    if classes.dtype != torch.uint8 or last not in (CERTIFIED, LUMPED_SETTLED):
        return classes < last
    inverted = torch.bitwise_not(classes)  # 255 - c: 0 for CERTIFIED, 1 for LUMPED_SETTLED, ≥ 2 below both
    return inverted if last == CERTIFIED else inverted.bitwise_right_shift_(1)


def bin_components(table: BinTable, theta: torch.Tensor, width: int) -> torch.Tensor:
    """(width, n) int64 flat indices of the ``width`` largest-bound components of the bins of weights ``theta``
    (``width`` > 0): a column per component, as sqs_core._nearby evaluates them."""
    return components_of_bins(table.nearby[:, :width], bin_index(theta, table))


def table_columns(k: int, kind: str = "paper") -> int:
    """Columns of a bin table's ``nearby`` for K = ``k``: the widest width a bin can take (w < K in NARROW_WIDTHS,
    NEARBY where K > NEARBY: :func:`_nearby_table`), at least :data:`LUMPED_SCAN`; none for the standard
    responsibility, whose uncovered weights take all K. The table lives from a training forward to its backward
    for every layer at once: 65,536 bins × 32 int32 columns are 8 MiB, six times the weights of a
    576 × 576 layer, and held by each of a 30-block language model's 211 layers they were 1.7 GB."""
    if kind != "paper":
        return 0
    return max([LUMPED_SCAN, *(w for w in NARROW_WIDTHS if w < k), *([NEARBY] if k > NEARBY else [])])


def columns_of(width: int) -> int:
    """How many of its bin's ``nearby`` columns a weight of class ``width`` (of :func:`classify`, not
    CERTIFIED) is evaluated on: its width, :data:`LUMPED_SCAN` for ALL_LUMPED (only for k*), 0 for all K."""
    return LUMPED_SCAN if width == ALL_LUMPED else width


def components_of_bins(nearby: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """(width, n) int64 flat component indices of weights in ``bins`` from a (B, width) ``nearby`` table."""
    return nearby.index_select(0, bins).t().to(torch.int64, memory_format=torch.contiguous_format)


def owns_bin(table: BinTable, bins: torch.Tensor, window_ids: torch.Tensor) -> torch.Tensor | bool:
    """Whether each weight's bin belongs to the weight's own window (True when there is one window)."""
    if not table.several_windows:
        return True
    return table.owner.index_select(0, bins) == window_ids
