"""The widths of a bin table's wide bins: those whose weights need more nearby components than the NARROW
every bin's table holds (sqs_core.onehot._nearby_table).

A bin of width w has its weights evaluated on w columns each (sqs_core._nearby), so a bin needing n components
costs about w − n wasted columns per weight; a width of its own for every n would cost a block per width and
chunk instead. :func:`wide_widths` chooses at most :data:`WIDE_CLASSES` widths for the needs present in one
table, so that the columns summed over its wide bins are fewest: an exact dynamic programme over the (at most
NEARBY − NARROW) distinct needs, each bin then taking the narrowest chosen width that holds its need.

On the 4096² layer's step-300 state (K = 64, session 44) every wide bin needed 17 components: 151k weights
had been evaluated at width 32 (a third of all nearby columns); at 17 the nearby evaluation took 189 against
232 ms a step (AMD EPYC, 2 threads), at a fixed 20 it took 207.
"""

from __future__ import annotations

import torch

__all__ = ["WIDE_CLASSES", "fewest_columns", "wide_widths"]

WIDE_CLASSES = 4  # widths above NARROW one table may use: each present class is a block per chunk


def fewest_columns(counts: dict[int, int], most: int) -> list[int]:
    """At most ``most`` widths, ascending, the largest the largest need, minimising Σ_n counts[n] · (the
    narrowest chosen width ≥ n) over the needs n with a count (``counts``: need → bins; ``most`` ≥ 1). Exact:
    best[j][i] = the least sum over the first i needs with j widths, the last of them the i-th need; each width
    more lowers the sum while some need has none of its own, so min(``most``, needs) widths are chosen."""
    if most < 1:
        raise ValueError(f"most must be at least 1, got {most}")
    needs = sorted(n for n, c in counts.items() if c > 0)
    prefix = [0]
    for n in needs:
        prefix.append(prefix[-1] + counts[n])
    best = {(1, i): (needs[i - 1] * prefix[i], 0) for i in range(1, len(needs) + 1)}  # (sum, previous end)
    for j in range(2, min(most, len(needs)) + 1):
        for i in range(j, len(needs) + 1):
            options = ((best[j - 1, p][0] + needs[i - 1] * (prefix[i] - prefix[p]), p) for p in range(j - 1, i))
            best[j, i] = min(options)
    last = len(needs)
    j, chosen = min(most, last), []
    while j >= 1:
        chosen.append(needs[last - 1])
        last, j = best[j, last][1], j - 1
    return chosen[::-1]


def wide_widths(need: torch.Tensor, narrow: int, widest: int) -> torch.Tensor:
    """Per wide bin the width it is evaluated at (uint8): its ``need`` (the count of components whose bound
    exceeds the lumping threshold, > ``narrow``; ``widest`` + 1 where more than ``widest`` do) rounded up to
    the widths :func:`fewest_columns` chooses among the needs up to ``widest``; 0 (all K) above ``widest``."""
    histogram = torch.bincount(need, minlength=widest + 2).tolist()
    counts = {n: c for n, c in enumerate(histogram) if narrow < n <= widest and c}
    lookup = torch.zeros(widest + 2, dtype=torch.uint8, device=need.device)
    start = narrow + 1
    for width in fewest_columns(counts, WIDE_CLASSES):
        lookup[start : width + 1] = width
        start = width + 1
    return lookup.index_select(0, need.clamp(max=widest + 1))
