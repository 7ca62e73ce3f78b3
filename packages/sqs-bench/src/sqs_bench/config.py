"""Recipes and suites: TOML files under ``recipes/`` turned into flat run configurations.

A recipe file has top-level metadata (``name``, ``title``, ``paper_table``, ``substitute``), a ``[defaults]``
table, a list of ``[[runs]]`` (each may carry a ``grid`` of dotted keys → lists, expanded as a cartesian
product), the paper's own numbers under ``[paper]`` (printed beside ours, never as ours), a ``[report]``
spec for tables/plots, and per-tier overrides under ``[tiers.<tier>]``. ``recipes/tiers.toml`` holds the
defaults every recipe gets for a tier (the smoke tier's few batches and few test images);
``recipes/suites.toml`` lists the recipes of each suite.

Run config = defaults ⊕ tiers.toml[tier] ⊕ run ⊕ grid point ⊕ recipe.tiers[tier] (nested tables merge): a
tier's shared defaults replace the recipe's ``[defaults]`` but never a value a run sets itself (a labelled
variant keeps its change at every tier), while the recipe's own ``[tiers.<tier>]`` table, written knowing its
runs, has the last word. A ``method_options`` table (method → options) of a tier sets the options of that
method only, at the same place in that order; a ``model_map`` table then renames models (the paper tier maps
substitutes to the paper's models). Two substitutes mapped onto one model run it once.

Every key is checked against the keys the runner reads (:data:`RUN_KEYS`; a misspelled ``epoch`` or
``distill_wieght`` was silently ignored), and a recipe whose runs share a run id, or whose differently
labelled runs expand to the same configuration, is refused, naming both runs.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import json
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "BUDGET_KEYS",
    "RUN_KEYS",
    "TIERS",
    "expand_recipe",
    "list_recipes",
    "load_recipe",
    "load_suite",
    "merge",
    "suite_labels",
]

TIERS = ("smoke", "cpu", "paper")
_RECIPES = "recipes"
_RUN_KEYS_REQUIRED = ("model", "method", "bits")
BUDGET_KEYS = ("epochs", "batch_size", "max_batches", "seed", "bn_images", "distill_weight", "distill_temperature")
RUN_KEYS = frozenset(
    {"model", "method", "bits", "nonzero", "dataset", "options", "sqs", "checkpoint_pattern", "requires_full_data"}
    | {"val_fraction", "val_images", "test_images", "bootstrap_resamples", *BUDGET_KEYS}
)
"""The keys a run, ``[defaults]`` or a tier may set (a run also ``label`` and ``grid``, a tier also
``model_map`` and ``method_options``)."""
_KEYS = {
    "run": RUN_KEYS | {"label", "grid"},
    "defaults": RUN_KEYS,
    "tier": RUN_KEYS | {"model_map", "method_options"},
}
_RECIPE_KEYS = frozenset({"name", "title", "paper_table", "substitute", "defaults", "runs", "report", "paper", "tiers"})


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


def _check_keys(table: Any, known: frozenset[str] | set[str], where: str) -> None:
    """A ValueError naming ``where`` and each key of ``table`` not in ``known`` (with the closest known one)."""
    if not isinstance(table, dict):
        raise ValueError(f"{where} must be a table, got {table!r}")
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(known))}"
            raise ValueError(f"{where}: unknown key {key!r}{hint}")


def _run_name(recipe_name: str, index: int, run: dict[str, Any]) -> str:
    what = run.get("label") or run.get("method")
    return f"recipe {recipe_name!r}, run {index + 1}" + (f" ({what})" if what else "")


def check_recipe_keys(recipe: dict[str, Any]) -> None:
    """Refuse a key the runner would ignore, at the top level, in ``[defaults]``, a run, a grid or a tier."""
    name = recipe.get("name", "?")
    _check_keys(recipe, _RECIPE_KEYS, f"recipe {name!r}")
    _check_keys(recipe.get("defaults", {}), _KEYS["defaults"], f"recipe {name!r}, [defaults]")
    _check_keys(recipe.get("tiers", {}), set(TIERS), f"recipe {name!r}, [tiers]")
    for tier, table in recipe.get("tiers", {}).items():
        _check_keys(table, _KEYS["tier"], f"recipe {name!r}, [tiers.{tier}]")
    runs = recipe.get("runs", [])
    if not isinstance(runs, list) or not runs:
        raise ValueError(f"recipe {name!r}: 'runs' must be a non-empty list of [[runs]] tables, got {runs!r}")
    for i, run in enumerate(runs):
        where = _run_name(name, i, run if isinstance(run, dict) else {})
        _check_keys(run, _KEYS["run"], where)
        grid = run.get("grid", {})
        if not isinstance(grid, dict):
            raise ValueError(f"{where}: 'grid' must be a table of dotted keys -> lists, got {grid!r}")
        _check_keys({key.split(".")[0]: None for key in grid}, RUN_KEYS, f"{where}, grid")


def _tier_tables(recipe: dict[str, Any], tier: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tiers.toml's table for ``tier``, the recipe's own), their keys checked."""
    shared = _read_toml(_recipe_dir() / "tiers.toml")
    _check_keys(shared, set(TIERS), "recipes/tiers.toml")
    _check_keys(shared.get(tier, {}), _KEYS["tier"], f"recipes/tiers.toml, [{tier}]")
    return shared.get(tier, {}), recipe.get("tiers", {}).get(tier, {})


def _with_method_options(config: dict[str, Any], tier_table: dict[str, Any], method: Any) -> dict[str, Any]:
    """``config`` ⊕ the tier's values, its ``method_options`` of ``method`` merged into ``options``."""
    plain = {k: v for k, v in tier_table.items() if k not in ("method_options", "model_map")}
    config = merge(config, plain)
    per_method = tier_table.get("method_options", {}).get(method, {})
    return merge(config, {"options": per_method}) if per_method else config


def _expand_run(
    defaults: dict[str, Any], tiers: tuple[dict[str, Any], dict[str, Any]], run: dict[str, Any], point: dict
) -> dict[str, Any]:
    """One run configuration: defaults ⊕ tiers.toml ⊕ run ⊕ grid point ⊕ the recipe's tier table."""
    shared, own = tiers
    explicit = merge(run, {})
    for dotted, value in point.items():
        _set_dotted(explicit, dotted, value)
    method = explicit.get("method", own.get("method", shared.get("method", defaults.get("method"))))
    config = _with_method_options(defaults, shared, method)
    config = _with_method_options(merge(config, explicit), own, method)
    # a tier may swap the substitute models for the paper's (e.g. resnet56 -> timm:resnet18)
    model_map = merge(shared.get("model_map", {}), own.get("model_map", {}))
    if "model" in config:
        config["model"] = model_map.get(config["model"], config["model"])
    return config


def expand_recipe(recipe: dict[str, Any], tier: str) -> list[dict[str, Any]]:
    """Flat run configurations of ``recipe`` for ``tier`` (one per run × grid point)."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; expected one of {TIERS}")
    check_recipe_keys(recipe)
    meta = {k: recipe.get(k, "") for k in ("name", "title", "paper_table", "substitute")}
    tiers = _tier_tables(recipe, tier)
    configs: dict[str, dict[str, Any]] = {}  # by run id, in recipe order
    origin: dict[str, tuple[str, Any]] = {}  # run id -> (the run's name, its model before model_map)
    for i, run in enumerate(recipe.get("runs", [])):
        run = dict(run)
        grid = run.pop("grid", {})
        for point in _grid_points(grid) if grid else [{}]:
            config = _expand_run(recipe.get("defaults", {}), tiers, run, point)
            missing = [k for k in _RUN_KEYS_REQUIRED if k not in config]
            if missing:
                raise ValueError(f"{_run_name(meta['name'], i, run)} lacks {missing}")
            config.update(recipe=meta["name"], tier=tier, label=_label(run, point, config["method"]))
            config["run_id"] = f"{meta['name']}__{config['model']}__{config['label']}".replace("=", "-")
            config["meta"] = meta
            config["paper"] = recipe.get("paper", {})
            config["report"] = recipe.get("report", {})
            source = (_run_name(meta["name"], i, run), point.get("model", run.get("model")))
            _add_unique(configs, origin, config, source)
    _refuse_same_config_under_two_labels(list(configs.values()), origin)
    return list(configs.values())


def _add_unique(
    configs: dict[str, dict[str, Any]], origin: dict[str, tuple[str, Any]], config: dict[str, Any], source: tuple
) -> None:
    """Add ``config``; a run id seen before is refused, unless a tier's ``model_map`` mapped two substitutes
    onto one model and the configurations are otherwise the same (that model then runs once)."""
    run_id = config["run_id"]
    if run_id not in configs:
        configs[run_id], origin[run_id] = config, source
        return
    first, first_model = origin[run_id]
    if configs[run_id] == config and first_model != source[1]:
        return
    who = f"two grid points of {first}" if first == source[0] else f"{first} and {source[0]}"
    raise ValueError(
        f"{who} share the run id {run_id!r} (one result would replace the other); give each run its own 'label'"
    )


def _refuse_same_config_under_two_labels(configs: list[dict[str, Any]], origin: dict[str, tuple]) -> None:
    """Two labels claiming different changes must not run the same configuration (a tier value that overrode
    what a variant changes made two rows of one experiment under two names)."""
    seen: dict[str, dict[str, Any]] = {}
    for config in configs:
        key = json.dumps({k: v for k, v in config.items() if k not in ("label", "run_id")}, sort_keys=True)
        if key in seen:
            other = seen[key]
            raise ValueError(
                f"{origin[other['run_id']][0]} and {origin[config['run_id']][0]} expand to the same configuration "
                f"at tier {config['tier']!r} under two labels ({other['label']!r}, {config['label']!r}): one of "
                "them does not run what its label says"
            )
        seen[key] = config
