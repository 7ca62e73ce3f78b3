"""Step-time ratios measured side by side: SQS and plain fine-tuning steps interleaved in one process.

bench_step.py runs each mode in a process of its own, one after another, so a ratio of two medians carries
this VM's drift over minutes (its plain 2,048-token step ranged 0.94–1.45 s within single runs). Here one
process holds the plain model and one model per SQS mode, all built from the same seed (_step_models), and
runs step i of every mode in turn, the order rotating from step to step; each SQS step's ratio is its time
over the plain step of the same round. Reported per SQS mode: the median ratio over steps 2–6 and over the
last five steps (``--steps`` ≥ 15), the median ratio in each window of ``--window`` steps (steps 1–25, 26–50,
...: how the ratio moves over a scheduled run), the run's total SQS time over its total plain time (steps 2 on,
the first step's compile left out), the medians of the step times, the share of weights certified one-hot
after the last step, and every step's time. The compiled mode compiles into a fresh inductor cache unless
``--warm-cache`` (its first step is in ``ratios`` but in neither median).

``--far-gates`` sets every SQS gate logit before each step (untimed) to where gates driven far from 1/2 end up:
ℓ = s̃/τ' uniform in [−95, −80] for three gates in four and in [80, 95] for the rest (fixed seed), which puts
λ̃ μ at and below float32's smallest normal number (docs/method.md, "Session 32").

``--prune-to R`` runs the paper's pruning schedule (Algorithm 1; ``sqs.PruningSchedule(target_nonzero=R,
total_steps=--steps, update_every=--prune-every)``: the cubic ramp over the first 75% of the steps) after every SQS
step, inside the timed step (its own time is also reported as ``schedule_s``). Pruned weights skip the mixture's evaluation
(``onehot.classify``'s ``keep``), so late steps gain as the ramp advances.

Peak memory needs a process per mode: bench_step.py measures it. The models share one process and one
allocator here, so each step runs on whatever heap the other models' steps left (glibc keeps freed memory):
this times the steps' work, not their page faults on fresh memory.

Usage: python bench_step_paired.py --only KIND:BATCH [--modes sqs sqs-compiled] [--steps N] [--window N]
[--warm-cache] [--far-gates] [--prune-to R [--prune-every N]] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from statistics import median

from _step_models import KINDS, parse_cases_or_exit  # this folder (a script's own folder is on sys.path)
from _timing import machine_info, write_json

SQS_MODES = ("sqs", "sqs-compiled")
WINDOW = 25  # steps per window of the windowed median ratios, unless --window


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", required=True, metavar="KIND:BATCH", help=f"the case, KIND one of {KINDS}")
    parser.add_argument("--modes", nargs="+", default=list(SQS_MODES), choices=SQS_MODES, help="SQS modes to time")
    parser.add_argument("--steps", type=int, default=50, help="steps of every mode (at least 15)")
    parser.add_argument("--window", type=int, default=WINDOW, help="steps per window of the windowed median ratios")
    parser.add_argument("--warm-cache", action="store_true", help="compile into the user's inductor cache")
    parser.add_argument("--far-gates", action="store_true", help="gate logits set to |s̃/τ'| in [80, 95] each step")
    parser.add_argument("--prune-to", type=float, default=None, metavar="R", help="pruning schedule to non-zero R")
    parser.add_argument("--prune-every", type=int, default=1, metavar="N", help="the schedule's update_every")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write (default: print only)")
    args = parser.parse_args()
    (case,) = parse_cases_or_exit(parser, [args.only])
    if args.steps < 15:
        parser.error(f"--steps must be at least 15 (steps 2–6 and the last five are reported), got {args.steps}")
    if args.prune_to is not None and not 0 < args.prune_to <= 1:
        parser.error(f"--prune-to must lie in (0, 1], got {args.prune_to}")
    if args.window < 1:
        parser.error(f"--window must be at least 1, got {args.window}")
    if args.prune_every < 1:
        parser.error(f"--prune-every must be at least 1, got {args.prune_every}")
    if args.out is not None and args.out.is_dir():
        parser.error(f"--out {args.out} is a folder; give a file name")
    return args, case, list(dict.fromkeys(args.modes))


def _step(model, x, opt, loss_of, schedule=None, index=0) -> tuple[float, float]:
    """One training step (gradients freed after the forward, as bench_step.py's default) and, with
    ``schedule``, its pruning update as Algorithm 1 runs it: (the step's time, the update's share of it)."""
    start = time.perf_counter()
    loss = loss_of(model(x))
    opt.zero_grad()
    loss.backward()
    opt.step()
    update = time.perf_counter()
    if schedule is not None:
        schedule.step(index + 1)
    end = time.perf_counter()
    return end - start, end - update


def _far_gate_logits(model):
    """[(gate logits parameter, the s̃ of --far-gates)] of every posterior of ``model``."""
    import sqs_core as sqs
    import torch

    g = torch.Generator().manual_seed(0)
    pairs = []
    for posterior in sqs.posteriors(model).values():
        shape = posterior.gate_logits.shape
        logits = torch.rand(shape, generator=g) * 15 + 80
        logits = torch.where(torch.rand(shape, generator=g) < 0.75, -logits, logits)
        pairs.append((posterior.gate_logits, (logits * float(posterior.gate_temperature)).to(posterior.gate_logits)))
    return pairs


def run(
    kind: str,
    batch: int,
    k: int,
    modes: list[str],
    steps: int,
    far_gates: bool = False,
    prune: dict | None = None,
    window: int = WINDOW,
) -> dict:
    """Every mode's step times and each SQS mode's per-step ratios to the plain step of the same round."""
    import sqs_core as sqs
    import torch
    from _step_models import build, certified_fraction, training

    setups, resets, schedules = {}, {}, {}
    for mode in ["plain", *modes]:
        model, x, loss_fn = build(kind, batch, torch.device("cpu"))
        setups[mode] = (model, x, *training(model, loss_fn, mode, k))
        resets[mode] = _far_gate_logits(model) if far_gates and mode != "plain" else []
        use = prune is not None and mode != "plain"
        schedules[mode] = sqs.PruningSchedule(model, **prune, total_steps=steps) if use else None
    names = list(setups)
    times: dict[str, list[float]] = {mode: [] for mode in names}
    updates: dict[str, list[float]] = {mode: [] for mode in names}
    for i in range(steps):
        shift = i % len(names)
        for mode in names[shift:] + names[:shift]:
            with torch.no_grad():
                for parameter, value in resets[mode]:
                    parameter.copy_(value)
            step_s, update_s = _step(*setups[mode], schedules[mode], i)
            times[mode].append(step_s)
            updates[mode].append(update_s)
    result = {"plain": {"step_s": median(times["plain"][1:6]), "late_step_s": median(times["plain"][-5:])}}
    result["plain"]["steps_s"] = times["plain"]
    for mode in modes:
        ratios = [t / p for t, p in zip(times[mode], times["plain"], strict=True)]
        result[mode] = {
            "time_ratio": median(ratios[1:6]),
            "late_time_ratio": median(ratios[-5:]),
            "window_ratios": window_medians(ratios, window),
            "run_time_ratio": sum(times[mode][1:]) / sum(times["plain"][1:]),
            "step_s": median(times[mode][1:6]),
            "late_step_s": median(times[mode][-5:]),
            "first_step_s": times[mode][0],
            "certified_fraction": certified_fraction(setups[mode][0]),
            "nonzero": None if schedules[mode] is None else schedules[mode].current_nonzero,
            "schedule_s": updates[mode],
            "ratios": ratios,
            "steps_s": times[mode],
        }
    return result


def window_medians(ratios: list[float], window: int) -> list[float]:
    """The median of ``ratios`` in each run of ``window`` consecutive steps (the last run may be shorter)."""
    return [median(ratios[a : a + window]) for a in range(0, len(ratios), window)]


def main() -> None:
    args, (kind, batch, k), modes = _arguments()
    if "sqs-compiled" in modes and not args.warm_cache:
        cache = tempfile.TemporaryDirectory(prefix="inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache.name  # read when inductor first compiles
    prune = None if args.prune_to is None else {"target_nonzero": args.prune_to, "update_every": args.prune_every}
    result = run(kind, batch, k, modes, args.steps, args.far_gates, prune, args.window)
    for mode in modes:
        r = result[mode]
        print(
            f"{kind}:{batch} {mode}: steps 2–6 x{r['time_ratio']:.2f}, last five x{r['late_time_ratio']:.2f} "
            f"({r['late_step_s']:.3f} s against plain {result['plain']['late_step_s']:.3f} s), "
            f"certified {r['certified_fraction']:.4f}"
        )
        windows = ", ".join(f"x{v:.2f}" for v in r["window_ratios"])
        print(f"  windows of {args.window} steps: {windows}; the run's total time x{r['run_time_ratio']:.2f}")
    payload = {
        "machine": machine_info(),
        "date": time.strftime("%Y-%m-%d"),
        "case": f"{kind}:{batch}",
        "steps": args.steps,
        "window": args.window,
        "far_gates": args.far_gates,
        "prune_to": args.prune_to,
        "prune_every": args.prune_every if args.prune_to is not None else None,
    }
    if args.out is not None:
        write_json(args.out, {**payload, **result})  # no half-written results
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
