"""Result files on disk: checked output folders, atomic writes, and validated loading of result JSON.

A result file is the JSON ``runner.run_config`` writes; :func:`load_result_files` reads every one under a
folder and checks the keys and types the report uses (numbers finite), naming the file and the key of any
problem. JSON files that are not results (the report's own summaries) are skipped.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqs_core import files

__all__ = [
    "OutputFolderError",
    "ResultFileError",
    "is_result_file",
    "load_result_files",
    "out_dir_path",
    "prepare_out_dir",
    "validate_result",
    "write_atomic",
]

logger = logging.getLogger(__name__)


class OutputFolderError(ValueError):
    """An output folder cannot be created or written, or would silently replace results."""


class ResultFileError(ValueError):
    """A result file is unreadable or not shaped like a result; the message names the file and the key."""


def out_dir_path(path: str | Path) -> Path:
    """``path`` as a Path, refused if something other than a folder is there or if it is missing and its
    nearest existing parent is a file or not writable; nothing is created (prepare_out_dir does that)."""
    if not str(path).strip():
        raise OutputFolderError(f"output folder must be a path, got {str(path)!r} (it would write into the cwd)")
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise OutputFolderError(f"output folder {out} is not a folder (it is a file)")
    if not out.exists():
        parent = next(p for p in out.absolute().parents if p.exists())
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            why = "is a file" if not parent.is_dir() else "is not writable"
            raise OutputFolderError(f"output folder {out} cannot be created or written: {parent} {why}")
    return out


def prepare_out_dir(path: str | Path) -> Path:
    """Create ``path`` (with parents) if needed and check that a file can be written in it."""
    out = out_dir_path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out, prefix=".write_test_"):
            pass
    except OSError as err:
        raise OutputFolderError(f"output folder {out} cannot be created or written: {err.strerror or err}") from err
    return out


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) whole or not at all, by sqs-core's writer (:func:`sqs_core.files.write_atomic`:
    a temporary file beside ``path``, fsync, rename; a new file gets 0o666 less the umask, as ``Path.write_text``
    makes it). A path that cannot be written, a folder or a FIFO there included, is an OutputFolderError."""
    try:
        files.write_atomic(path, data)
    except (OSError, ValueError) as err:
        raise OutputFolderError(f"could not write {path}: {getattr(err, 'strerror', None) or err}") from err


def is_finite_number(value: Any) -> bool:
    """A finite int or float, not a bool (JSON results, recipe values)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_integer(value: Any) -> bool:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _interval(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(map(is_finite_number, value)) and value[0] <= value[1]


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


_Check = tuple[str, Callable[[Any], bool]]
_NUMBER: _Check = ("a finite number", is_finite_number)
_OPT_NUMBER: _Check = ("a finite number or null", _optional(is_finite_number))
_INT: _Check = ("an integer", is_integer)
_OPT_INT: _Check = ("an integer or null", _optional(is_integer))
_STR: _Check = ("a string", lambda v: isinstance(v, str))
_OPT_STR: _Check = ("a string or null", lambda v: v is None or isinstance(v, str))
_OBJECT: _Check = ("an object", lambda v: isinstance(v, dict))
_LIST: _Check = ("a non-empty list", lambda v: isinstance(v, list) and len(v) > 0)
_INTERVAL: _Check = ("a [low, high] pair of finite numbers with low <= high", _interval)

_RESULT = {
    "run_id": _STR, "recipe": _STR, "tier": _STR, "label": _STR, "git_commit": _OPT_STR, "wall_time_s": _NUMBER,
    "meta": _OBJECT, "paper": _OBJECT, "report": _OBJECT, "config": _OBJECT, "machine": _OBJECT,
    "metrics": _OBJECT, "evaluations": _LIST,
}  # fmt: skip
_MACHINE = {"platform": _STR, "cpu_count": _OPT_INT, "torch": _STR}
_METRICS = {
    "model": _STR, "method": _STR, "bits": _NUMBER, "nonzero": _NUMBER, "compression_rate_paper": _NUMBER,
    "compression_rate_file": _OPT_NUMBER, "fp32_acc": _NUMBER, "acc": _NUMBER, "drop": _NUMBER,
    "drop_ci": _INTERVAL, "inference": _STR, "val_acc": _OPT_NUMBER, "test_images": _INT,
}  # fmt: skip
_EVALUATION = {
    "name": _STR, "inference": _STR, "samples": _OPT_INT, "acc": _NUMBER, "drop": _NUMBER,
    "drop_ci": _INTERVAL, "val_acc": _OPT_NUMBER,
}  # fmt: skip
# the keys of the paper's rows a report kind plots (the other kinds only print the rows)
_PLOTTED_PAPER_KEYS = {
    "table1": {"method": _STR, "compression_rate": _NUMBER, "drop": _NUMBER},
    "samples": {"samples": _NUMBER, "drop": _NUMBER},
}
# a JSON object with any of these keys is taken for a result (and checked); others are not results
_RESULT_MARKERS = ("run_id", "metrics", "evaluations", "schema")


def _check(path: Path, node: dict, spec: dict[str, _Check], where: str) -> None:
    for key, (expected, ok) in spec.items():
        field = f"{where}{key}"
        if key not in node:
            raise ResultFileError(f"result file {path}: missing key {field!r}")
        if not ok(node[key]):
            raise ResultFileError(f"result file {path}: {field!r} must be {expected}, got {node[key]!r}")


def validate_result(result: dict, path: Path) -> None:
    """Raise :class:`ResultFileError` naming ``path`` and the key if ``result`` lacks what the report reads."""
    _check(path, result, _RESULT, "")
    _check(path, result["machine"], _MACHINE, "machine.")
    _check(path, result["metrics"], _METRICS, "metrics.")
    for i, evaluation in enumerate(result["evaluations"]):
        if not isinstance(evaluation, dict):
            raise ResultFileError(f"result file {path}: 'evaluations[{i}]' must be an object, got {evaluation!r}")
        _check(path, evaluation, _EVALUATION, f"evaluations[{i}].")
    names = [e["name"] for e in result["evaluations"]]
    if result["metrics"]["inference"] not in names:
        raise ResultFileError(
            f"result file {path}: 'metrics.inference' = {result['metrics']['inference']!r} names none of "
            f"the evaluations {names}"
        )
    sqs = result["config"].get("sqs", {})
    if not isinstance(sqs, dict) or not isinstance(sqs.get("prior", {}), dict):
        raise ResultFileError(f"result file {path}: 'config.sqs' and 'config.sqs.prior' must be objects")
    reported = result["paper"].get("rows", [])
    if not isinstance(reported, list) or not all(isinstance(row, dict) for row in reported):
        raise ResultFileError(f"result file {path}: 'paper.rows' must be a list of objects")
    plotted = _PLOTTED_PAPER_KEYS.get(result["report"].get("kind"), {})
    for i, row in enumerate(reported):
        _check(path, row, plotted, f"paper.rows[{i}].")


def is_result_file(path: Path) -> bool:
    """Whether ``path`` holds a JSON object that :func:`load_result_files` would take for a result."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and any(key in data for key in _RESULT_MARKERS)


def _read(path: Path) -> dict | None:
    """The result in ``path``, validated; None for a JSON file that is not a result."""
    try:
        data = json.loads(path.read_text())  # NaN is read here and refused by validate_result
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ResultFileError(f"result file {path} is not readable JSON ({err}); re-run it or remove it") from err
    if not isinstance(data, dict) or not any(key in data for key in _RESULT_MARKERS):
        logger.info("skipping %s: not a result file", path)
        return None
    validate_result(data, path)
    return data


def _check_one_tier_one_result_per_run(found: list[tuple[Path, dict]], results_dir: Path) -> None:
    by_tier: dict[str, list[Path]] = {}
    for path, result in found:
        by_tier.setdefault(result["tier"], []).append(path)
    if len(by_tier) > 1:
        tiers = "; ".join(f"{tier}: {', '.join(map(str, paths[:2]))}" for tier, paths in sorted(by_tier.items()))
        raise ResultFileError(
            f"results of more than one tier under {results_dir} ({tiers}); a report compares one tier: "
            "point --results at one tier's folder"
        )
    seen: dict[tuple, Path] = {}
    for path, result in found:
        m = result["metrics"]
        key = (result["recipe"], m["model"], m["method"], result["label"])
        if key in seen:
            raise ResultFileError(
                f"two results of the same run (recipe {key[0]}, model {key[1]}, method {key[2]}, label {key[3]}): "
                f"{seen[key]} and {path}; remove one of them"
            )
        seen[key] = path


def _test_set(result: dict) -> dict[str, Any]:
    """What must agree between results of one recipe on one model: test count, fp32 accuracy, test labels."""
    labels = result.get("predictions", {}).get("labels") if isinstance(result.get("predictions"), dict) else None
    data = result["data"] if isinstance(result.get("data"), dict) else {}
    return {
        "metrics.test_images": result["metrics"]["test_images"],
        "metrics.fp32_acc": result["metrics"]["fp32_acc"],
        "predictions.labels": labels,
        "data.test_labels_sha256": data.get("test_labels_sha256"),
    }


def _check_one_test_set_per_model(found: list[tuple[Path, dict]]) -> None:
    """Refuse a recipe whose results on one model were scored on different test sets (another data folder or
    checkpoint, e.g. mixed in by ``--resume``): its table would compare drops measured against different
    things. Fields a result lacks (older results record no data fingerprint) are not compared."""
    first: dict[tuple[str, str], tuple[Path, dict]] = {}
    for path, result in found:
        key, now = (result["recipe"], result["metrics"]["model"]), _test_set(result)
        if key not in first:
            first[key] = (path, now)
            continue
        other_path, other = first[key]
        for field, value in now.items():
            if value is not None and other[field] is not None and value != other[field]:
                shown = "differ" if field == "predictions.labels" else f"{other[field]!r} vs {value!r}"
                raise ResultFileError(
                    f"results of recipe {key[0]!r} on {key[1]} disagree on {field} ({shown}): {other_path} and "
                    f"{path} were computed on different data or checkpoints; re-run one of them"
                )


def load_result_files(results_dir: str | Path) -> list[dict[str, Any]]:
    """Every result JSON under ``results_dir`` (recursively), validated, of one tier, sorted by run id."""
    folder = Path(results_dir).expanduser()
    if not folder.is_dir():
        state = "is not a folder" if folder.exists() else "does not exist"
        raise FileNotFoundError(f"results folder {folder} {state}")
    found = [(p, r) for p in sorted(folder.rglob("*.json")) if (r := _read(p)) is not None]
    if not found:
        raise FileNotFoundError(f"no result JSON files under {folder}")
    _check_one_tier_one_result_per_run(found, folder)
    _check_one_test_set_per_model(found)
    return sorted((r for _, r in found), key=lambda r: r["run_id"])
