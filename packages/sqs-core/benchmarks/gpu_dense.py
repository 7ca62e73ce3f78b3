"""On a GPU: the compiled step of the 4096² Linear (K = 64) by sqs_core._dense, its variants, beside a plain step
in the same process, and a profile of it. One short run for a lent GPU machine:

    OUT=out/gpu PYTHONPATH=packages/sqs-core/src python3 packages/sqs-core/benchmarks/gpu_dense.py

Variants (``VARIANTS``, in order; the state moves on with every step): the defaults (inductor never stores an
(n, K) intermediate: ``_dense.INLINE``; column sums by tiles of ``_dense.COLUMN_TILE`` weights, in
``_dense.TILE_DTYPE``), float32 tiles of several sizes, no tiles, and inductor's default storing. Each line goes to
$OUT/chunk_sweep.txt as it is measured.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import sqs_core._dense as dense
import torch
from gpu_chunk_sweep import profile, say, step_of, timed_step
from sqs_core._compiled import _Kernel

VARIANTS = [  # (name, COLUMN_TILE, TILE_DTYPE, inductor options), measured in this order
    ("defaults", dense.COLUMN_TILE, dense.TILE_DTYPE, dense.INLINE),
    ("float64 tiles of 256", 256, torch.float64, dense.INLINE),
    ("float32 tiles of 64", 64, torch.float32, dense.INLINE),
    ("float32 tiles of 1024", 1024, torch.float32, dense.INLINE),
    ("no tiles", 0, torch.float64, dense.INLINE),
    ("stored", 256, torch.float64, None),
]


def _recompiled(options) -> None:
    """Fresh dense kernels compiled with inductor ``options`` (None: inductor's defaults)."""
    for name, kernel in list(dense.KERNELS.items()):
        dense.KERNELS[name] = _Kernel(kernel.fn, dynamic=None, options=options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--variants", type=int, default=len(VARIANTS), help="measure the first N variants")
    parser.add_argument("--profile", action="store_true", help="then profile the defaults")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", "out/gpu"))
    out.mkdir(parents=True, exist_ok=True)
    say(f"{torch.cuda.get_device_name()} torch {torch.__version__}", out)
    step, model = step_of("plain", args.batch)
    ms, peak = timed_step(step, args.steps)
    say(f"plain: {ms:.2f} ms/step, peak {peak:.0f} MiB", out)
    del step, model
    step, model = step_of("sqs-compiled", args.batch)
    for name, tile, dtype, options in VARIANTS[: args.variants]:
        dense.COLUMN_TILE, dense.TILE_DTYPE = tile, dtype
        if options is not dense.INLINE:
            _recompiled(options)
        try:
            ms, peak = timed_step(step, args.steps)
        except Exception as exc:  # one variant failing to compile must not cost the others
            say(f"sqs-compiled (dense, {name}): failed: {type(exc).__name__}: {str(exc)[:300]}", out)
            continue
        say(f"sqs-compiled (dense, {name}): {ms:.2f} ms/step, peak {peak:.0f} MiB", out)
    del step, model
    if args.profile:
        dense.COLUMN_TILE, dense.TILE_DTYPE = VARIANTS[0][1:3]
        _recompiled(dense.INLINE)
        profile("sqs-compiled", args.batch, out)


if __name__ == "__main__":
    main()
