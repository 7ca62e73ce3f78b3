"""The embedded-default main job: compress a small CNN on scikit-learn's bundled digits with SQS.

Real data, no download: 1,797 8×8 handwritten digits (sklearn.datasets.load_digits). A CNN with
batch-norm is trained in full precision, then compressed with SQS at 2 bits (K = 4) and 50% non-zero
weights, and evaluated greedily and with Bayesian averaging (M = 4). Runs in well under 2 minutes on
2 CPU cores. Usage: python examples/digits_demo.py [--out DIR] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import sqs_core as sqs
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn


def digits(seed: int):
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32)[:, None] / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    split = int(0.8 * len(y))
    return (x[order[:split]], y[order[:split]]), (x[order[split:]], y[order[split:]])


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
        nn.Flatten(), nn.Linear(256, 10),
    )  # fmt: skip


def batches(x, y, size, generator):
    order = torch.randperm(len(y), generator=generator)
    for i in range(0, len(y), size):
        idx = order[i : i + size]
        yield x[idx], y[idx]


@torch.no_grad()
def accuracy(model, x, y) -> float:
    model.eval()
    return float((model(x).argmax(-1) == y).float().mean()) * 100


def train_fp32(model, train, epochs, seed):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        for xb, yb in batches(*train, 64, gen):
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()


def compress(model, train, epochs, seed, nonzero):
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, seed=seed))
    steps = epochs * -(-len(train[1]) // 64)
    objective = sqs.Objective(model, num_data=len(train[1]))
    opt = torch.optim.AdamW(sqs.param_groups(model, quant_lr=5e-4, gate_lr=1e-4, other_lr=1e-3))
    pruning = sqs.PruningSchedule(model, target_nonzero=nonzero, total_steps=steps)
    gate_tau = sqs.GateTemperatureSchedule(model, total_steps=steps)
    gen, step = torch.Generator().manual_seed(seed + 1), 0
    for _ in range(epochs):
        model.train()
        for xb, yb in batches(*train, 64, gen):
            pruning.step(step)
            gate_tau.step(step)
            loss = objective(F.cross_entropy(model(xb), yb))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
    pruning.step(steps)
    return model


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--nonzero", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=None, help="where to write demo.sqs (default: a temp dir)")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    train, test = digits(args.seed)
    model = small_cnn()
    train_fp32(model, train, args.epochs, args.seed)
    fp32 = accuracy(model, *test)
    compress(model, train, args.epochs, args.seed, args.nonzero)
    sqs.greedy_(model, nonzero=args.nonzero)
    greedy = accuracy(model, *test)
    averaged = sqs.BayesianAverage(model, samples=4, nonzero=args.nonzero, generator=torch.Generator().manual_seed(0))
    bayes = accuracy(averaged, *test)
    result = {"fp32_acc": fp32, "greedy_acc": greedy, "bayes_avg_acc": bayes}
    result.update(_report(model, args))
    result["seconds"] = time.perf_counter() - start
    for key, value in result.items():
        print(f"{key:>24}: {value:.4g}" if isinstance(value, float) else f"{key:>24}: {value}")
    return result


def _report(model, args) -> dict:
    out: dict = {}
    layers = sqs.sqs_layers(model).values()
    nnz = sum(int((layer.fixed_weight != 0).sum()) for layer in layers)
    total = sum(layer.fixed_weight.numel() for layer in layers)
    out["nonzero_rate"] = nnz / total
    if hasattr(sqs, "save"):
        folder = args.out or Path(tempfile.mkdtemp())
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "demo.sqs"
        sqs.save(model, path, nonzero=args.nonzero)
        report = sqs.compression_report(path)
        out["compression_rate_paper"] = report.paper_rate
        out["compression_rate_file"] = report.file_rate
        out["file_bytes"] = report.file_bytes
        print(report)
    else:
        k, kept = 4, nnz
        codebooks = sum(p.means.numel() for p in sqs.posteriors(model).values())
        out["compression_rate_paper"] = 32 * total / (2 * kept + 32 * codebooks)
        _ = k
    return out


if __name__ == "__main__":
    json.dumps(main())
