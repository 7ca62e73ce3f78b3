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

VARIANTS = [  # (name, COLUMN_TILE, TILE_DTYPE, inductor options, DENSE_CHUNK_WEIGHTS), measured in this order
    ("defaults", dense.COLUMN_TILE, dense.TILE_DTYPE, dense.INLINE, dense.DENSE_CHUNK_WEIGHTS),
    ("float64 tiles of 256", 256, torch.float64, dense.INLINE, 1 << 20),
    ("float32 tiles of 64", 64, torch.float32, dense.INLINE, 1 << 20),
    ("float32 tiles of 1024", 1024, torch.float32, dense.INLINE, 1 << 20),
    ("no tiles", 0, torch.float64, dense.INLINE, 1 << 20),
    ("stored", 256, torch.float64, None, 1 << 20),
    # not yet measured (session 35 measured the chunk only with inductor storing (n, K) intermediates)
    ("chunks of 2^19", dense.COLUMN_TILE, dense.TILE_DTYPE, dense.INLINE, 1 << 19),
    ("chunks of 2^21", dense.COLUMN_TILE, dense.TILE_DTYPE, dense.INLINE, 1 << 21),
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
    parser.add_argument("--only", type=int, nargs="+", help="measure these variants (indices into VARIANTS)")
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
    chosen = [VARIANTS[i] for i in (args.only if args.only else range(args.variants))]
    compiled_with = dense.INLINE
    for name, tile, dtype, options, chunk in chosen:
        dense.COLUMN_TILE, dense.TILE_DTYPE, dense.DENSE_CHUNK_WEIGHTS = tile, dtype, chunk
        if options is not compiled_with:
            _recompiled(options)
            compiled_with = options
        try:
            ms, peak = timed_step(step, args.steps)
        except Exception as exc:  # one variant failing to compile must not cost the others
            say(f"sqs-compiled (dense, {name}): failed: {type(exc).__name__}: {str(exc)[:300]}", out)
            continue
        say(f"sqs-compiled (dense, {name}): {ms:.2f} ms/step, peak {peak:.0f} MiB", out)
    del step, model
    if args.profile:
        dense.COLUMN_TILE, dense.TILE_DTYPE, dense.DENSE_CHUNK_WEIGHTS = (VARIANTS[0][i] for i in (1, 2, 4))
        _recompiled(dense.INLINE)
        profile("sqs-compiled", args.batch, out)


if __name__ == "__main__":
    main()
