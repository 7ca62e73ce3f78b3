"""Command line: ``python -m sqs_core inspect FILE [--json]`` prints an artifact's compression report."""

from __future__ import annotations

import argparse
import sys

from .report import compression_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sqs_core", description="Tools for SQS compressed artifacts.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect = commands.add_parser(
        "inspect", help="validate an artifact and print its compression report", description=None
    )
    inspect.add_argument("file", help="an artifact written by sqs_core.save")
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        report = compression_report(args.file)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(report.to_json() if args.json else report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
