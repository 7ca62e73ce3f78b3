"""The per-kept-weight code layouts of a compressed tensor (sqs_core._codes): plain and escaped.

Reference: the ranks themselves. Every layout must decode to exactly the ranks it encoded (and to
``table[ranks]`` on the fast value path), the encoder must never choose a layout larger than the plain
one, and a damaged record must fail with a clear error before anything is decoded.
"""

from __future__ import annotations

import copy

import pytest
import sqs_core as sqs
import torch
from hypothesis import given
from hypothesis import strategies as st
from sqs_core import artifact as artifact_module
from sqs_core._codes import (
    CODE_SECTIONS,
    ESCAPE_RECORD_BYTES,
    _escaped_layout,
    _size_without_mask,
    check_code_record,
    decode_ranks,
    decode_values,
    encode_codes,
    field_bits,
)
from torch import nn


@st.composite
def skewed_ranks(draw: st.DrawFn, extra: int = 3000, skews: tuple[int, ...] = (1, 4, 16)) -> tuple[torch.Tensor, int]:
    """(ranks, U): n codes over U entries, every entry used, a few entries far more frequent than the rest."""
    n_used = draw(st.integers(2, 300))
    n = draw(st.integers(n_used + 1, n_used + extra))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    weights = torch.rand(n_used, generator=gen) ** draw(st.sampled_from(skews))  # skew
    ranks = torch.multinomial(weights + 1e-6, n - n_used, replacement=True, generator=gen)
    ranks = torch.cat([torch.arange(n_used), ranks])[torch.randperm(n, generator=gen)]  # every entry used
    return ranks, n_used


def _record(ranks: torch.Tensor, n_used: int, fields: dict, sections: dict) -> tuple[dict, dict]:
    rec = {"kept": ranks.numel(), "codes_used": n_used, **fields}
    sizes = {s: int(sections[s].numel()) if s in sections else 0 for s in CODE_SECTIONS}
    parts = {s: sections.get(s, torch.zeros(0, dtype=torch.uint8)) for s in CODE_SECTIONS}
    return rec, {"sizes": sizes, "parts": parts}


def _round_trip(ranks: torch.Tensor, n_used: int, fields: dict, sections: dict) -> None:
    rec, blob = _record(ranks, n_used, fields, sections)
    check_code_record("t", rec, blob["sizes"])
    assert torch.equal(decode_ranks("t", rec, blob["parts"]), ranks)
    table = torch.randn(n_used, dtype=torch.float64)
    assert torch.equal(decode_values("t", rec, blob["parts"], table), table[ranks])


def _plain_bytes(n: int, n_used: int) -> int:
    bits = field_bits(n_used)
    return (n * min(bits, 8) + 7) // 8 + ((n * (bits - 8) + 7) // 8 if bits > 8 else 0)


@given(skewed_ranks())
def test_chosen_layout_round_trips_and_is_never_larger_than_plain(case):
    ranks, n_used = case
    fields, sections = encode_codes(ranks, n_used)
    _round_trip(ranks, n_used, fields, sections)
    size = sum(int(s.numel()) for s in sections.values())
    if "escaped" in fields:
        assert size + ESCAPE_RECORD_BYTES < _plain_bytes(ranks.numel(), n_used)
    else:
        assert size == _plain_bytes(ranks.numel(), n_used)


def _exhaustive_choice(ranks: torch.Tensor, n_used: int) -> tuple[dict, dict]:
    """The reference choice: every escaped layout built, the smallest kept, ties to plain, then fewer primary bits."""
    bits = field_bits(n_used)
    best_size, best = _plain_bytes(ranks.numel(), n_used), None
    counts = torch.bincount(ranks, minlength=n_used)
    by_count = torch.argsort(-counts, stable=True)
    for primary_bits in range(1, min(bits, 9)):
        if field_bits(n_used - (1 << primary_bits)) > 8:
            continue
        fields, sections = _escaped_layout(ranks, n_used, by_count[: 1 << primary_bits], primary_bits)
        size = sum(int(s.numel()) for s in sections.values()) + ESCAPE_RECORD_BYTES
        if size < best_size:
            best_size, best = size, (fields, sections)
    return best if best is not None else ({"code_bits": bits}, {})


def _seeded_ranks(seed: int) -> tuple[torch.Tensor, int]:
    """Thousands of skewed codes, where the escape masks' sizes decide between the escaped layouts."""
    gen = torch.Generator().manual_seed(seed)
    n_used = int(torch.randint(2, 300, (1,), generator=gen))
    n = n_used + int(torch.randint(1, 20_000, (1,), generator=gen))
    weights = torch.rand(n_used, generator=gen) ** float([1, 4, 16, 64][seed % 4])
    drawn = torch.multinomial(weights + 1e-6, n - n_used, replacement=True, generator=gen)
    return torch.cat([torch.arange(n_used), drawn])[torch.randperm(n, generator=gen)], n_used


@pytest.mark.parametrize("seed", [4, 9, 10, 12])
def test_the_pruned_search_finds_a_winner_that_is_not_smallest_without_its_mask(seed):
    ranks, n_used = _seeded_ranks(seed)
    fields, _ = encode_codes(ranks, n_used)
    want_fields, _ = _exhaustive_choice(ranks, n_used)
    assert fields == want_fields
    counts = torch.bincount(ranks, minlength=n_used)
    covered = torch.cumsum(counts.sort(descending=True).values, 0)
    floors = {
        b: _size_without_mask(ranks.numel(), n_used, ranks.numel() - int(covered[(1 << b) - 1]), b)
        for b in range(1, min(field_bits(n_used), 9))
        if field_bits(n_used - (1 << b)) <= 8
    }
    assert fields["code_bits"] != min(floors, key=lambda b: (floors[b], b))  # the case this test is about


@given(skewed_ranks(extra=20_000, skews=(1, 4, 16, 64)))
def test_the_pruned_search_chooses_what_building_every_layout_chooses(case):
    """encode_codes builds an escaped layout only while its size without the mask could still win. With
    thousands of codes the layout smallest without its mask is often not the smallest (the mask decides), which
    a search that stopped at the first candidate would get wrong."""
    ranks, n_used = case
    fields, sections = encode_codes(ranks, n_used)
    want_fields, want_sections = _exhaustive_choice(ranks, n_used)
    assert fields == want_fields
    for name, section in want_sections.items():
        assert torch.equal(sections[name], section)


@given(skewed_ranks(), st.integers(1, 8))
def test_every_escaped_layout_round_trips(case, primary_bits):
    ranks, n_used = case
    if (1 << primary_bits) >= n_used or field_bits(n_used - (1 << primary_bits)) > 8:
        return
    order = torch.argsort(-torch.bincount(ranks, minlength=n_used), stable=True)
    fields, sections = _escaped_layout(ranks, n_used, order[: 1 << primary_bits], primary_bits)
    assert fields["escaped"] == int((~torch.isin(ranks, order[: 1 << primary_bits])).sum())
    _round_trip(ranks, n_used, fields, sections)


def test_rare_tail_entries_take_the_escaped_layout():
    # 4 central levels used 1000 times each, 2 tail entries 5 times: 2 bits + escapes beats 3 bits.
    ranks = torch.cat([torch.arange(4).repeat(1000), torch.tensor([4] * 5 + [5] * 5)])
    ranks = ranks[torch.randperm(ranks.numel(), generator=torch.Generator().manual_seed(0))]
    fields, sections = encode_codes(ranks, 6)
    assert fields["code_bits"] == 2 and fields["escaped"] == 10
    assert sum(int(s.numel()) for s in sections.values()) < _plain_bytes(ranks.numel(), 6) * 0.7
    _round_trip(ranks, 6, fields, sections)


def test_uniform_codes_stay_plain():
    fields, _ = encode_codes(torch.arange(8).repeat(500), 8)
    assert fields == {"code_bits": 3}


def _escaped_case() -> tuple[dict, dict]:
    ranks = torch.cat([torch.arange(4).repeat(300), torch.tensor([4, 5, 6])])
    fields, sections = encode_codes(ranks, 7)
    assert "escaped" in fields
    return _record(ranks, 7, fields, sections)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"escaped": 4}, "escape mask marks 3 weights, the header says 4"),
        ({"escaped": -1}, "'escaped' must be an int"),
        ({"escaped": True}, "'escaped' must be an int"),
        ({"code_bits": 3}, "bad escaped layout"),
        ({"code_bits": 0}, "bad escaped layout"),
        ({"escape_mask": "zip"}, "field .escape_mask. must be one of"),
    ],
)
def test_damaged_escaped_record_is_rejected(change, message):
    rec, blob = _escaped_case()
    rec |= change
    with pytest.raises(ValueError, match=message):
        check_code_record("t", rec, blob["sizes"])
        decode_ranks("t", rec, blob["parts"])


def test_damaged_escaped_sections_are_rejected():
    rec, blob = _escaped_case()
    with pytest.raises(ValueError, match="section sizes"):
        check_code_record("t", rec, blob["sizes"] | {"primary": 2})
    parts = blob["parts"] | {"primary": torch.tensor([0b1111111], dtype=torch.uint8)}  # all 7 entries primary
    with pytest.raises(ValueError, match="primary set has 7 entries, code_bits 2 needs 4"):
        decode_ranks("t", rec, parts)
    parts = blob["parts"] | {"escape_codes": torch.tensor([0b11], dtype=torch.uint8)}  # rank 3 of 3 tail entries
    with pytest.raises(ValueError, match="escape code 3 out of range for 3 entries"):
        decode_values("t", rec, parts, torch.zeros(7))


def test_plain_record_with_wrong_code_bits_is_rejected():
    ranks = torch.arange(8).repeat(10)
    fields, sections = encode_codes(ranks, 8)
    rec, blob = _record(ranks, 8, fields | {"code_bits": 4}, sections)
    with pytest.raises(ValueError, match="code_bits 4 does not index 8 used entries"):
        check_code_record("t", rec, blob["sizes"])


def test_file_with_outlier_windows_uses_escapes_and_round_trips(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64))
    with torch.no_grad():  # a few outliers, so the outlier windows hold a handful of kept weights
        model[0].weight[0, :6] = torch.tensor([2.0, -2.5, 3.0, -3.5, 2.2, -2.8])
    skeleton = copy.deepcopy(model)
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, windows="outlier", gate_init="magnitude"))
    path = tmp_path / "m.sqs"
    sqs.save(model, path, nonzero=0.5)
    (record,) = artifact_module.read_artifact(path).records
    assert record["escaped"] > 0 and record["code_bits"] == 2
    expected = sqs.discrete_posteriors(model, nonzero=0.5)["0"]
    loaded = sqs.load(path, copy.deepcopy(skeleton))
    assert torch.equal(loaded[0].weight, expected.weights() + 0.0)
    g1, g2 = (torch.Generator().manual_seed(3) for _ in range(2))
    x = torch.randn(7, 64)
    average = sqs.load_bayesian_average(path, copy.deepcopy(skeleton), samples=3, generator=g1)
    assert torch.equal(average(x), sqs.BayesianAverage(model, samples=3, nonzero=0.5, generator=g2)(x))
