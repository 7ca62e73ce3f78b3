"""The index and class plumbing of the one-hot certificate (sqs_core.onehot): the uncovered weights' indices, their
cutting into blocks by class, the one-hot bit of the classes and the blocked bin bounds."""

from functools import partial
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from sqs_core import _bounds, _indices, _one_hot, onehot
from sqs_core.onehot import ALL_LUMPED, NEARBY_WIDTHS, flat_indices
from sqs_core.posterior import LOG_STD_MIN


@given(
    bits=st.lists(st.booleans(), max_size=200),
    chunk=st.integers(1, 70),
    dtype=st.sampled_from([torch.int32, torch.int64]),
)
def test_flat_indices_are_nonzero_across_chunks(bits, chunk, dtype):
    """flat_indices finds mask.nonzero() chunk by chunk (here chunks of 1–70 entries, so that a mask spans
    several, ends inside one, or is empty) and returns them as the dtype asked for."""
    mask = torch.tensor(bits, dtype=torch.bool)
    with mock.patch.object(_indices, "INDEX_CHUNK", chunk):
        got = flat_indices(mask, dtype)
    assert got.dtype == dtype
    assert torch.equal(got.long(), mask.nonzero().squeeze(1))


@given(
    values=st.lists(st.integers(0, 3), max_size=200),
    chunk=st.integers(1, 70),
    target=st.integers(0, 3),
)
def test_flat_indices_with_a_test_match_the_full_mask(values, chunk, target):
    """flat_indices(values, test=...) applies the test part by part and finds what the full mask's nonzero finds."""
    tensor = torch.tensor(values, dtype=torch.uint8)
    with mock.patch.object(_indices, "INDEX_CHUNK", chunk):
        got = flat_indices(tensor, torch.int32, test=partial(torch.ne, other=target))
    assert torch.equal(got.long(), (tensor != target).nonzero().squeeze(1))


_CLASSES = [onehot.CERTIFIED, 0, ALL_LUMPED, onehot.LUMPED_SETTLED, *NEARBY_WIDTHS]


@pytest.mark.parametrize("last", [onehot.CERTIFIED, onehot.LUMPED_SETTLED, 7])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32])
def test_the_uncovered_test_is_non_zero_exactly_below_the_last_class(last, dtype):
    """onehot._below, the test uncovered_blocks hands flat_indices (byte arithmetic for uint8 classes and the two
    one-hot classes, a comparison otherwise), is non-zero exactly where a class is below ``last``, for every byte."""
    classes = torch.arange(256, dtype=dtype)
    assert torch.equal(onehot._below(classes, last) != 0, classes < last)


_LUMPABLE = [ALL_LUMPED, onehot.LUMPED_SETTLED, *NEARBY_WIDTHS]  # BinTable.lumpable's order


def test_the_one_hot_bit_marks_exactly_the_certified_and_settled_classes():
    """The eager step's uint8 arithmetic on classes (sqs_core._one_hot.ONE_HOT_BIT): ``classes >> 7`` is 1 exactly
    at CERTIFIED and LUMPED_SETTLED, and the settled mask OneHotLevels.entries forms is 1 exactly at LUMPED_SETTLED,
    for every class classify can give."""
    classes = torch.tensor(_CLASSES, dtype=torch.uint8)
    one_hot = (classes >> _one_hot.ONE_HOT_BIT).tolist()
    assert one_hot == [int(c in (onehot.CERTIFIED, onehot.LUMPED_SETTLED)) for c in _CLASSES]
    levels = _one_hot.OneHotLevels.build(torch.zeros(2, 8), torch.zeros(2, 8), second=False)
    zeros = torch.zeros(len(_CLASSES), dtype=torch.uint8)
    entry, settled = levels.entries(zeros, zeros, classes)
    assert settled.tolist() == [int(c == onehot.LUMPED_SETTLED) for c in _CLASSES]
    assert entry.tolist() == [16 * int(c == onehot.LUMPED_SETTLED) for c in _CLASSES]  # + W·K where settled


@given(
    classes=st.lists(st.sampled_from(_CLASSES), max_size=300),
    block=st.integers(1, 200),
    k=st.integers(2, 64),
    lumpable=st.lists(st.sampled_from(_LUMPABLE), unique=True).map(lambda ws: sorted(ws, key=_LUMPABLE.index)),
    settled_inline=st.booleans(),
)
def test_uncovered_blocks_cut_every_uncovered_weight_into_its_class(classes, block, k, lumpable, settled_inline):
    """uncovered_blocks yields each weight that is not CERTIFIED (nor, with ``settled_inline``, LUMPED_SETTLED)
    exactly once, in blocks of one class: the table's lumpable classes in its order, then 0, each class's indices
    ascending, LUMPED_SETTLED ones as ALL_LUMPED blocks, no block wider than the block budget allows; a class
    outside them is refused rather than dropped."""
    lumpable = tuple(lumpable)
    table = mock.Mock(lumpable=lumpable, any_lumpable=bool(lumpable))
    values = torch.tensor(classes, dtype=torch.uint8)
    last = onehot.LUMPED_SETTLED if settled_inline else onehot.CERTIFIED
    order = [*(w for w in lumpable if w < last), 0]
    blocks_of = partial(onehot.uncovered_blocks, values, table, k, block, torch.int32, settled_inline=settled_inline)
    if lumpable and not {c for c in classes if c < last} <= set(order):
        with pytest.raises(RuntimeError, match="outside"):
            list(blocks_of())
        return
    blocks = list(blocks_of())
    got = torch.cat([u for u, _ in blocks]).long() if blocks else torch.zeros(0, dtype=torch.long)
    width_of = [w for u, w in blocks for _ in range(u.numel())]
    if lumpable:  # grouped by class, in the table's order, ascending within a class
        want = [i for w in order for i, c in enumerate(classes) if c == w]
        assert got.tolist() == want
        assert width_of == [ALL_LUMPED if classes[i] == onehot.LUMPED_SETTLED else classes[i] for i in want]
    else:  # one group, whatever the classes
        assert got.tolist() == [i for i, c in enumerate(classes) if c < last]
        assert set(width_of) <= {0}
    for u, w in blocks:
        assert 0 < u.numel() <= max(1, block // (onehot.columns_of(w) or k))


@given(
    bins=st.integers(1, 700),
    windows=st.integers(1, 3),
    k=st.integers(2, 20),
    pad=st.integers(0, 3),
    block=st.integers(1, 300),
    seed=st.integers(0, 10**6),
)
def test_the_blocked_bin_bounds_are_the_whole_tables_bits(bins, windows, k, pad, block, seed):
    """The eager bin table's bounds, taken BOUND_BLOCK bins at a time, are those of the whole table bit for bit,
    for any block size against any number of bins (a last partial block, one block, one bin per block), with
    −inf padding and σ down to the posterior's floor (bounds kept at −FLT_MAX)."""
    gen = torch.Generator().manual_seed(seed)
    left = torch.sort(torch.randn(bins, generator=gen)).values
    right = left + torch.rand(bins, generator=gen) * 0.1
    row = torch.randint(windows, (bins,), generator=gen)
    means = torch.randn(windows, k, generator=gen)
    log_stds = (torch.randn(windows, k, generator=gen) * 3 - torch.randint(2, (windows, k), generator=gen) * 40).clamp(
        min=LOG_STD_MIN
    )  # the posterior's floor: ½/σ² stays finite
    log_mixing = F.log_softmax(torch.randn(windows, k, generator=gen), -1)
    args = (left, right, row, means, log_stds, log_mixing, pad)
    with mock.patch.object(_bounds, "BOUND_BLOCK", block):
        blocked = _bounds._blocked_bin_bounds(*args)
    assert torch.equal(blocked, _bounds._bin_bounds(*args))
