"""Run a suite of recipes for a tier and write one result JSON per run.

Each result holds the full run config, the seed, the git commit (``git rev-parse HEAD`` or null), a machine
description, the wall time, the method's record, what it was computed on (``data``: split sizes and sha256
fingerprints, :func:`sqs_bench.data.fingerprint`; ``checkpoint``: path and sha256), and ``metrics``: model,
method, bits, nonzero, compression_rate_paper, compression_rate_file (null without an artifact), fp32_acc, acc,
drop (points) and drop_ci (paired bootstrap 95% interval), all on the same test images; validation accuracies
(a split of the training images) are recorded beside them for model selection. ``evaluations`` lists every
inference mode of the run (SQS: greedy and Bayesian averaging for each M), ``predictions`` the raw test
predictions.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sqs_bench import baselines
from sqs_bench.config import expand_recipe, load_recipe, load_suite, suite_labels
from sqs_bench.data import (
    CIFAR10_URL,
    FULL_SIZES,
    NUM_CLASSES,
    CifarSplits,
    DataNotFoundError,
    fingerprint,
    load_splits,
)
from sqs_bench.models import checkpoint_file, file_sha256, load_model, load_pretrained, require_timm
from sqs_bench.preflight import budget_of, check_run_values, check_unique_run_ids
from sqs_bench.results import OutputFolderError, out_dir_path, prepare_out_dir, write_atomic
from sqs_bench.resume import check_inputs, recorded_config, split_done
from sqs_bench.stats import accuracy, paired_bootstrap_drop_ci
from sqs_bench.train import predict

__all__ = ["SCHEMA_VERSION", "check_outputs", "git_commit", "machine", "run_config", "run_suite", "suite_configs"]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_BASELINES: dict[str, tuple[Callable[..., tuple[nn.Module, dict]], tuple[str, ...]]] = {
    "magnitude_kmeans": (baselines.magnitude_kmeans, ("bits", "nonzero")),
    "uniform": (baselines.uniform, ("bits", "nonzero")),
    "dgms": (baselines.dgms, ("bits",)),
}
METHODS = ("sqs", *_BASELINES)


def git_commit() -> str | None:
    """``git rev-parse HEAD`` of the checkout holding this package, or None outside git."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine() -> dict[str, Any]:
    """Platform, CPU count, thread count and library versions of this process."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def suite_configs(suite: str, tier: str) -> list[dict[str, Any]]:
    """Every run configuration of ``suite`` for ``tier`` (only its ``labels``, when the suite names some)."""
    labels = suite_labels(suite)
    entries = [(name, config) for name in load_suite(suite) for config in expand_recipe(load_recipe(name), tier)]
    check_unique_run_ids(entries)
    return [c for _, c in entries if labels is None or c["label"] in labels]


def _data(config: dict, data_dir: str | Path | None, cache: dict) -> CifarSplits:
    """The (cached) splits of a run, checked for completeness when the tier requires the full dataset."""
    dataset = config.get("dataset", "cifar10")
    key = (dataset, config.get("val_fraction", 0.1), config.get("seed", 0))
    if key not in cache:
        cache[key] = load_splits(data_dir, val_fraction=key[1], seed=key[2], dataset=dataset)
    splits = cache[key]
    if config.get("requires_full_data"):
        found = (splits.train_x.shape[0] + splits.val_x.shape[0], splits.test_x.shape[0])
        if found != FULL_SIZES[dataset]:
            raise DataNotFoundError(
                f"tier {config['tier']!r} needs the complete {dataset} ({FULL_SIZES[dataset][0]:,} train / "
                f"{FULL_SIZES[dataset][1]:,} test images, from {CIFAR10_URL}); the data directory holds "
                f"{found[0]:,} / {found[1]:,}"
            )
    return splits.subset(val=config.get("val_images"), test=config.get("test_images"))


def _method_of(config: dict) -> tuple[Callable[..., Any], tuple[str, ...]]:
    """(the function a run calls, the keyword arguments the runner passes it itself)."""
    if config["method"] == "sqs":
        from sqs_bench.sqs_method import run_sqs

        return run_sqs, ("bits", "nonzero", "artifact", "sqs_config")
    return _BASELINES[config["method"]]


def check_requirements(configs: list[dict], data_dir: str | Path | None, cache: dict) -> None:
    """Fail before any compute if a run's method, values (:mod:`sqs_bench.preflight`), model library, data or
    checkpoint is missing or wrong; every run's values are checked before any data is read, and every run's
    checkpoint before the first run computes."""
    for config in configs:
        if config["method"] not in METHODS:
            raise ValueError(f"{config['run_id']}: unknown method {config['method']!r}; expected {METHODS}")
        check_run_values(config, *_method_of(config))
    for config in configs:
        if config["model"].startswith("timm:"):
            require_timm()
        _data(config, data_dir, cache)
        _checkpoint_record(config, data_dir, cache)


def _checkpoint_record(config: dict, data_dir: str | Path | None, cache: dict) -> dict[str, str]:
    """The path and sha256 of the run's checkpoint (a CIFAR ResNet's is loaded once here, to check it fits)."""
    path = checkpoint_file(config["model"], data_dir, checkpoint=_checkpoint(config))
    key = ("checkpoint", str(path))
    if key not in cache:
        if not config["model"].startswith("timm:"):
            load_pretrained(config["model"], data_dir)
        cache[key] = {"path": str(path), "sha256": file_sha256(path)}
    return cache[key]


def _inputs(config: dict, data_dir: str | Path | None, cache: dict) -> dict[str, dict]:
    """What the run computes on: the data fingerprint and the checkpoint record."""
    return {
        "data": fingerprint(_data(config, data_dir, cache)),
        "checkpoint": _checkpoint_record(config, data_dir, cache),
    }


def _outputs(config: dict, out_dir: Path) -> list[Path]:
    """The files a run writes: its result JSON and, for SQS, its artifact."""
    paths = [out_dir / f"{config['run_id']}.json"]
    if config["method"] == "sqs":
        paths.append(out_dir / "artifacts" / f"{config['run_id']}.sqs")
    return paths


def _tier_of(path: Path) -> str:
    try:
        tier = json.loads(path.read_text()).get("tier", "?") if path.suffix == ".json" else None
    except (OSError, ValueError, AttributeError):
        tier = "unreadable"
    return "" if tier is None else f" (tier {tier})"


def check_outputs(configs: list[dict], out_dir: Path, *, overwrite: bool) -> None:
    """Refuse, before any compute, to replace existing outputs of these runs unless ``overwrite``; the run id
    does not hold the tier, so a ``cpu`` run would replace the ``smoke`` result of the same run."""
    existing = [p for config in configs for p in _outputs(config, out_dir) if p.exists()]
    if existing and not overwrite:
        shown = ", ".join(f"{p.name}{_tier_of(p)}" for p in existing[:3])
        more = f" and {len(existing) - 3} more" if len(existing) > 3 else ""
        raise OutputFolderError(
            f"{out_dir} already holds output(s) of these runs: {shown}{more}; pass --overwrite to replace "
            "them, or choose another --out (e.g. one folder per tier)"
        )


def _checkpoint(config: dict) -> str | None:
    """``checkpoint_pattern`` with ``{arch}`` filled in (timm models of the paper tier), else None."""
    pattern = config.get("checkpoint_pattern")
    return pattern.format(arch=config["model"].removeprefix("timm:")) if pattern else None


def _run_method(config: dict, model: nn.Module, data: CifarSplits, out_dir: Path) -> tuple[dict, list[dict]]:
    """(record, evaluations with val/test predictions) of the run's method."""
    budget, options = budget_of(config), dict(config.get("options", {}))
    if config["method"] == "sqs":
        from sqs_bench.sqs_method import run_sqs

        artifact = out_dir / "artifacts" / f"{config['run_id']}.sqs"
        return run_sqs(
            model,
            data,
            budget,
            bits=config["bits"],
            nonzero=config["nonzero"],
            artifact=artifact,
            sqs_config=config.get("sqs", {}),
            **options,
        )
    function, keys = _BASELINES[config["method"]]
    compressed, record = function(model, data, budget, **{k: config[k] for k in keys}, **options)
    evaluation = {
        "name": "hard",
        "inference": "hard",
        "samples": None,
        "val_preds": predict(compressed, data.val_x),
        "test_preds": predict(compressed, data.test_x),
    }
    return record, [evaluation]


def _score(evaluations: list[dict], fp32: dict, data: CifarSplits, config: dict) -> list[dict]:
    """Accuracy, drop and its paired bootstrap interval of each evaluation (predictions stay out)."""
    scored = []
    for ev in evaluations:
        acc = accuracy(ev["test_preds"], data.test_y)
        ci = paired_bootstrap_drop_ci(
            data.test_y,
            fp32["test"],
            ev["test_preds"],
            resamples=config.get("bootstrap_resamples", 2000),
            seed=config.get("seed", 0),
        )
        scored.append(
            {
                "name": ev["name"],
                "inference": ev["inference"],
                "samples": ev["samples"],
                "acc": acc,
                "drop": fp32["acc"] - acc,
                "drop_ci": list(ci),
                "val_acc": accuracy(ev["val_preds"], data.val_y) if len(data.val_y) else None,
            }
        )
    return scored


def _fp32(config: dict, model: nn.Module, data: CifarSplits, cache: dict) -> dict:
    key = (
        "fp32",
        config["model"],
        config.get("dataset"),
        config.get("val_fraction"),
        config.get("seed"),
        len(data.test_y),
        len(data.val_y),
    )
    if key not in cache:
        val, test = predict(model, data.val_x), predict(model, data.test_x)
        cache[key] = {
            "test": test,
            "acc": accuracy(test, data.test_y),
            "val_acc": accuracy(val, data.val_y) if len(data.val_y) else None,
        }
    return cache[key]


def _metrics(config: dict, record: dict, fp32: dict, primary: dict, n_test: int) -> dict:
    return {
        "model": config["model"],
        "method": config["method"],
        "bits": record["bits"],
        "nonzero": record["nonzero"],
        "compression_rate_paper": record["compression_rate_paper"],
        "compression_rate_file": record.get("compression_rate_file"),
        "fp32_acc": fp32["acc"],
        "acc": primary["acc"],
        "drop": primary["drop"],
        "drop_ci": primary["drop_ci"],
        "inference": primary["name"],
        "val_acc": primary["val_acc"],
        "fp32_val_acc": fp32["val_acc"],
        "test_images": n_test,
    }


def _commit(cache: dict) -> str | None:
    # the commit of the code this process runs: read once per suite, before its first training, so a
    # commit made while a long suite runs is not recorded for results computed with the code loaded earlier
    if "git_commit" not in cache:
        cache["git_commit"] = git_commit()
    return cache["git_commit"]


def run_config(
    config: dict, data_dir: str | Path | None, out_dir: Path, cache: dict | None = None, *, overwrite: bool = False
) -> dict:
    """Run one configuration, write ``<out_dir>/<run_id>.json`` (atomically) and return the result.

    Existing outputs of the run are replaced only with ``overwrite`` (logged as a warning), else
    :class:`~sqs_bench.results.OutputFolderError` is raised before any compute."""
    cache = {} if cache is None else cache
    out_dir = prepare_out_dir(out_dir)
    check_outputs([config], out_dir, overwrite=overwrite)
    commit = _commit(cache)
    torch.manual_seed(config.get("seed", 0))
    data = _data(config, data_dir, cache)
    inputs = _inputs(config, data_dir, cache)
    num_classes = NUM_CLASSES[config.get("dataset", "cifar10")]
    model = load_model(config["model"], data_dir, checkpoint=_checkpoint(config), num_classes=num_classes)
    fp32 = _fp32(config, model, data, cache)
    start = time.perf_counter()
    record, evaluations = _run_method(config, model, data, out_dir)
    wall = time.perf_counter() - start
    scored = _score(evaluations, fp32, data, config)
    primary = next(s for s in scored if s["name"] == record.get("primary", scored[0]["name"]))
    result = {
        "schema": SCHEMA_VERSION,
        "run_id": config["run_id"],
        "recipe": config["recipe"],
        "tier": config["tier"],
        "label": config["label"],
        "meta": config["meta"],
        "seed": config.get("seed", 0),
        "git_commit": commit,
        "machine": machine(),
        "wall_time_s": wall,
        **inputs,
        "metrics": _metrics(config, record, fp32, primary, len(data.test_y)),
        "evaluations": scored,
        "record": record,
        "paper": config["paper"],
        "report": config["report"],
        "config": recorded_config(config),
    }
    predictions = {
        "labels": data.test_y.tolist(),
        "fp32": fp32["test"].tolist(),
        **{ev["name"]: ev["test_preds"].tolist() for ev in evaluations},
    }
    _write_result(result, predictions, out_dir / f"{config['run_id']}.json")
    result["predictions"] = predictions
    logger.info("%s: acc %.2f (fp32 %.2f) in %.1fs", config["run_id"], primary["acc"], fp32["acc"], wall)
    return result


def _write_result(result: dict, predictions: dict, path: Path) -> None:
    if path.exists():
        logger.warning("replacing %s%s (--overwrite)", path, _tier_of(path))
    # predictions on one line each, the rest indented: readable and still small
    text = json.dumps(result, indent=1)[:-2] + ',\n "predictions": ' + json.dumps(predictions) + "\n}\n"
    write_atomic(path, text)


def run_suite(
    suite: str,
    tier: str,
    data_dir: str | Path | None,
    out_dir: str | Path,
    *,
    on_result: Callable[[dict], None] | None = None,
    only: Callable[[dict], bool] | None = None,
    overwrite: bool = False,
    resume: bool = False,
) -> list[dict]:
    """Run every configuration of ``suite`` × ``tier`` (optionally filtered by ``only``); returns the results
    in suite order, those ``resume`` kept marked ``"resumed": True``.

    Before any compute: existing outputs of these runs are refused unless ``overwrite`` (or, with ``resume``,
    kept where they are this tier's and configuration's: :mod:`sqs_bench.resume`), every run's method,
    model library and data are checked, and only then is the output folder created and write-tested (a
    run refused for missing data leaves no empty folder behind)."""
    if overwrite and resume:
        raise ValueError("--overwrite and --resume exclude each other (replace every result, or keep them)")
    configs = [c for c in suite_configs(suite, tier) if only is None or only(c)]
    kept: list[dict] = []
    if resume:
        kept, todo = split_done(configs, out_dir_path(out_dir), schema=SCHEMA_VERSION)
    else:
        todo = configs
        check_outputs(configs, out_dir_path(out_dir), overwrite=overwrite)
    cache: dict = {}
    check_requirements(todo, data_dir, cache)
    check_inputs(kept, configs, lambda config: _inputs(config, data_dir, cache))
    out = prepare_out_dir(out_dir)
    done = {result["run_id"]: result | {"resumed": True} for result in kept}
    for config in todo:  # with resume, outputs left here are an interrupted run's artifact: replaced
        done[config["run_id"]] = run_config(config, data_dir, out, cache, overwrite=overwrite or resume)
        if on_result is not None:
            on_result(done[config["run_id"]])
    return [done[config["run_id"]] for config in configs]
