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
from .convergence import MAX_THREADS, TIERS, write_study
from .errata import build_errata, write_errata
from .tiers import check_threads
from .verdict import format_table

DEFAULT_ERRATA = Path("docs/results/theory/errata.json")
DEFAULT_CONVERGENCE = Path("build/theory")  # the committed full tier lives in docs/results/theory
COMMITTED_CONVERGENCE = Path("docs/results/theory/convergence.json")
DEFAULT_DOC = Path("docs/theory.md")


_REPRO = (
    "The results are bit-reproducible only on the same CPU model with the same --threads (and OMP_/MKL_ "
    "settings): other thread counts and instruction sets round reductions differently. The JSON records the CPU "
    "model, torch's CPU capability, the threads and those settings; the committed full-tier JSON "
    f"({COMMITTED_CONVERGENCE}) was produced on another machine."
)


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
    threads = check_threads("--threads", args.threads)
    out = check_output_dir(args.out, name="--out", files=("convergence.json", "convergence.png"))
    json_path, png_path = write_study(args.tier, out, threads=threads)
    result = json.loads(json_path.read_text())
    for row in result["summary"]:
        print(f"n={row['n']:6d}  median d2={row['median']:.3g}  n*median={row['n_times_median']:.3g}  "
              f"support exact {row['support_exact']:.2f}")  # fmt: skip
    print(f"slope {result['slope']} CI {result['slope_ci']} (theory {result['theory']['theory_slope']} up to logs)")
    print(f"bit-reproducible only on this CPU ({result['machine']['cpu_model']}) with --threads {threads}")
    print(f"wall time {result['wall_time_s']:.0f} s; wrote {json_path} and {png_path}")
    return 0


def _load_convergence(args: argparse.Namespace, text: str) -> dict | None:
    """The convergence JSON the document's block is generated from: ``--convergence`` if given (it must exist),
    else the committed one; None where the default is missing, except under ``--check`` of a document with a
    convergence block (a typo'd or missing file had checked nothing and said "up to date")."""
    from .docs import check_convergence_result

    if args.convergence is not None:
        path = Path(args.convergence)
    elif COMMITTED_CONVERGENCE.exists():
        path = COMMITTED_CONVERGENCE
    elif args.check and "<!-- generated:convergence -->" in text:
        raise ValueError(f"--convergence: the default {COMMITTED_CONVERGENCE} does not exist, so the convergence "
                         f"block of {args.path} cannot be checked (give --convergence PATH)")  # fmt: skip
    else:
        return None
    raw = _read_text(path, "--convergence")
    try:
        return dict(check_convergence_result(json.loads(raw)))
    except ValueError as exc:  # json.JSONDecodeError included
        raise ValueError(f"--convergence {path} is not a convergence study's JSON: {exc}") from None


def _docs(args: argparse.Namespace) -> int:
    from .docs import generated_blocks, render

    path = Path(args.path)
    text = _read_text(path, "--path")
    if not args.check:
        check_output_file(args.path, name="--path")
    result = _load_convergence(args, text)
    new = render(text, generated_blocks(result))
    if args.check:
        if new != text:
            print(f"{path} is out of date: run `python -m sqs_theory docs` (generated blocks differ)")
            return 1
        print(f"{path} is up to date")
        return 0
    write_text_atomic(args.path, new)
    print(f"wrote the generated blocks of {path}" + ("" if result else " (no convergence JSON: that block kept)"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sqs-theory", description="Numerical checks of the SQS paper's theory.")
    sub = parser.add_subparsers(dest="command", required=True)

    errata = sub.add_parser("errata", help="compute every erratum's witness and write the errata JSON")
    errata.add_argument("--out", default=str(DEFAULT_ERRATA), help=f"output file (default {DEFAULT_ERRATA})")
    errata.add_argument("-v", "--verbose", action="store_true", help="list the errata found")
    errata.set_defaults(func=_errata)

    checks = sub.add_parser("checks", help="run every Appendix A / B / H(T,s,K) check and print a verdict table")
    checks.add_argument("--n-random", type=int, default=20, help="random instances per bound (default 20)")
    checks.add_argument("--seed", type=int, default=0)
    checks.add_argument("--details", type=int, default=3, help="detail fields shown per row (default 3)")
    checks.add_argument("--json", default=None, help="also write the verdicts as JSON here")
    checks.set_defaults(func=_checks)

    conv = sub.add_parser(
        "convergence", help="Hellinger convergence study on synthetic sparse ReLU regression", description=_REPRO
    )
    conv.add_argument("--tier", choices=sorted(TIERS), default="quick", help="study size (default quick)")
    conv.add_argument("--out", default=str(DEFAULT_CONVERGENCE), help=f"output dir (default {DEFAULT_CONVERGENCE})")
    conv.add_argument(
        "--threads", type=int, default=1, help=f"torch threads, 1 to {MAX_THREADS} (default 1; see above)"
    )
    conv.add_argument("-v", "--verbose", action="store_true", help="log every fit")
    conv.set_defaults(func=_convergence)

    docs = sub.add_parser("docs", help="regenerate the tables of docs/theory.md (verdicts, errata, convergence)")
    docs.add_argument("--path", default=str(DEFAULT_DOC), help=f"the document (default {DEFAULT_DOC})")
    docs.add_argument("--convergence", default=None,
                      help=f"the convergence study's JSON, which must exist (default {COMMITTED_CONVERGENCE}; "
                           "if that is missing, the convergence block is kept, and --check fails)")  # fmt: skip
    docs.add_argument("--check", action="store_true", help="exit 1 if the document differs instead of writing it")
    docs.set_defaults(func=_docs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; a user error (bad value, unreadable or unwritable path) prints ``error: ...`` and returns 1."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, OSError, FloatingPointError) as exc:  # json.JSONDecodeError is a ValueError; sqs-core
        # raises FloatingPointError for a fit whose posterior went non-finite (the study names the fit)
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
