"""On a GPU: the SQS step of the 4096² Linear (K = 64) against sqs_core.chunked.DEVICE_CHUNK_ELEMENTS (eager, and
compiled with the certified plan forced), the dense route against its chunk (``--parts dense``; gpu_dense.py measures
its other settings), and sqs_core._index_add's rows against index_add_, each beside a plain step in the same
process; then a profile of the compiled step (the dense route, a GPU's). One short run for a lent GPU machine (gpu_checks.sh runs the broader checks):

    OUT=out/gpu PYTHONPATH=packages/sqs-core/src python3 packages/sqs-core/benchmarks/gpu_chunk_sweep.py

Each part prints as it goes and writes its lines to $OUT/chunk_sweep.txt, so a run cut short keeps what it
measured. Peaks are torch.cuda.max_memory_allocated() over the timed steps, in MiB.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path

import sqs_core._dense as dense
import sqs_core._index_add as index_add
import sqs_core.chunked as chunked
import torch
from _step_models import build, training

LOG: list[str] = []
DEVICE = torch.device("cuda")  # a dry run on the CPU sets this and mocks torch.cuda's timers


def say(line: str, out: Path) -> None:
    """Print a line and rewrite the log file with every line so far."""
    print(line, flush=True)
    LOG.append(line)
    (out / "chunk_sweep.txt").write_text("\n".join(LOG) + "\n")


def cuda_ms(fn, reps: int) -> float:
    """Mean milliseconds of ``fn`` over ``reps`` calls after one warm-up, by CUDA events."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def step_of(mode: str, batch: int):
    """A training step of the 4096² Linear in ``mode`` (plain, sqs, sqs-compiled) and its model."""
    model, x, loss_fn = build("linear4096", batch, DEVICE)
    opt, loss_of = training(model, loss_fn, mode, 64)

    def step() -> None:
        loss = loss_of(model(x))
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step, model


def timed_step(step, steps: int) -> tuple[float, float]:
    """(ms per step, peak MiB) over ``steps`` steps after two warm-up steps."""
    step()
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return cuda_ms(step, steps), torch.cuda.max_memory_allocated() / 2**20


def sweep_index_add(out: Path) -> None:
    """index_add_all split into rows (whatever the entries) against one index_add_, 2^20 float64 sources."""
    cap = index_add.DEVICE_MAX_ENTRIES
    index_add.DEVICE_MAX_ENTRIES = 1 << 30
    for entries in (128, 1024, 4096, 16384):
        index = torch.randint(0, entries, (1 << 20,), device=DEVICE)
        source = torch.randn(1 << 20, dtype=torch.float64, device=DEVICE)
        acc = torch.zeros(entries, dtype=torch.float64, device=DEVICE)
        plain = cuda_ms(partial(acc.index_add_, 0, index, source), 50)
        rows = cuda_ms(partial(index_add.index_add_all, [(acc, index, source)]), 50)
        say(f"index_add 2^20 float64 into {entries}: index_add_ {plain:.3f} ms, in rows {rows:.3f} ms", out)
    index_add.DEVICE_MAX_ENTRIES = cap


def sweep_chunks(mode: str, chunks: list[int], batch: int, steps: int, out: Path) -> None:
    """The step of ``mode`` at each chunk size, in order, then the first size again (the state moves on)."""
    step, model = step_of(mode, batch)
    for chunk in [*chunks, chunks[0]]:
        chunked.DEVICE_CHUNK_ELEMENTS = chunk
        ms, peak = timed_step(step, steps)
        say(f"{mode} DEVICE_CHUNK_ELEMENTS 2^{chunk.bit_length() - 1}: {ms:.2f} ms/step, peak {peak:.0f} MiB", out)
    del step, model


def sweep_dense(chunks: list[int], batch: int, steps: int, out: Path) -> None:
    """The compiled step (sqs_core._dense on a GPU) at each ``DENSE_CHUNK_WEIGHTS``, in order."""
    step, model = step_of("sqs-compiled", batch)
    for chunk in chunks:
        dense.DENSE_CHUNK_WEIGHTS = chunk
        ms, peak = timed_step(step, steps)
        say(
            f"sqs-compiled (dense) DENSE_CHUNK_WEIGHTS 2^{chunk.bit_length() - 1}: {ms:.2f} ms/step, peak {peak:.0f} MiB",
            out,
        )
    dense.DENSE_CHUNK_WEIGHTS = chunks[0]
    del step, model


def profile(mode: str, batch: int, out: Path) -> None:
    """A torch.profiler table of three steps of ``mode`` (after three unprofiled ones)."""
    step, model = step_of(mode, batch)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    tables = [prof.key_averages().table(sort_by=key, row_limit=30) for key in ("cuda_time_total", "cpu_time_total")]
    (out / f"profile_{mode}_{batch}.txt").write_text("\n\n".join(tables) + "\n")
    say(f"profile written: {mode}", out)
    del step, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--parts", nargs="+", default=["index_add", "plain", "sqs", "sqs-compiled", "dense", "profile"])
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", "out/gpu"))
    out.mkdir(parents=True, exist_ok=True)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_chunk_sweep.py needs a CUDA device")
    say(f"{torch.cuda.get_device_name()} torch {torch.__version__}", out)
    if "index_add" in args.parts:
        sweep_index_add(out)
    if "plain" in args.parts:
        step, model = step_of("plain", args.batch)
        ms, peak = timed_step(step, args.steps)
        say(f"plain: {ms:.2f} ms/step, peak {peak:.0f} MiB", out)
        del step, model
    chunks = [1 << 20, 1 << 21, 1 << 22, 1 << 23, 1 << 24]
    if "sqs" in args.parts:
        sweep_chunks("sqs", chunks, args.batch, args.steps, out)
    if "sqs-compiled" in args.parts:  # the certified plan (sqs_core._fused) forced: the chunk is its setting
        route, dense.dense_route = dense.dense_route, lambda device: False
        sweep_chunks("sqs-compiled", [1 << 22, 1 << 20, 1 << 24], args.batch, args.steps, out)
        dense.dense_route = route
    if "dense" in args.parts:  # the compiled mode's route on a GPU (sqs_core._dense) against its chunk
        sweep_dense([1 << 20, 1 << 22], args.batch, args.steps, out)
    if "profile" in args.parts:  # the compiled step as a GPU runs it: the dense route
        chunked.DEVICE_CHUNK_ELEMENTS = 1 << 22
        profile("sqs-compiled", args.batch, out)


if __name__ == "__main__":
    main()
