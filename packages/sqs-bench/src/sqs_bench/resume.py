"""``run --resume``: continue an interrupted suite. A run whose result JSON in ``--out`` was written for the same
tier, schema and configuration is kept (its result read back); a run without one is run (an artifact an
interrupted run left is replaced); a result of another tier or configuration, or one that cannot be read, is
refused before any compute, since keeping it would mix two experiments in one table."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from sqs_bench.results import OutputFolderError

__all__ = ["recorded_config", "split_done"]

logger = logging.getLogger(__name__)

_NOT_RECORDED = ("paper", "report", "meta")


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
    if refused:
        shown = "; ".join(refused[:3]) + (f"; and {len(refused) - 3} more" if len(refused) > 3 else "")
        raise OutputFolderError(
            f"--resume keeps only results of these runs as configured now, but {out_dir} holds {shown}: pass "
            "--overwrite to replace them, or choose another --out"
        )
    logger.info("--resume: %d of %d runs kept from %s, %d to run", len(kept), len(configs), out_dir, len(todo))
    return kept, todo
