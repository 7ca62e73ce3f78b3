"""Recipes and suites: TOML files under ``recipes/`` turned into flat run configurations.

A recipe file has top-level metadata (``name``, ``title``, ``paper_table``, ``substitute``), a ``[defaults]``
table, a list of ``[[runs]]`` (each may carry a ``grid`` of dotted keys → lists, expanded as a cartesian
product), the paper's own numbers under ``[paper]`` (printed beside ours, never as ours), a ``[report]``
spec for tables/plots, and per-tier overrides under ``[tiers.<tier>]``. ``recipes/tiers.toml`` holds the
overrides every recipe gets for a tier (the smoke tier's few batches and few test images);
``recipes/suites.toml`` lists the recipes of each suite.

Run config = defaults ⊕ run ⊕ grid point ⊕ tiers.toml[tier] ⊕ recipe.tiers[tier] (nested tables merge);
a ``model_map`` table in a tier then renames models (the paper tier maps substitutes to the paper's models),
and a ``method_options`` table (method → options) overrides the options of that method only.
"""

from __future__ import annotations

import copy
import itertools
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["TIERS", "expand_recipe", "list_recipes", "load_recipe", "load_suite", "merge", "suite_labels"]

TIERS = ("smoke", "cpu", "paper")
_RECIPES = "recipes"
_RUN_KEYS_REQUIRED = ("model", "method", "bits")


def _recipe_dir() -> Path:
    return Path(str(resources.files("sqs_bench") / _RECIPES))


def _read_toml(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def list_recipes() -> list[str]:
    """Names of the recipes shipped with the package."""
    skip = {"tiers", "suites"}
    return sorted(p.stem for p in _recipe_dir().glob("*.toml") if p.stem not in skip)


def load_recipe(name_or_path: str | Path) -> dict[str, Any]:
    """A shipped recipe by name, or any recipe TOML file by path."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = _recipe_dir() / f"{name_or_path}.toml"
    if not path.is_file():
        raise FileNotFoundError(f"no recipe {name_or_path!r} (looked for {path}); shipped: {list_recipes()}")
    recipe = _read_toml(path)
    recipe.setdefault("name", path.stem)
    return recipe


def load_suite(name: str) -> list[str]:
    """The recipe names of a suite from ``recipes/suites.toml``."""
    return list(_suite(name)["recipes"])


def suite_labels(name: str) -> list[str] | None:
    """The run labels a suite keeps (``labels`` in ``recipes/suites.toml``), or None for all."""
    labels = _suite(name).get("labels")
    return None if labels is None else list(labels)


def _suite(name: str) -> dict[str, Any]:
    suites = _read_toml(_recipe_dir() / "suites.toml")
    if name not in suites:
        raise ValueError(f"unknown suite {name!r}; expected one of {sorted(suites)}")
    return suites[name]


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursive merge: tables merge key by key, everything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _set_dotted(config: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = config
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def _grid_points(grid: dict[str, list]) -> list[dict[str, Any]]:
    keys = list(grid)
    for key in keys:
        if not isinstance(grid[key], list) or not grid[key]:
            raise ValueError(f"grid entry {key!r} must be a non-empty list, got {grid[key]!r}")
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def _label(run: dict[str, Any], point: dict[str, Any], method: str) -> str:
    parts = [run.get("label", method)]
    # the model is part of the run id already; a grid over models keeps the labels of a one-model recipe
    parts += [f"{key.split('.')[-1]}={value}" for key, value in point.items() if key != "model"]
    return "_".join(str(p) for p in parts)


def expand_recipe(recipe: dict[str, Any], tier: str) -> list[dict[str, Any]]:
    """Flat run configurations of ``recipe`` for ``tier`` (one per run × grid point)."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; expected one of {TIERS}")
    tier_defaults = _read_toml(_recipe_dir() / "tiers.toml").get(tier, {})
    tier_recipe = recipe.get("tiers", {}).get(tier, {})
    meta = {k: recipe.get(k, "") for k in ("name", "title", "paper_table", "substitute")}
    configs: dict[str, dict[str, Any]] = {}  # by run id, in recipe order
    for run in recipe.get("runs", []):
        run = dict(run)
        grid = run.pop("grid", {})
        for point in _grid_points(grid) if grid else [{}]:
            config = merge(recipe.get("defaults", {}), run)
            for dotted, value in point.items():
                _set_dotted(config, dotted, value)
            config = merge(merge(config, tier_defaults), tier_recipe)
            # a tier may override the options of one method only, e.g. method_options = { sqs = {...} }
            per_method = config.pop("method_options", {}).get(config.get("method"), {})
            if per_method:
                config["options"] = merge(config.get("options", {}), per_method)
            # a tier may swap the substitute models for the paper's (e.g. resnet56 -> timm:resnet18)
            model_map = config.pop("model_map", {})
            if "model" in config:
                config["model"] = model_map.get(config["model"], config["model"])
            missing = [k for k in _RUN_KEYS_REQUIRED if k not in config]
            if missing:
                raise ValueError(f"recipe {meta['name']!r}: run {run} lacks {missing}")
            config.update(recipe=meta["name"], tier=tier, label=_label(run, point, config["method"]))
            config["run_id"] = f"{meta['name']}__{config['model']}__{config['label']}".replace("=", "-")
            config["meta"] = meta
            config["paper"] = recipe.get("paper", {})
            config["report"] = recipe.get("report", {})
            # a tier that maps two substitutes onto one paper model (model_map) runs that model once
            configs.setdefault(config["run_id"], config)
    return list(configs.values())
