"""Command line: ``python -m sqs_bench run|report|list``.

python -m sqs_bench run --suite default --tier cpu --data-dir ../shared/data --out runs/bench
python -m sqs_bench report --results runs/bench
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from sqs_bench.config import TIERS, list_recipes
from sqs_bench.data import DataNotFoundError
from sqs_bench.report import build_report
from sqs_bench.runner import METHODS, run_suite, suite_configs

__all__ = ["main"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _folder(text: str) -> Path:
    """A folder argument; an empty one is refused (``Path("")`` is the cwd, where results were then written)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a folder path, got {text!r}")
    return Path(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sqs_bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO)")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", parents=[common], help="run a suite of recipes and write result JSON files")
    run.add_argument("--suite", default="default", help="default | cifar10 (recipes/suites.toml)")
    run.add_argument("--tier", default="cpu", choices=TIERS)
    run.add_argument("--data-dir", default=None, help="data folder (default: $SQS_DATA_DIR)")
    run.add_argument(
        "--out",
        default="runs/bench",
        type=_folder,
        help="folder for result JSON files, <run_id>.json (created and write-tested before any compute); "
        "use one folder per tier, since the run id does not hold the tier",
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="replace results of the same runs already in --out (default: refuse before computing)",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="keep the results already in --out of runs configured as now (same tier and configuration) and "
        "run only the others: continue an interrupted suite",
    )
    run.add_argument("--recipe", action="append", help="only these recipes of the suite (repeatable)")
    run.add_argument("--method", action="append", choices=METHODS, help="only these methods (repeatable)")
    run.add_argument("--label", action="append", help="only the runs with these labels (repeatable)")
    run.add_argument("--model", action="append", help="only the runs on these models (repeatable)")
    run.add_argument(
        "--threads", type=_positive_int, default=None, help="torch intra-op threads >= 1 (default: torch's)"
    )
    report = commands.add_parser("report", parents=[common], help="markdown tables and PNG plots from JSON results")
    report.add_argument(
        "--results", required=True, type=_folder, help="folder of result JSON files (read recursively), all of one tier"
    )
    report.add_argument("--out", default=None, type=_folder, help="output folder (default: --results)")
    report.add_argument("--prefix", default="results", help="name of the summary JSON files (<prefix>.json)")
    listing = commands.add_parser("list", parents=[common], help="list recipes and the runs of a suite")
    listing.add_argument("--suite", default="default")
    listing.add_argument("--tier", default="cpu", choices=TIERS)
    return parser


def _print_result(result: dict) -> None:
    m = result["metrics"]
    lo, hi = m["drop_ci"]
    file_rate = "–" if m["compression_rate_file"] is None else f"{m['compression_rate_file']:.1f}x"
    print(
        f"{result['run_id']}: acc {m['acc']:.2f}% (fp32 {m['fp32_acc']:.2f}%), drop {m['drop']:.2f} "
        f"[{lo:.2f}, {hi:.2f}], non-zero {100 * m['nonzero']:.1f}%, rate {m['compression_rate_paper']:.1f}x "
        f"(paper eq.) / {file_rate} (file), {result['wall_time_s']:.1f}s",
        flush=True,
    )


_FILTERS = ("recipe", "method", "label", "model")


def _check_filters(args: argparse.Namespace) -> None:
    """Each --recipe/--label/--model value names a run of the suite for the tier, and some run matches all."""
    configs = suite_configs(args.suite, args.tier)
    for key in ("recipe", "label", "model"):
        known = sorted({str(c[key]) for c in configs})
        unknown = [v for v in getattr(args, key) or () if v not in known]
        if unknown:
            raise ValueError(
                f"unknown --{key} {', '.join(map(repr, unknown))} for suite {args.suite!r}, tier {args.tier!r}; "
                f"known: {', '.join(known)}"
            )
    if not any(_selected(args, c) for c in configs):
        chosen = " ".join(f"--{k} {v}" for k in _FILTERS for v in getattr(args, k) or ())
        raise ValueError(f"no run of suite {args.suite!r} matches {chosen}")


def _selected(args: argparse.Namespace, config: dict) -> bool:
    return all(getattr(args, key) is None or config[key] in getattr(args, key) for key in _FILTERS)


def _run(args: argparse.Namespace) -> int:
    _check_filters(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)  # on a shared machine 1 thread per job avoids OpenMP spin-waits
    results = run_suite(
        args.suite,
        args.tier,
        args.data_dir,
        args.out,
        on_result=_print_result,
        only=lambda config: _selected(args, config),
        overwrite=args.overwrite,
        resume=args.resume,
    )
    resumed = sum(bool(result.get("resumed")) for result in results)
    kept = f" ({resumed} kept from an earlier run)" if resumed else ""
    print(f"{len(results) - resumed} result(s) written to {args.out}{kept}")
    return 0


def _list(args: argparse.Namespace) -> int:
    print("recipes:", ", ".join(list_recipes()))
    for config in suite_configs(args.suite, args.tier):
        print(f"  {config['run_id']}  (epochs {config.get('epochs')}, method {config['method']})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m sqs_bench`` and the ``sqs-bench`` script; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "report":
            print(f"wrote {build_report(args.results, args.out, prefix=args.prefix)}")
            return 0
        return _list(args)
    except (DataNotFoundError, ImportError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
