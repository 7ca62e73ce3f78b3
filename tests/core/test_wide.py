"""The widths of wide bins (sqs_core._wide): fewest columns, against every choice of widths."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sqs_core import _wide
from sqs_core.onehot import NARROW, NEARBY

_COUNTS = st.dictionaries(st.integers(NARROW + 1, NEARBY), st.integers(0, 1000), max_size=NEARBY - NARROW)


def _columns(counts, widths):
    """Σ count · (the narrowest of ``widths`` ≥ need), or None where some need exceeds them all."""
    total = 0
    for need, count in counts.items():
        fits = [w for w in widths if w >= need]
        if count and not fits:
            return None
        total += count * min(fits, default=0)
    return total


@given(_COUNTS, st.integers(1, 4))
def test_the_chosen_widths_take_the_fewest_columns_of_any_choice(counts, most):
    needs = sorted(n for n, c in counts.items() if c)
    chosen = _wide.fewest_columns(counts, most)
    assert chosen == sorted(chosen) and len(chosen) == min(most, len(needs))
    if not needs:
        assert chosen == []
        return
    assert chosen[-1] == needs[-1] and set(chosen) <= set(needs)  # no width above a need: it would only cost
    every = [
        _columns(counts, widths)
        for size in range(1, most + 1)
        for widths in itertools.combinations(range(NARROW + 1, NEARBY + 1), size)
    ]
    assert _columns(counts, chosen) == min(c for c in every if c is not None)


def test_a_need_of_its_own_for_each_class_when_there_are_few():
    assert _wide.fewest_columns({17: 5, 30: 1}, 4) == [17, 30]
    assert _wide.fewest_columns({17: 5, 18: 5, 19: 5, 20: 5, 32: 1}, 4) == [17, 18, 20, 32]  # 19 rounds up


def test_at_least_one_width_is_asked_for():
    with pytest.raises(ValueError, match="most must be at least 1, got 0"):
        _wide.fewest_columns({20: 1}, 0)


@given(st.lists(st.integers(NARROW + 1, NEARBY + 1), min_size=1, max_size=200))
def test_each_bin_takes_the_narrowest_chosen_width_that_holds_its_need(needs):
    need = torch.tensor(needs)
    widths = _wide.wide_widths(need, NARROW, NEARBY)
    assert widths.dtype == torch.uint8 and widths.shape == need.shape
    counts = {n: needs.count(n) for n in set(needs) if n <= NEARBY}
    chosen = _wide.fewest_columns(counts, _wide.WIDE_CLASSES)
    for n, w in zip(needs, widths.tolist(), strict=True):
        assert w == (0 if n > NEARBY else min(c for c in chosen if c >= n))  # 0: more than NEARBY matter, all K
