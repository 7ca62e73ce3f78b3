"""docs/theory.md: its generated tables equal what the code computes now, and the verdict helpers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqs_theory.__main__ import main
from sqs_theory.docs import BLOCKS, errata_block, generated_blocks, render
from sqs_theory.errata import build_errata
from sqs_theory.verdict import Verdict, equality, format_markdown, ratio_at_most_one, upper_bound

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "theory.md"
CONVERGENCE = ROOT / "docs" / "results" / "theory" / "convergence.json"

floats = st.floats(-1e6, 1e6, allow_nan=False)


@pytest.fixture(scope="module")
def fresh() -> dict[str, str]:
    """Every block, the convergence one included: a missing JSON had left that block unchecked (None)."""
    if not CONVERGENCE.exists():
        pytest.fail(f"{CONVERGENCE} is missing: the convergence block of docs/theory.md cannot be checked")
    return generated_blocks(json.loads(CONVERGENCE.read_text()))


def test_committed_document_equals_the_generated_one(fresh):
    """The verdict, errata and convergence tables of docs/theory.md are the code's output, not a snapshot."""
    text = DOC.read_text()
    assert render(text, fresh) == text, "run `python -m sqs_theory docs` and commit docs/theory.md"
    for name in BLOCKS:
        assert f"<!-- generated:{name} -->" in text


def test_the_check_fails_on_a_drifted_document(tmp_path, fresh, capsys):
    doc = tmp_path / "theory.md"
    doc.write_text(DOC.read_text().replace("| lemma-mix | bound | yes |", "| lemma-mix | bound | **NO** |"))
    args = ["docs", "--path", str(doc), "--convergence", str(CONVERGENCE)]
    assert main([*args, "--check"]) == 1 and "out of date" in capsys.readouterr().out
    assert main(args) == 0 and main([*args, "--check"]) == 0
    assert doc.read_text() == DOC.read_text()


@given(st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=40), st.text(max_size=40))
def test_render_replaces_only_the_marked_block(outside, body):
    text = f"{outside}\n<!-- generated:errata -->\nold\n<!-- /generated:errata -->\n{outside}"
    out = render(text, {"errata": body})
    assert out == f"{outside}\n<!-- generated:errata -->\n{body}<!-- /generated:errata -->\n{outside}"


def test_render_needs_the_markers():
    with pytest.raises(ValueError, match="markers"):
        render("no markers here", {"verdicts": "x"})


def test_errata_block_lists_every_erratum():
    errata = build_errata()
    block = errata_block(errata)
    assert all(e.summary and f"| {e.id} | {e.severity} |" in block for e in errata)


def test_markdown_escapes_pipes():
    v = Verdict(name="a|b", location="l", kind="bound", claim="c", holds=False, details={"x": 1.23456})
    table = format_markdown([v])
    assert "a\\|b" in table and "**NO**" in table and "x=1.235" in table


@given(floats, floats, st.floats(0, 1))
def test_upper_bound_holds_iff_value_below_bound(value, bound, tol):
    v = upper_bound(name="u", location="l", claim="c", value=value, bound=bound, value_key="lhs", tol=tol)
    assert v.holds == (value <= bound + tol) and v.kind == "bound"
    assert v.details == {"lhs": value, "bound": bound, "slack": bound - value}


@given(floats, floats)
def test_equality_holds_iff_close(claimed, reference):
    v = equality(name="e", location="l", claim="c", claimed=claimed, reference=reference, keys=("a", "b"))
    assert v.holds == (abs(claimed - reference) <= 1e-9 * max(abs(claimed), abs(reference)))
    assert list(v.details) == ["a", "b"] and v.kind == "identity"


@given(st.floats(0, 10))
def test_ratio_holds_iff_at_most_one(ratio):
    v = ratio_at_most_one(name="r", location="l", claim="c", ratio=ratio, key="max_ratio", kind="condition")
    assert v.holds == (ratio <= 1) and v.details == {"max_ratio": ratio} and v.kind == "condition"
