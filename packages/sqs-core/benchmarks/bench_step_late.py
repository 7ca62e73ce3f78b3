"""Late-training step time and peak memory, each mode in its own process, from one saved training state.

A step late in a scheduled run is the eager path's slowest: AdamW has moved the means, fewer weights are
certified one-hot (sqs_core.onehot), and a step in a process of its own also pays for its fresh pages, which
bench_step_paired.py's shared heap hides. bench_step.py's processes start from ``prepare_``. This script:

1. trains the case's SQS model (eager, the default) for ``--steps`` steps with the pruning schedule
   (``sqs.PruningSchedule(target_nonzero=--prune-to)``: the cubic ramp over the first 75% of the steps) and
   saves the model, its AdamW state and the schedule's state (``--state DIR`` keeps them, and a later run with
   the same DIR, case and steps reuses them; otherwise a temporary folder);
2. runs ``--rounds`` rounds of one process per mode (plain, then the SQS modes; the order rotates from round to
   round, as this VM's speed drifts over minutes). An SQS process loads the state (``sqs-compiled``: the same
   state with ``compile_kernels=True``), a plain one builds the same plain model from the same seed (a plain
   AdamW step costs the same at any weights); each runs ``--warmup`` steps, then times ``--timed`` steps, the
   schedule's update inside each SQS step as Algorithm 1 runs it.

Per round and mode: the median timed step, every step and the peak RSS of the timed steps (VmHWM restarted
after the warm-up); per SQS mode: each round's median over the plain median of the same round, and the range
and median of those ratios over the rounds, and the largest timed-steps peak over the plain one's.

Usage: python bench_step_late.py [--only KIND:BATCH] [--steps N] [--prune-to R] [--rounds N] [--warmup N]
[--timed N] [--modes sqs sqs-compiled] [--state DIR] [--warm-cache] [--out FILE]
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
from statistics import median

from _step_models import parse_case, parse_cases_or_exit  # this folder (a script's own folder is on sys.path)
from _timing import machine_info, write_json

SQS_MODES = ("sqs", "sqs-compiled")
HERE = Path(__file__).resolve().parent


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="linear4096:2048", metavar="KIND:BATCH", help="the case")
    parser.add_argument("--steps", type=int, default=300, help="scheduled steps before the timed ones")
    parser.add_argument("--prune-to", type=float, default=0.5, metavar="R", help="the schedule's target non-zero")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of one process per mode")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps in each process")
    parser.add_argument("--timed", type=int, default=8, help="timed steps in each process")
    parser.add_argument("--modes", nargs="+", default=["sqs"], choices=SQS_MODES, help="SQS modes to time")
    parser.add_argument("--state", type=Path, default=None, help="folder to keep (and reuse) the trained state in")
    parser.add_argument("--warm-cache", action="store_true", help="compile into the user's inductor cache")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write (default: print only)")
    args = parser.parse_args()
    (case,) = parse_cases_or_exit(parser, [args.only])
    for name in ("steps", "rounds", "warmup", "timed"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if not 0 < args.prune_to <= 1:
        parser.error(f"--prune-to must lie in (0, 1], got {args.prune_to}")
    if args.state is not None and args.state.exists() and not args.state.is_dir():
        parser.error(f"--state {args.state} is a file; give a folder")
    if args.out is not None and args.out.is_dir():
        parser.error(f"--out {args.out} is a folder; give a file name")
    return args, case, list(dict.fromkeys(args.modes))


def _schedule(model, prune_to: float, steps: int):
    import sqs_core as sqs

    return sqs.PruningSchedule(model, target_nonzero=prune_to, total_steps=steps)


def train_state(case: tuple[str, int, int], steps: int, prune_to: float, folder: Path) -> None:
    """``steps`` scheduled eager SQS steps of ``case``; the model, optimizer and schedule saved in ``folder``
    (``meta.json`` last, so a folder without it was left by an interrupted run and is trained again)."""
    import torch
    from _step_models import build, training
    from bench_step_paired import _step

    kind, batch, k = case
    model, x, loss_fn = build(kind, batch, torch.device("cpu"))
    opt, loss_of = training(model, loss_fn, "sqs", k)
    schedule = _schedule(model, prune_to, steps)
    start = time.perf_counter()
    for i in range(steps):
        _step(model, x, opt, loss_of, schedule, i)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model, "optimizer": opt.state_dict(), "schedule": schedule.state_dict()}, folder / "state.pt")
    meta = {"case": f"{kind}:{batch}", "steps": steps, "prune_to": prune_to, "nonzero": schedule.current_nonzero}
    meta["train_s"] = time.perf_counter() - start
    write_json(folder / "meta.json", meta)


def _child(mode: str, case_text: str, folder: str, warmup: int, timed: int) -> dict:
    """One process's steps (run as ``bench_step_late.py --child ...``): the timed steps' times and peak RSS."""
    import dataclasses

    import sqs_core as sqs
    import torch
    from _step_models import build, certified_fraction, training
    from _timing import peak_rss_mib, restart_peak_rss
    from bench_step_paired import _step

    kind, batch, k = parse_case(case_text)
    model, x, loss_fn = build(kind, batch, torch.device("cpu"))
    schedule, first = None, 0
    if mode != "plain":
        meta = json.loads((Path(folder) / "meta.json").read_text())
        state = torch.load(Path(folder) / "state.pt", weights_only=False)
        model = state["model"]
        for posterior in sqs.posteriors(model).values():
            posterior.config = dataclasses.replace(posterior.config, compile_kernels=mode == "sqs-compiled")
    opt, loss_of = training(model, loss_fn, mode, k, prepared=mode != "plain")
    if mode != "plain":
        opt.load_state_dict(state["optimizer"])
        schedule, first = _schedule(model, meta["prune_to"], meta["steps"]), meta["steps"]
        schedule.load_state_dict(state["schedule"])
    times = []
    for i in range(warmup + timed):
        if i == warmup:
            restart_peak_rss()
        times.append(_step(model, x, opt, loss_of, schedule, first + i)[0])
    return {
        "step_s": median(times[warmup:]),
        "steps_s": times,
        "steps_peak_rss_mib": peak_rss_mib(),
        "certified_fraction": None if mode == "plain" else certified_fraction(model),
    }


def run_rounds(case_text: str, folder: Path, modes: list[str], args, cache: str | None) -> list[dict]:
    """``args.rounds`` rounds of one process per mode, the order rotating; each round's results by mode."""
    env = dict(os.environ)
    if cache is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
    names, rounds = ["plain", *modes], []
    for r in range(args.rounds):
        shift = r % len(names)
        results = {}
        for mode in names[shift:] + names[:shift]:
            command = [sys.executable, __file__, "--child", mode, case_text, str(folder), str(args.warmup)]
            out = subprocess.run([*command, str(args.timed)], capture_output=True, text=True, check=True, env=env)
            results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        for mode in modes:
            results[mode]["time_ratio"] = results[mode]["step_s"] / results["plain"]["step_s"]
        rounds.append(results)
        print(f"round {r + 1}: " + ", ".join(_round_text(results, m) for m in names), flush=True)
    return rounds


def _round_text(results: dict, mode: str) -> str:
    text = f"{mode} {results[mode]['step_s']:.3f} s"
    return text + (f" (x{results[mode]['time_ratio']:.2f})" if "time_ratio" in results[mode] else "")


def summarise(rounds: list[dict], modes: list[str]) -> dict:
    """Per SQS mode: the range and median of the rounds' ratios, and the timed steps' peak over the plain one's."""
    plain_peak = max(r["plain"]["steps_peak_rss_mib"] or 0.0 for r in rounds)
    summary = {}
    for mode in modes:
        ratios = [r[mode]["time_ratio"] for r in rounds]
        peak = max(r[mode]["steps_peak_rss_mib"] or 0.0 for r in rounds)
        summary[mode] = {
            "time_ratio_min": min(ratios),
            "time_ratio_median": median(ratios),
            "time_ratio_max": max(ratios),
            "rounds_above_2x": sum(ratio > 2 for ratio in ratios),
            "steps_peak_rss_ratio": peak / plain_peak if plain_peak and peak else None,
        }
    return summary


def _state_folder(args, case_text: str, scratch: str) -> Path:
    """The folder of the trained state, trained first unless ``--state`` holds one of the same case and steps."""
    folder = args.state or Path(scratch)
    meta_path = folder / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if (meta["case"], meta["steps"], meta["prune_to"]) == (case_text, args.steps, args.prune_to):
            print(f"reusing the state in {folder} ({meta['steps']} steps, trained in {meta['train_s']:.0f} s)")
            return folder
        meta_path.unlink()  # another case's state: trained again, the meta written last
    print(f"training {args.steps} scheduled steps of {case_text} (eager) ...", flush=True)
    train_state(parse_case(case_text), args.steps, args.prune_to, folder)
    return folder


def main() -> None:
    if len(sys.argv) == 7 and sys.argv[1] == "--child":
        mode, case_text, folder, warmup, timed = sys.argv[2:]
        print(json.dumps(_child(mode, case_text, folder, int(warmup), int(timed))))
        return
    args, (kind, batch, _), modes = _arguments()
    case_text = f"{kind}:{batch}"
    with tempfile.TemporaryDirectory(prefix="sqs-late-") as scratch, tempfile.TemporaryDirectory() as cache:
        folder = _state_folder(args, case_text, scratch)
        rounds = run_rounds(case_text, folder, modes, args, None if args.warm_cache else cache)
    summary = summarise(rounds, modes)
    for mode, s in summary.items():
        peak = "n/a" if s["steps_peak_rss_ratio"] is None else f"x{s['steps_peak_rss_ratio']:.2f}"
        print(
            f"{case_text} {mode} after {args.steps} steps: x{s['time_ratio_min']:.2f}–{s['time_ratio_max']:.2f} "
            f"(median x{s['time_ratio_median']:.2f}, {s['rounds_above_2x']} of {args.rounds} rounds above 2x), "
            f"timed steps' peak {peak}"
        )
    settings = {k: v for k, v in vars(args).items() if k not in ("state", "out")}
    payload = {"machine": machine_info(), "date": time.strftime("%Y-%m-%d"), **settings, "summary": summary}
    if args.out is not None:
        write_json(args.out, {**payload, "rounds": rounds})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
