"""Command line: ``python -m sqs_core inspect FILE [--json]`` prints an artifact's compression report;
``python -m sqs_core upgrade SOURCE TARGET`` rewrites an artifact in the current format version."""

from __future__ import annotations

import argparse
import sys

from .artifact import upgrade
from .report import compression_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sqs_core", description="Tools for SQS compressed artifacts.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect = commands.add_parser(
        "inspect", help="validate an artifact and print its compression report", description=None
    )
    inspect.add_argument("file", help="an artifact written by sqs_core.save")
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    rewrite = commands.add_parser(
        "upgrade", help="rewrite an artifact in the current format version (same weights and draws)"
    )
    rewrite.add_argument("source", help="an artifact written by sqs_core.save (any readable version)")
    rewrite.add_argument("target", help="where to write it (may be the source)")
    args = parser.parse_args(argv)
    try:
        if args.command == "upgrade":
            upgrade(args.source, args.target)
            report = compression_report(args.target)
            print(f"wrote {args.target}: {report.file_bytes:,} B, file rate {report.file_rate:.2f}x")
            return 0
        report = compression_report(args.file)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(report.to_json() if args.json else report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
