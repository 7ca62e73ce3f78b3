"""Command line: ``python -m sqs_theory {errata,checks,convergence,docs}``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from . import _validate as check
from ._io import check_output_dir, check_output_file, write_text_atomic
from .checks import all_verdicts
from .convergence import TIERS, write_study
from .errata import build_errata, write_errata
from .verdict import format_table

DEFAULT_ERRATA = Path("docs/results/theory/errata.json")
DEFAULT_CONVERGENCE = Path("build/theory")  # the committed full tier lives in docs/results/theory
COMMITTED_CONVERGENCE = Path("docs/results/theory/convergence.json")
DEFAULT_DOC = Path("docs/theory.md")


def _read_text(path: Path, flag: str) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read {flag} {path}: {exc.strerror or exc}") from None


def _errata(args: argparse.Namespace) -> int:
    path = write_errata(check_output_file(args.out, name="--out"))
    for e in build_errata() if args.verbose else ():
        print(f"{e.id:28s} {e.severity:12s} {e.location}")
    print(f"wrote {path}")
    return 0


def _checks(args: argparse.Namespace) -> int:
    n_random, seed = check.count("--n-random", args.n_random, low=1), check.seed("--seed", args.seed)
    details = check.count("--details", args.details)
    json_path = None if args.json is None else check_output_file(args.json, name="--json")
    verdicts = all_verdicts(n_random=n_random, seed=seed)
    print(format_table(verdicts, detail_keys=details))
    if json_path is not None:
        write_text_atomic(json_path, json.dumps([v.to_dict() for v in verdicts], indent=2, default=float) + "\n")
        print(f"wrote {json_path}")
    return 0


def _convergence(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    threads = check.count("--threads", args.threads, low=1)
    out = check_output_dir(args.out, name="--out", files=("convergence.json", "convergence.png"))
    json_path, png_path = write_study(args.tier, out, threads=threads)
    result = json.loads(json_path.read_text())
    for row in result["summary"]:
        print(f"n={row['n']:6d}  median d2={row['median']:.3g}  n*median={row['n_times_median']:.3g}  "
              f"support exact {row['support_exact']:.2f}")  # fmt: skip
    print(f"slope {result['slope']} CI {result['slope_ci']} (theory {result['theory']['theory_slope']} up to logs)")
    print(f"wall time {result['wall_time_s']:.0f} s; wrote {json_path} and {png_path}")
    return 0


def _docs(args: argparse.Namespace) -> int:
    from .docs import generated_blocks, render

    text = _read_text(args.path, "--path")
    if not args.check:
        check_output_file(args.path, name="--path")
    result = None
    if args.convergence.exists():
        try:
            result = json.loads(_read_text(args.convergence, "--convergence"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"--convergence {args.convergence} is not valid JSON: {exc}") from None
    new = render(text, generated_blocks(result))
    if args.check:
        if new != text:
            print(f"{args.path} is out of date: run `python -m sqs_theory docs` (generated blocks differ)")
            return 1
        print(f"{args.path} is up to date")
        return 0
    write_text_atomic(args.path, new)
    print(f"wrote the generated blocks of {args.path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sqs-theory", description="Numerical checks of the SQS paper's theory.")
    sub = parser.add_subparsers(dest="command", required=True)

    errata = sub.add_parser("errata", help="compute every erratum's witness and write the errata JSON")
    errata.add_argument("--out", type=Path, default=DEFAULT_ERRATA, help=f"output file (default {DEFAULT_ERRATA})")
    errata.add_argument("-v", "--verbose", action="store_true", help="list the errata found")
    errata.set_defaults(func=_errata)

    checks = sub.add_parser("checks", help="run every Appendix A / B / H(T,s,K) check and print a verdict table")
    checks.add_argument("--n-random", type=int, default=20, help="random instances per bound (default 20)")
    checks.add_argument("--seed", type=int, default=0)
    checks.add_argument("--details", type=int, default=3, help="detail fields shown per row (default 3)")
    checks.add_argument("--json", type=Path, default=None, help="also write the verdicts as JSON here")
    checks.set_defaults(func=_checks)

    conv = sub.add_parser("convergence", help="Hellinger convergence study on synthetic sparse ReLU regression")
    conv.add_argument("--tier", choices=sorted(TIERS), default="quick", help="study size (default quick)")
    conv.add_argument(
        "--out", type=Path, default=DEFAULT_CONVERGENCE, help=f"output dir (default {DEFAULT_CONVERGENCE})"
    )
    conv.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    conv.add_argument("-v", "--verbose", action="store_true", help="log every fit")
    conv.set_defaults(func=_convergence)

    docs = sub.add_parser("docs", help="regenerate the tables of docs/theory.md (verdicts, errata, convergence)")
    docs.add_argument("--path", type=Path, default=DEFAULT_DOC, help=f"the document (default {DEFAULT_DOC})")
    docs.add_argument("--convergence", type=Path, default=COMMITTED_CONVERGENCE,
                      help=f"the convergence study's JSON (default {COMMITTED_CONVERGENCE})")  # fmt: skip
    docs.add_argument("--check", action="store_true", help="exit 1 if the document differs instead of writing it")
    docs.set_defaults(func=_docs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; a user error (bad value, unreadable or unwritable path) prints ``error: ...`` and returns 1."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, OSError) as exc:  # json.JSONDecodeError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
