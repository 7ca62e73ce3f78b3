"""Memory and speed of one SQS training step vs one plain fine-tuning step of the same model.

(a) a CIFAR ResNet-20 topology (random weights, random labels) with K = 4, batch 128;
(b) one 4096×4096 Linear with K = 64 at several batch sizes (tokens), with a random regression target
    (large gradients: the means drift fast) and with the layer's own fp32 output as the target (the
    self-distillation of compression fine-tuning). The step's cost depends on the share of weights the
    one-hot certificate covers (sqs_core.onehot), so each SQS case also reports that share after its steps.
Each model runs three ways: plain fine-tuning, SQS (eager) and SQS with ``compile_kernels=True`` (the
per-weight passes as torch.compile'd kernels, sqs_core._fused). Step times are the median of the steps after
the first (steps 2–6); the first step of the compiled case, which compiles its kernels, is reported apart (``first_step_s``,
and ``compile_s`` = first step − median step; graphs first needed later, such as the width-8 nearby kernels when
the first such block appears, show as one slow step in ``steps_s``, which the median leaves out). Each compiled case first compiles into a fresh, empty inductor
cache, so this is the cost a user pays once per machine (``--warm-cache`` keeps the user's cache: the cost per
process). Each case runs in a fresh subprocess so peak RSS is measured per case: the process's (resource.getrusage,
``peak_rss_mib``) and, on Linux, that of steps 2 onwards alone (VmHWM restarted after the first step through
/proc/self/clear_refs, ``steps_peak_rss_mib``: without the first step's one-time compiling or kernel loading). The three
modes alternate for ``--rounds`` rounds (default 2; this VM's speed drifts over minutes): each mode's step time
is its fastest round's (the late one below chosen apart), its peak RSS the largest of its rounds. Writes JSON
to docs/results/step_bench.json and prints a table. ``--steps N`` (N ≥ 15) runs N steps per process and also
reports ``late_step_s``, the median of the last five, from the round where it is fastest: the certified share falls
as training moves the means, and the step's cost with it.
``--zero-grad first`` frees the last step's gradients before the forward (pytorch/examples' loop) instead of
after it. On the CPU, peak RSS depends on the allocator: the JSON records ``LD_PRELOAD`` and ``GLIBC_TUNABLES``,
which every case inherits (docs/method.md, "The loop order and the allocator"). ``--device cuda`` runs every case on a GPU, with
the steps' peak of allocated CUDA memory (torch.cuda.max_memory_allocated, prepare_'s K-means reported apart)
in place of peak RSS (the steps' host VmHWM ratio is then ``steps_host_rss_ratio``); first run on an H200 in
session 30 (docs/step-benchmarks.md; gpu_checks.sh runs it with the CUDA tests).
bench_step_paired.py times the same steps interleaved in one process (ratios free of the drift between
processes; no peak memory). The models and loops: _step_models.py.
Usage: python bench_step.py [--quick] [--warm-cache] [--rounds N] [--steps N] [--only KIND:BATCH ...]
[--modes plain sqs sqs-compiled] [--zero-grad first|after-forward] [--device cpu|cuda] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _step_models import parse_cases_or_exit  # this folder (a script's own folder is on sys.path)
from _timing import machine_info, write_json

CASE = r"""
import json, resource, sys, time, torch
sys.path.insert(0, sys.argv[8])  # this folder: _step_models
from _step_models import build, certified_fraction, training
from _timing import peak_rss_mib, restart_peak_rss
kind, mode, batch, k, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
dev = torch.device(sys.argv[6]); cuda = dev.type == "cuda"; zero_grad_first = sys.argv[7] == "first"
sync = torch.cuda.synchronize if cuda else (lambda: None)
model, x, loss_fn = build(kind, batch, dev)
opt, loss_of = training(model, loss_fn, mode, k)
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if cuda:  # the steps' own peak of allocated tensor memory (prepare_'s K-means reported apart)
    sync(); setup_peak = torch.cuda.max_memory_allocated(); torch.cuda.reset_peak_memory_stats()
times, steps_hwm = [], False
for r in range(repeats + 1):
    if r == 1:  # the later steps' own peak, without the first step's one-time work (compiling, loading kernels)
        steps_hwm = restart_peak_rss()
    sync(); t = time.perf_counter()
    if zero_grad_first:  # pytorch/examples' order: the last step's gradients are freed before the forward
        opt.zero_grad()
    loss = loss_of(model(x))
    if not zero_grad_first:  # they live through the forward
        opt.zero_grad()
    loss.backward(); opt.step(); sync(); times.append(time.perf_counter() - t)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
gpu = {"peak_allocated_mib": torch.cuda.max_memory_allocated() / 2**20, "peak_reserved_mib": torch.cuda.max_memory_reserved() / 2**20,
       "setup_peak_allocated_mib": setup_peak / 2**20} if cuda else {}
certified = certified_fraction(model) if mode.startswith("sqs") else None  # after the last step
median = lambda ts: sorted(ts)[len(ts) // 2]
print(json.dumps({"step_s": median(times[1:6]), "late_step_s": median(times[-5:]) if len(times) >= 15 else None, "steps_s": times, "first_step_s": times[0], "peak_rss_mib": peak / 1024,
                  "steps_peak_rss_mib": peak_rss_mib() if steps_hwm else None,
                  "rss_before_mib": base_rss / 1024, "certified_fraction": certified,
                  "params_mib": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20, **gpu}))
"""


MODES = ("plain", "sqs", "sqs-compiled")
HERE = Path(__file__).resolve().parent


def run_case(kind, mode, batch, k, repeats, cache_dir=None, device="cpu", zero_grad="after-forward"):
    """One process; ``cache_dir``: the inductor cache it compiles into (None: the user's). Its ``peak_mib``:
    peak RSS on the CPU, the steps' peak of allocated CUDA memory on a GPU."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    out = subprocess.run(
        [sys.executable, "-c", CASE, kind, mode, str(batch), str(k), str(repeats), device, zero_grad, str(HERE)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["peak_mib"] = result.get("peak_allocated_mib", result["peak_rss_mib"])
    if mode == "sqs-compiled":
        result["compile_s"] = result["first_step_s"] - result["step_s"]
    return result


def run_rounds(kind, batch, k, repeats, rounds, warm_cache, modes=MODES, device="cpu", zero_grad="after-forward"):
    """The three modes in turn, ``rounds`` times (this VM's speed drifts by ±20% over minutes, so the modes
    alternate). Per mode: the round with the fastest median step (its peak RSS and certified share), the
    largest peak of all rounds (``peak_max_mib``: RSS, or allocated CUDA memory) and every round. With
    ``--steps`` ≥ 15 the late figure is chosen the same way on its own: ``late_step_s`` is the fastest round's
    median of the last five steps (``late_round``: which round), not necessarily the round of the fastest early
    step. The compiled mode's first round compiles into an empty inductor cache (unless ``warm_cache``), the
    later ones reuse it."""
    runs = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        for _ in range(rounds):
            for mode in modes:
                cache_dir = cache if mode == "sqs-compiled" and not warm_cache else None
                runs[mode].append(run_case(kind, mode, batch, k, repeats, cache_dir, device, zero_grad))
    best = {}
    for mode, results in runs.items():
        best[mode] = dict(min(results, key=lambda r: r["step_s"]))
        if results[0]["late_step_s"] is not None:  # the fastest late figure, whichever round gave it
            late_round = min(range(len(results)), key=lambda i: results[i]["late_step_s"])
            best[mode]["late_step_s"], best[mode]["late_round"] = results[late_round]["late_step_s"], late_round
        best[mode]["peak_max_mib"] = max(r["peak_mib"] for r in results)
        steps_peaks = [r.get("steps_peak_rss_mib") for r in results]  # None where /proc/self/clear_refs is not there
        best[mode]["steps_peak_max_mib"] = None if None in steps_peaks else max(steps_peaks)
        best[mode]["rounds"] = results
        if mode == "sqs-compiled":  # the cost of compiling: the first round's first step
            best[mode]["first_step_s"] = results[0]["first_step_s"]
            best[mode]["compile_s"] = results[0]["compile_s"]
    return best


def _row(kind, batch, k, best):
    """One case's results and its ratios to the plain step (modes that did not run are left out)."""
    row = {"model": kind, "batch": batch, "K": k, **{mode.replace("-", "_"): r for mode, r in best.items()}}
    plain = best["plain"]
    for mode, suffix in (("sqs", ""), ("sqs-compiled", "_compiled")):
        if mode in best:
            row["time_ratio" + suffix] = best[mode]["step_s"] / plain["step_s"]
            row["peak_memory_ratio" + suffix] = best[mode]["peak_max_mib"] / plain["peak_max_mib"]
            if best[mode]["steps_peak_max_mib"] is not None and plain["steps_peak_max_mib"] is not None:
                # on a GPU the peak above is CUDA memory; the steps' VmHWM is then the host's, named as such
                key = "steps_host_rss_ratio" if "peak_allocated_mib" in plain else "steps_peak_memory_ratio"
                row[key + suffix] = best[mode]["steps_peak_max_mib"] / plain["steps_peak_max_mib"]
            if plain["late_step_s"] is not None:
                row["late_time_ratio" + suffix] = best[mode]["late_step_s"] / plain["late_step_s"]
    return row


def _summary(row):
    """One printed line per case."""
    parts = [f"{row['model']:>10} batch {row['batch']:>5} K={row['K']:<3} plain {row['plain']['step_s']:.3f}s"]
    for mode, suffix in (("sqs", ""), ("sqs_compiled", "_compiled")):
        if mode in row:
            r = row[mode]
            late = f", late x{row['late_time_ratio' + suffix]:.2f}" if "late_time_ratio" + suffix in row else ""
            if "steps_peak_memory_ratio" + suffix in row:
                late += f", steps 2+ peak x{row['steps_peak_memory_ratio' + suffix]:.2f}"
            elif "steps_host_rss_ratio" + suffix in row:
                late += f", steps 2+ host RSS x{row['steps_host_rss_ratio' + suffix]:.2f}"
            parts.append(
                f"{mode} {r['step_s']:.3f}s (x{row['time_ratio' + suffix]:.2f}{late}, first {r['first_step_s']:.1f}s, "
                f"peak x{row['peak_memory_ratio' + suffix]:.2f}, certified {r['certified_fraction']:.4f})"
            )
    return "; ".join(parts)


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and batch sizes")
    parser.add_argument("--warm-cache", action="store_true", help="compile into the user's inductor cache")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each mode; the fastest counts")
    parser.add_argument("--steps", type=int, default=None, help="steps per process (default 6, --quick 3)")
    parser.add_argument("--only", nargs="+", default=None, metavar="KIND:BATCH", help="run only these cases")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (a GPU: peak = allocated CUDA memory)")
    parser.add_argument(
        "--zero-grad",
        default="after-forward",
        choices=("first", "after-forward"),
        help="where the loop frees the last gradients: after the forward (the published figures) or first (pytorch/examples)",
    )
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="plain is always run")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[3] / "docs/results/step_bench.json"
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    import torch

    try:
        device_type = torch.device(args.device).type
    except RuntimeError:
        device_type = None
    if device_type not in ("cpu", "cuda"):
        parser.error(f"--device must be cpu or cuda[:N], got {args.device!r}")
    if device_type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this torch ({torch.__version__}) sees no CUDA device")
    if args.steps is not None and args.steps < 2:
        parser.error(f"--steps must be at least 2 (the first step is reported apart), got {args.steps}")
    batches = (256,) if args.quick else (256, 2048, 8192)
    cases = [("resnet20", 128, 4)] + [(kind, b, 64) for kind in ("linear4096", "linear4096-distill") for b in batches]
    if args.only is not None:  # any KIND:BATCH, not only the default batches
        cases = parse_cases_or_exit(parser, args.only)
    modes = ["plain"] + [mode for mode in MODES[1:] if mode in args.modes]
    steps = args.steps or (3 if args.quick else 6)
    return args, cases, modes, steps


def main() -> None:
    args, cases, modes, steps = _arguments()
    rows = []
    for kind, batch, k in cases:
        best = run_rounds(kind, batch, k, steps - 1, args.rounds, args.warm_cache, modes, args.device, args.zero_grad)
        rows.append(_row(kind, batch, k, best))
        print(_summary(rows[-1]), flush=True)
    import torch

    machine = machine_info()
    machine["device"] = args.device if args.device == "cpu" else torch.cuda.get_device_name(args.device)
    run = {"machine": machine, "date": time.strftime("%Y-%m-%d"), "zero_grad": args.zero_grad, "rows": rows}
    write_json(args.out, run)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
