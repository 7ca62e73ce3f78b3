"""Size and speed of the compressed artifact (sqs_core.save / load): bytes vs the paper's formula, timings.

Usage: python packages/sqs-core/benchmarks/bench_artifact.py [--size 4096] [--repeats 3]
       [--json docs/results/artifact_bench.json]

Case ``linear``: one ``nn.Linear(size, size)`` (default init) prepared with
``SQSConfig(num_components=16, windows="outlier")`` (gates initialised by |θ| rank, so pruning keeps the
largest weights), saved with 25% non-zero weights. Case ``resnet20-random``: the compressible layers of a
CIFAR ResNet-20 with random init, K=4, 50% non-zero (sqs-core cannot import sqs-bench; the pretrained
model's file rate is measured by the sqs-bench runner).

Each case is saved with and without the Bayesian-averaging alternatives and reports the file's bytes for
the compressed tensors against the paper's formula (log2 K bits per kept weight + 32 bits per codebook
entry) and against that formula + 1 mask bit per weight; save and load wall times (best of ``repeats``);
and dequantization throughput in weights/s: the packed-index gather alone (``unpack_gather``), the
whole greedy decode of the largest tensor (mask decode + gather + scatter into the dense weight), and the
greedy decode of every compressed tensor of the file, batched (``Artifact.weights``, what ``load`` uses)
against one tensor at a time. ``--trained FILE...`` adds the whole-model decode of trained artifacts.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import tempfile
import time
from pathlib import Path

import sqs_core as sqs
import torch
from _timing import best_seconds, machine_info, write_json  # this folder, on sys.path when run as a script
from sqs_core._artifact_file import Artifact
from sqs_core._artifact_layout import FLOAT_DTYPES, _Decoded, decode_weight, encode
from sqs_core.artifact import read_artifact
from sqs_core.packing import decode_mask
from torch import nn

TARGET_OVER_FORMULA_PLUS_MASK = 1.05
TARGET_WEIGHTS_PER_S = 2e8


def linear_case(size: int) -> tuple[nn.Module, nn.Module, float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(size, size))
    skeleton = copy.deepcopy(model)
    sqs.prepare_(model, sqs.SQSConfig(num_components=16, windows="outlier", gate_init="magnitude"))
    return model, skeleton, 0.25


def resnet20_shapes() -> nn.Module:
    """The compressible layers of a CIFAR ResNet-20 (16/32/64 channels, 3 blocks per stage) with torch's
    default random init: the artifact's size depends on the shapes, K and the non-zero rate, not on a forward
    pass. The pretrained model's file rate is measured by sqs-bench (``compression_rate_file``)."""
    layers, channels_in = [nn.Conv2d(3, 16, 3, padding=1, bias=False)], 16
    for channels in (16, 32, 64):
        for _ in range(3):
            layers += [
                nn.Conv2d(channels_in, channels, 3, padding=1, bias=False),
                nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            ]
            channels_in = channels
    return nn.Sequential(*layers, nn.Linear(64, 10))


def resnet20_case(windows: str = "outlier") -> tuple[nn.Module, nn.Module, float]:
    """``windows="none"`` separates what the windows cost (a window id per kept weight, which the paper's
    formula does not count) from what the header costs."""
    torch.manual_seed(0)
    model = resnet20_shapes()
    skeleton = copy.deepcopy(model)
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, windows=windows, gate_init="magnitude"))
    return model, skeleton, 0.5


def measure(name: str, model: nn.Module, skeleton: nn.Module, nonzero: float, repeats: int) -> dict:
    row: dict = {"case": name, "nonzero": nonzero}
    start = time.perf_counter()
    dists = sqs.discrete_posteriors(model, nonzero=nonzero)
    row["discrete_posteriors_s"] = time.perf_counter() - start  # part of every save: the posterior's work
    row["encode_s"] = best_seconds(lambda: [encode(d, alternatives=True) for d in dists.values()], repeats)
    with tempfile.TemporaryDirectory(prefix="sqs-bench-") as folder:
        for alternatives in (False, True):
            path = Path(folder) / f"{name}-{alternatives}.sqs"
            start = time.perf_counter()
            sqs.save(model, path, nonzero=nonzero, include_alternatives=alternatives)
            save_s = time.perf_counter() - start  # once: it recomputes the discrete posteriors
            report = sqs.compression_report(path)
            if os.path.getsize(path) != report.file_bytes:
                raise RuntimeError("the report's file size disagrees with the file")
            target = copy.deepcopy(skeleton)
            load_s = best_seconds(lambda p=path, t=target: sqs.load(p, t), repeats)
            row["with_alternatives" if alternatives else "greedy_only"] = _sizes(report) | {
                "save_s": save_s,
                "load_s": load_s,
            }
        row.update(throughput(path, repeats))
        row["mask_encodings"] = sorted({r["mask"] for r in read_artifact(path).records})
    row["entropy_bound"] = entropy_bound(dists, report.paper_plus_mask_bytes)
    row["compressed_weights"] = report.compressed_weights
    row["nonzero_weights"] = report.nonzero_weights
    row["layers"] = len(report.layers)
    return row


def entropy_bound(dists: dict, paper_plus_mask_bytes: float) -> dict:
    """What no coder of i.i.d. symbols can beat: per tensor, the empirical entropy of the kept weights'
    joint (window, level) codes, the binary entropy of the mask, and 32 bits per used codebook entry."""
    bits, kept, index_bits = 0.0, 0, 0.0
    for d in dists.values():
        keep = d.keep.reshape(-1)
        codes = (d.window_ids.reshape(-1).long() * d.codebook.shape[-1] + d.greedy.reshape(-1).long())[keep]
        n, total = codes.numel(), keep.numel()
        counts = torch.bincount(codes).double()
        counts = counts[counts > 0]
        h_index = float(-(counts / n * torch.log2(counts / n)).sum()) if n else 0.0
        p = n / total
        h_mask = 0.0 if p in (0.0, 1.0) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))
        bits += h_index * n + h_mask * total + 32 * counts.numel()
        kept, index_bits = kept + n, index_bits + h_index * n
    return {
        "index_entropy_bits_per_kept_weight": index_bits / max(kept, 1),
        "bound_bytes": bits / 8,
        "bound_over_paper_plus_mask": bits / 8 / paper_plus_mask_bytes,
    }


def _sizes(report: sqs.CompressionReport) -> dict:
    return {
        "file_bytes": report.file_bytes,
        "compressed_bytes": report.compressed_bytes,
        "header_bytes": report.header_bytes,
        "shared_bytes_of_compressed": sum(r.bytes_shared for r in report.layers),
        "alternative_bytes": report.alternative_bytes,
        "paper_bytes": report.paper_bytes,
        "paper_plus_mask_bytes": report.paper_plus_mask_bytes,
        "compressed_over_paper": report.compressed_bytes / report.paper_bytes,
        "compressed_over_paper_plus_mask": report.compressed_bytes / report.paper_plus_mask_bytes,
        "paper_rate": report.paper_rate,
        "paper_plus_mask_rate": report.paper_plus_mask_rate,
        "file_rate": report.file_rate,
        "effective_bits_per_weight": report.effective_bits_per_weight,
        "model_rate": report.model_rate,
    }


def throughput(path: Path, repeats: int) -> dict:
    """Dequantization speed on the largest compressed tensor of the file."""
    art = read_artifact(path)
    rec = max(art.records, key=lambda r: r["kept"])
    name = rec["layers"][0]
    blob = art.blobs[name]
    dec = _Decoded(name, rec, blob)
    gather_s = best_seconds(dec.kept_values, repeats)  # the code streams (plain or escaped) to values
    mask_s = best_seconds(lambda: decode_mask(rec["mask"], dec.parts["mask"], dec.numel), repeats)
    decode_s = best_seconds(lambda: decode_weight(name, rec, blob), repeats)
    read_s = best_seconds(lambda: read_artifact(path), repeats)
    return model_decode(art, repeats) | {
        "throughput_tensor": name,
        "code_bits": rec["code_bits"],
        "gather_weights_per_s": rec["kept"] / gather_s,  # per kept weight: code streams to values alone
        "mask_decode_weights_per_s": dec.numel / mask_s,  # per weight of the tensor
        "decode_weights_per_s": dec.numel / decode_s,  # per weight: mask + gather + scatter
        "read_and_verify_s": read_s,  # read the file, parse, both checksums, no decoding
    }


def model_decode(art: Artifact, repeats: int) -> dict:
    """Greedy weights of every compressed tensor of the file: the batched decoder (``Artifact.weights``)
    against decoding the tensors one by one, side by side in this process. Three batched figures:
    new tensors dropped after each call (the allocator hands back the same warm pages), new tensors kept
    (every page is touched for the first time, as in a one-off load), and written into existing tensors
    (what ``load`` does with the skeleton's weights)."""
    weights = sum(math.prod(r["shape"]) for r in art.records)
    kept: list[dict] = []
    targets = {r["layers"][0]: torch.zeros(r["shape"], dtype=FLOAT_DTYPES[r["dtype"]]) for r in art.records}
    batched_s = best_seconds(art.weights, repeats, warmup=True)
    kept_s = best_seconds(lambda: kept.append(art.weights()), repeats, warmup=True)
    into_s = best_seconds(lambda: art.weights(into=targets), repeats, warmup=True)
    one_by_one_s = best_seconds(
        lambda: [decode_weight(r["layers"][0], r, art.blobs[r["layers"][0]]) for r in art.records],
        repeats,
        warmup=True,
    )
    return {
        "model_weights": weights,
        "model_decode_weights_per_s": weights / batched_s,  # all tensors, batched, new tensors dropped
        "model_decode_kept_weights_per_s": weights / kept_s,  # new tensors kept: first-touch page faults
        "model_decode_into_weights_per_s": weights / into_s,  # into existing tensors (load's path)
        "model_decode_one_by_one_weights_per_s": weights / one_by_one_s,
        "model_decode_speedup": one_by_one_s / batched_s,
    }


def trained_files(paths: list[Path], repeats: int) -> list[dict]:
    """Whole-model greedy decode of artifacts written by training runs (e.g. sqs-bench's Table 1 files)."""
    rows = []
    for path in paths:
        art = read_artifact(path)
        rows.append({"file": path.name, "format_version": art.header["format_version"]} | model_decode(art, repeats))
    return rows


def machine() -> dict:
    """_timing.machine_info and the 1-minute load average at the start: the 2 cores are shared with other jobs."""
    return {**machine_info(), "load_average_1min_at_start": os.getloadavg()[0]}


def print_table(rows: list[dict]) -> None:
    print(
        f"{'case':<10} {'alts':<5} {'file B':>11} {'compr. B':>11} {'paper B':>11} {'+mask B':>11} "
        f"{'/paper':>7} {'/+mask':>7} {'bits/w':>7} {'save s':>7} {'load s':>7}"
    )
    for row in rows:
        for key in ("greedy_only", "with_alternatives"):
            r = row[key]
            print(
                f"{row['case']:<10} {'yes' if key == 'with_alternatives' else 'no':<5} {r['file_bytes']:>11,} "
                f"{r['compressed_bytes']:>11,} {r['paper_bytes']:>11,.0f} {r['paper_plus_mask_bytes']:>11,.0f} "
                f"{r['compressed_over_paper']:>7.3f} {r['compressed_over_paper_plus_mask']:>7.3f} "
                f"{r['effective_bits_per_weight']:>7.3f} {r['save_s']:>7.2f} {r['load_s']:>7.2f}"
            )
        print(
            f"{'':<10} dequantization: gather {row['gather_weights_per_s']:.3e} weights/s "
            f"(target {TARGET_WEIGHTS_PER_S:.0e}), mask decode {row['mask_decode_weights_per_s']:.3e}/s, "
            f"full greedy decode {row['decode_weights_per_s']:.3e} weights/s; "
            f"read+verify {row['read_and_verify_s']:.3f} s, posteriors {row['discrete_posteriors_s']:.1f} s, "
            f"encode {row['encode_s']:.2f} s"
        )
        print(f"{'':<10} whole model: {_model_line(row)}")
        bound = row["entropy_bound"]
        print(
            f"{'':<10} i.i.d. entropy bound: {bound['index_entropy_bits_per_kept_weight']:.3f} bits per kept "
            f"weight's code, bound / (paper + mask) {bound['bound_over_paper_plus_mask']:.3f}"
        )


def _model_line(row: dict) -> str:
    return (
        f"{row['model_weights']:,} weights, batched {row['model_decode_weights_per_s']:.3e}/s "
        f"(outputs kept {row['model_decode_kept_weights_per_s']:.3e}/s, into the model's tensors "
        f"{row['model_decode_into_weights_per_s']:.3e}/s), one by one "
        f"{row['model_decode_one_by_one_weights_per_s']:.3e}/s ({row['model_decode_speedup']:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--trained", type=Path, nargs="*", default=[], help="artifact files to decode whole")
    args = parser.parse_args()
    missing = [str(p) for p in args.trained if not p.is_file()]
    if missing:
        parser.error(f"--trained: no such file(s) {missing}; nox -s bench writes them under runs/cifar10/artifacts")
    info = machine()
    rows = [measure(f"linear{args.size}", *linear_case(args.size), args.repeats)]
    rows.append(measure("resnet20-random", *resnet20_case(), args.repeats))
    rows.append(measure("resnet20-random-no-windows", *resnet20_case("none"), args.repeats))
    result = {
        "machine": info,
        "targets": {
            "compressed_over_paper_plus_mask": TARGET_OVER_FORMULA_PLUS_MASK,
            "weights_per_s": TARGET_WEIGHTS_PER_S,
        },
        "cases": rows,
        "trained_files": trained_files(args.trained, args.repeats),
    }
    print_table(rows)
    for row in result["trained_files"]:
        print(f"{row['file']}: {_model_line(row)}")
    print(json.dumps(result["machine"]))
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
