"""The verdict record returned by every Appendix A / Appendix B check."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from . import _validate as check

__all__ = [
    "KINDS",
    "Kind",
    "Verdict",
    "equality",
    "format_markdown",
    "format_table",
    "markdown_cell",
    "ratio_at_most_one",
    "upper_bound",
]

Kind = Literal["bound", "identity", "approximation-neither", "condition"]
KINDS: tuple[str, ...] = ("bound", "identity", "approximation-neither", "condition")


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """Outcome of checking one step of the paper against an accurate reference.

    ``kind`` is what the step *is*: a valid ``bound``, an ``identity``, an ``approximation-neither``
    (neither an upper nor a lower bound), or a ``condition`` (a hypothesis whose consistency is
    checked).  ``holds`` says whether the paper's claim, as written, survived the check.
    """

    name: str
    location: str
    kind: Kind
    claim: str
    holds: bool
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not self.name:
            raise ValueError("name must be non-empty")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "location": self.location,
            "kind": self.kind,
            "claim": self.claim,
            "holds": self.holds,
            "details": dict(self.details),
        }


def upper_bound(
    *,
    name: str,
    location: str,
    claim: str,
    value: float,
    bound: float,
    value_key: str,
    bound_key: str = "bound",
    tol: float = 0.0,
) -> Verdict:
    """A claimed upper bound ``value <= bound`` (both computed): holds iff ``value <= bound + tol``."""
    return Verdict(
        name=name,
        location=location,
        kind="bound",
        claim=claim,
        holds=value <= bound + tol,
        details={value_key: value, bound_key: bound, "slack": bound - value},
    )


def ratio_at_most_one(
    *, name: str, location: str, claim: str, ratio: float, key: str, kind: Kind = "bound", tol: float = 0.0
) -> Verdict:
    """A bound checked as its worst ratio left side / right side over a grid: holds iff ``ratio <= 1 + tol``."""
    return Verdict(name=name, location=location, kind=kind, claim=claim, holds=ratio <= 1 + tol, details={key: ratio})


def equality(
    *,
    name: str,
    location: str,
    claim: str,
    claimed: float,
    reference: float,
    keys: tuple[str, str],
    rel_tol: float = 1e-9,
    extra: Mapping[str, Any] | None = None,
) -> Verdict:
    """A claimed identity ``claimed = reference`` (the reference computed independently, e.g. by quadrature):
    holds iff they agree to ``rel_tol``; details ``keys[0]: claimed``, ``keys[1]: reference``, then ``extra``."""
    return Verdict(
        name=name,
        location=location,
        kind="identity",
        claim=claim,
        holds=math.isclose(claimed, reference, rel_tol=rel_tol),
        details={keys[0]: claimed, keys[1]: reference, **(extra or {})},
    )


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _first_details(v: Verdict, detail_keys: int) -> str:
    return ", ".join(f"{k}={_short(x)}" for k, x in list(v.details.items())[:detail_keys])


def markdown_cell(text: str) -> str:
    """``text`` for a GitHub markdown table cell (``|`` escaped)."""
    return text.replace("|", "\\|")


def format_table(verdicts: Sequence[Verdict], *, detail_keys: int = 3) -> str:
    """A plain-text table: name | kind | holds | location | first ``detail_keys >= 0`` details."""
    detail_keys = check.count("detail_keys", detail_keys)
    rows = [("check", "kind", "claim holds", "location", "details")]
    for v in verdicts:
        rows.append((v.name, v.kind, "yes" if v.holds else "NO", v.location, _first_details(v, detail_keys)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
        if i == 0:
            lines.append("-" * (sum(widths) + 8 + len(r[4])))
    return "\n".join(lines)


def format_markdown(verdicts: Sequence[Verdict], *, detail_keys: int = 3) -> str:
    """The table of :func:`format_table` as GitHub markdown (``|`` in text escaped)."""
    detail_keys = check.count("detail_keys", detail_keys)
    lines = ["| check | kind | claim holds | location | details |", "| --- | --- | --- | --- | --- |"]
    for v in verdicts:
        row = (v.name, v.kind, "yes" if v.holds else "**NO**", v.location, _first_details(v, detail_keys))
        lines.append("| " + " | ".join(markdown_cell(c) for c in row) + " |")
    return "\n".join(lines)
