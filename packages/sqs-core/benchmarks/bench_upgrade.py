"""File sizes of real trained artifacts in two format versions, side by side: each file as written, and the
same model rewritten by ``sqs_core.upgrade`` in the current version (greedy weights checked identical).

Usage: python packages/sqs-core/benchmarks/bench_upgrade.py DIR [DIR ...] [--json out.json]

DIR holds ``*.sqs`` files, e.g. the artifacts of ``nox -s bench`` (runs/cifar10/artifacts). Prints per file
the bytes, the file rate of the compressed layers and the paper's formula + mask rate in both versions.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import sqs_core as sqs
import torch
from _timing import machine_info, write_json  # this folder, on sys.path when run as a script
from sqs_core._artifact_file import read_artifact
from sqs_core.report import _report  # the report of a file already read (each file is read once)


def compare(path: Path, scratch: Path) -> dict:
    new = scratch / path.name
    sqs.upgrade(path, new)
    old_art, new_art = read_artifact(path), read_artifact(new)
    for a, b in zip(old_art.weights().values(), new_art.weights().values(), strict=True):
        if not torch.equal(a, b):
            raise AssertionError(f"{path}: upgrade changed a greedy weight")
    old, upgraded = _report(path, in_memory=False, art=old_art), _report(new, in_memory=False, art=new_art)
    return {
        "file": path.name,
        "format_before": old_art.header["format_version"],
        "layers": len(old.layers),
        "weights": old.compressed_weights,
        "paper_plus_mask_bytes": old.paper_plus_mask_bytes,
        "before": {"file_bytes": old.file_bytes, "compressed_bytes": old.compressed_bytes, "header": old.header_bytes},
        "after": {
            "file_bytes": upgraded.file_bytes,
            "compressed_bytes": upgraded.compressed_bytes,
            "header": upgraded.header_bytes,
        },
        "file_rate_before": old.file_rate,
        "file_rate_after": upgraded.file_rate,
        "paper_rate": old.paper_rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    files = sorted(f for d in args.dirs for f in d.glob("*.sqs"))
    if not files:
        raise SystemExit(f"no *.sqs files in {[str(d) for d in args.dirs]}")
    with tempfile.TemporaryDirectory() as scratch:
        rows = [compare(f, Path(scratch)) for f in files]
    print(f"{'file':72} {'v_old B':>9} {'v2 B':>9} {'ratio':>6} {'rate old':>8} {'rate v2':>8} {'paper+mask':>10}")
    for r in rows:
        ratio = r["after"]["file_bytes"] / r["before"]["file_bytes"]
        plus_mask = r["paper_plus_mask_bytes"]
        print(
            f"{r['file'][:72]:72} {r['before']['file_bytes']:>9,} {r['after']['file_bytes']:>9,} {ratio:>6.3f} "
            f"{r['file_rate_before']:>7.2f}x {r['file_rate_after']:>7.2f}x "
            f"{r['after']['compressed_bytes'] / plus_mask:>9.3f}x"
        )
    if args.json:
        write_json(args.json, {"machine": machine_info(), "files": rows}, indent=1)


if __name__ == "__main__":
    main()
