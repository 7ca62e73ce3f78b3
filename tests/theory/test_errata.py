"""The errata table: shape, computed witnesses, and the committed JSON being up to date."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from sqs_theory.errata import SEVERITIES, Erratum, build_errata, write_errata

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "results" / "theory" / "errata.json"


@pytest.fixture(scope="module")
def errata() -> dict[str, Erratum]:
    return {e.id: e for e in build_errata()}


def test_every_entry_is_complete(errata):
    assert len(errata) >= 15
    for e in errata.values():
        assert e.location and e.statement and e.correction and e.witness
        assert e.severity in SEVERITIES
    json.dumps([e.to_dict() for e in errata.values()], allow_nan=False)


def test_witnesses_show_the_mistakes(errata):
    a1 = errata["A1-dominant-component"].witness
    under, over = (a1[k] for k in a1 if k.startswith(("under", "over")))
    assert under["kl_dominant"] < under["kl_true"] and over["kl_dominant"] > over["kl_true"]
    assert errata["B1-abs-mgf"].witness["paper"] > errata["B1-abs-mgf"].witness["quadrature"]
    assert errata["B5-log-slip"].witness["paper_lhs"] > errata["B5-log-slip"].witness["claimed_value"]
    assert errata["B6-vacuous-tau-condition"].witness["log_condition_rhs"] > 0
    assert errata["B7-sigma_n-square"].witness["ratio"] > 1
    b10 = errata["B10-delta-range"].witness
    assert all(b < a for a, b in itertools.pairwise(b10["M_max_delta=0.25"]))  # one constant: cannot diverge
    for d in ("0.25", "0.5"):  # lambda's constant apart from s_n's delta = 1.5: diverges
        assert all(b > a for a, b in itertools.pairwise(b10[f"M_max_delta={d}_s_n_delta=1.5"]))
    b11 = errata["B11-any-M"].witness
    assert b11["-log_lambda_theorem"] < b11["-log_required_bound"]
    h1 = errata["H1-sparsity-definition"].witness
    assert h1["in_H_with_<=s"] and h1["|I|_<s"] < h1["|I|_<=s"]


def test_erratum_needs_a_witness():
    with pytest.raises(ValueError, match="witness"):
        Erratum(id="x", location="here", statement="a", correction="b", witness={})
    with pytest.raises(ValueError, match="severity"):
        Erratum(id="x", location="here", statement="a", correction="b", witness={"v": 1}, severity="bad")


def test_write_round_trip(tmp_path, errata):
    path = write_errata(tmp_path / "sub" / "errata.json")
    loaded = json.loads(path.read_text())
    assert [e["id"] for e in loaded] == list(errata)
    assert all({"location", "statement", "correction", "witness"} <= set(e) for e in loaded)


def test_committed_errata_are_up_to_date(errata):
    if not COMMITTED.exists():
        pytest.skip("docs/results/theory/errata.json not generated yet")
    committed = json.loads(COMMITTED.read_text())
    fresh = [e.to_dict() for e in errata.values()]
    assert [e["id"] for e in committed] == [e["id"] for e in fresh]
    for old, new in zip(committed, fresh, strict=True):
        assert old["statement"] == new["statement"] and old["correction"] == new["correction"]
        assert _close(old["witness"], new["witness"]), old["id"]


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == pytest.approx(b, rel=1e-6, abs=1e-12)
    return a == b
