"""``run --resume``: continue an interrupted suite. A run whose result JSON in ``--out`` was written for the same
tier, schema and configuration is kept (its result read back); a run without one is run (an artifact an
interrupted run left is replaced); a result of another tier or configuration, or one that cannot be read, is
refused before any compute, since keeping it would mix two experiments in one table. So is a result computed on
other data or another checkpoint (:func:`check_inputs`: the sha256 fingerprints each result records); a result
written before those were recorded is kept, with an INFO log saying it could not be compared."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqs_bench.results import OutputFolderError

__all__ = ["INPUT_FIELDS", "check_inputs", "recorded_config", "split_done"]

logger = logging.getLogger(__name__)

_NOT_RECORDED = ("paper", "report", "meta")
INPUT_FIELDS = ("data", "checkpoint")
"""The fields of a result recording what it was computed on, each compared by its ``sha256``."""


def recorded_config(config: dict) -> dict[str, Any]:
    """The run's configuration as its result JSON records it (the paper's figures and report hints left out)."""
    return {k: v for k, v in config.items() if k not in _NOT_RECORDED}


def _mismatch(saved: Any, config: dict, schema: int) -> str | None:
    """Why the result ``saved`` is not this run's, or None when it is."""
    if not isinstance(saved, dict):
        return "not a result object"
    if saved.get("schema") != schema:
        return f"schema {saved.get('schema')!r}, this version writes {schema}"
    if saved.get("tier") != config["tier"]:
        return f"tier {saved.get('tier')!r}, this run's is {config['tier']!r}"
    want = json.loads(json.dumps(recorded_config(config)))  # tuples as lists, as the file holds them
    got = saved.get("config")
    if got != want:
        got = got if isinstance(got, dict) else {}
        keys = sorted(k for k in set(want) | set(got) if got.get(k) != want.get(k))
        return f"another configuration (differs in {', '.join(keys)})"
    return None


def split_done(configs: list[dict], out_dir: Path, *, schema: int) -> tuple[list[dict], list[dict]]:
    """(results kept, configs to run) for ``--resume``; an OutputFolderError naming every result in ``out_dir``
    that is not its run's."""
    kept, todo, refused = [], [], []
    for config in configs:
        path = out_dir / f"{config['run_id']}.json"
        if not path.exists():
            todo.append(config)
            continue
        try:
            saved = json.loads(path.read_text())
            reason = _mismatch(saved, config, schema)
        except (OSError, ValueError) as err:
            saved, reason = None, f"unreadable: {err}"
        if reason is None:
            kept.append(saved)
        else:
            refused.append(f"{path.name} ({reason})")
    _refuse(refused, f"--resume keeps only results of these runs as configured now, but {out_dir} holds")
    logger.info("--resume: %d of %d runs kept from %s, %d to run", len(kept), len(configs), out_dir, len(todo))
    return kept, todo


def check_inputs(kept: list[dict], configs: list[dict], inputs: Callable[[dict], dict[str, dict]]) -> None:
    """Refuse, naming them, kept results whose recorded data or checkpoint fingerprint differs from what the run
    would use now (``inputs(config)``, computed only for results that record one)."""
    by_id = {config["run_id"]: config for config in configs}
    refused = []
    for saved in kept:
        recorded = [field for field in INPUT_FIELDS if isinstance(saved.get(field), dict)]
        if len(recorded) < len(INPUT_FIELDS):
            logger.info(
                "--resume: %s records no %s fingerprint (written before they were recorded); kept uncompared",
                saved["run_id"],
                " or ".join(f for f in INPUT_FIELDS if f not in recorded),
            )
        now = inputs(by_id[saved["run_id"]]) if recorded else {}
        for field in recorded:
            if saved[field].get("sha256") != now[field]["sha256"]:
                where = f" ({now[field]['path']})" if "path" in now[field] else ""
                refused.append(f"{saved['run_id']}.json (computed on other {field} than this run's{where})")
    _refuse(refused, "--resume keeps only results computed on the data and checkpoints found now, but")


def _refuse(refused: list[str], lead: str) -> None:
    """An OutputFolderError ``lead`` + the first three of ``refused`` (and how many more), if any."""
    if refused:
        shown = "; ".join(refused[:3]) + (f"; and {len(refused) - 3} more" if len(refused) > 3 else "")
        raise OutputFolderError(f"{lead} {shown}: pass --overwrite to replace them, or choose another --out")
