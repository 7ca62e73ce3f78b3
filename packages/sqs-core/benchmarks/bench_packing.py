"""Throughput of decoding packed level indices to weights (unpack + codebook gather).

Usage: python packages/sqs-core/benchmarks/bench_packing.py [--count N] [--repeats R] [--json PATH]

Times two paths on ``count`` random indices for bits 2 and 4 (and a codebook of 2**bits - 1
levels, which adds the out-of-range check): ``unpack_bits`` followed by ``index_select``, and
the fused byte-table ``unpack_gather``.  Reports the best of ``repeats`` runs in weights/s.
"""

from __future__ import annotations

import argparse

import torch
from _timing import best_seconds, machine_info, write_json  # this folder, on sys.path when run as a script
from sqs_core.packing import pack_bits, unpack_bits, unpack_gather


def run(count: int, repeats: int) -> list[dict[str, object]]:
    """Return one result row per (bits, levels, path)."""
    generator = torch.Generator().manual_seed(0)
    rows: list[dict[str, object]] = []
    for bits in (2, 3, 4, 5):  # 3 and 5: odd widths, common for joint (window, level) codes
        for n_levels in (1 << bits, (1 << bits) - 1):
            indices = torch.randint(0, n_levels, (count,), generator=generator)
            codebook = torch.randn(n_levels, generator=generator)
            packed = pack_bits(indices, bits)
            expected = codebook[indices]
            paths = {
                "unpack_bits+index_select": lambda p=packed, b=bits, c=codebook: c.index_select(
                    0, unpack_bits(p, b, count).to(torch.int32)
                ),
                "unpack_gather": lambda p=packed, b=bits, c=codebook: unpack_gather(p, b, count, c),
            }
            for path, fn in paths.items():
                if not torch.equal(fn(), expected):
                    raise RuntimeError(f"{path} decoded wrong values for bits={bits}")
                seconds = best_seconds(fn, repeats, warmup=True)
                rows.append({"bits": bits, "levels": n_levels, "path": path, "weights_per_s": count / seconds})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=16 * 2**20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the machine and the rows to this JSON file")
    args = parser.parse_args()
    rows = run(args.count, args.repeats)
    print(f"count={args.count} threads={torch.get_num_threads()} torch={torch.__version__}")
    for row in rows:
        rate = f"{row['weights_per_s']:.3e} weights/s"
        print(f"bits={row['bits']} K={row['levels']:<3} {row['path']:<26} {rate}")
    if args.json:
        write_json(args.json, {"machine": machine_info(), "count": args.count, "rows": rows})


if __name__ == "__main__":
    main()
