"""A run's values checked before any run of a suite computes (:func:`check_run_values`).

A typo in a recipe's later run (an ``sqs`` table key such as ``temprature``, a method option, ``bits = 0``)
failed only when that run started, hours into a paper-tier suite, and an unknown key as a TypeError the CLI
printed as a traceback. Every run of the suite is checked here first: the model and dataset, bits, the target
non-zero rate, the training budget, the split and scoring sizes, the label (it names the result file), the
method's option names and learning rates, and, for SQS, the ``sqs.SQSConfig`` its ``sqs`` table builds, the
option tables it passes to sqs-core (``objective``, ``groups``, ``pruning``, ``gate_schedule``) and its sample
counts. :func:`check_unique_run_ids` refuses two runs of a suite that would write the same result file.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from sqs_bench.config import BUDGET_KEYS
from sqs_bench.data import FULL_SIZES
from sqs_bench.models import DEPTHS
from sqs_bench.results import is_finite_number, is_integer
from sqs_bench.train import Budget

__all__ = ["BUDGET_KEYS", "budget_of", "check_run_values", "check_unique_run_ids"]

_INTEGER_KEYS = ("epochs", "batch_size", "max_batches", "seed", "bn_images")
# key -> its smallest value; an absent key keeps the runner's default
_SIZES = {"val_images": 0, "test_images": 1, "bootstrap_resamples": 1}
_UNSAFE_IN_NAMES = ("/", "\\", "\0")


def budget_of(config: dict) -> Budget:
    """The run's :class:`~sqs_bench.train.Budget` (its integer fields checked to be integers first)."""
    for key in _INTEGER_KEYS:
        value = config.get(key)
        if value is not None and not is_integer(value):
            raise ValueError(f"{key} must be an integer, got {value!r}")
    for key in ("distill_weight", "distill_temperature"):
        if key in config and not is_finite_number(config[key]):
            raise ValueError(f"{key} must be a finite number, got {config[key]!r}")
    return Budget(**{k: config[k] for k in BUDGET_KEYS if k in config})


def check_run_values(config: dict, method: Callable[..., Any], given: tuple[str, ...]) -> None:
    """A ValueError naming the run and the bad value; ``method`` is the function the run calls, with the
    keyword arguments ``given`` passed by the runner and the recipe's ``options`` as the rest."""
    try:
        _check_values(config, method, given)
    except (TypeError, ValueError) as err:  # SQSConfig(**table) refuses an unknown key with a TypeError
        raise ValueError(f"{config['run_id']}: {err}") from None


def check_unique_run_ids(entries: list[tuple[str, dict]]) -> None:
    """Refuse two runs of a suite with one run id (two recipes of the same ``name``, say): the second result
    would replace the first. ``entries`` are (the suite's recipe entry, config) pairs."""
    seen: dict[str, str] = {}
    for entry, config in entries:
        run_id = config["run_id"]
        if run_id in seen:
            raise ValueError(
                f"recipes {seen[run_id]!r} and {entry!r} both define the run {run_id!r} (a recipe's 'name' "
                "makes its run ids): one result would replace the other; give each recipe its own name"
            )
        seen[run_id] = entry


def _check_values(config: dict, method: Callable[..., Any], given: tuple[str, ...]) -> None:
    bits, nonzero = config["bits"], config.get("nonzero", 1.0)
    _check_identity(config)
    if not is_integer(bits) or bits < 1:
        raise ValueError(f"bits must be an integer >= 1, got {bits!r}")
    if not is_finite_number(nonzero) or not 0 < nonzero <= 1:
        raise ValueError(f"nonzero must be a number in (0, 1], got {nonzero!r}")
    budget = budget_of(config)
    _check_sizes(config)
    options = dict(config.get("options", {}))
    _check_options(config["method"], options, method, given)
    if config["method"] == "sqs":
        from sqs_bench.sqs_method import build_config, check_option_tables  # sqs-core only for SQS runs

        if budget.epochs < 1:
            raise ValueError(f"epochs must be >= 1 for SQS (its schedules need a training step), got {budget.epochs}")
        build_config(config.get("sqs", {}), bits=bits, nonzero=nonzero)
        check_option_tables(options)
        samples = options.get("samples", [4])
        if not isinstance(samples, list) or not samples or not all(is_integer(m) and m >= 1 for m in samples):
            raise ValueError(f"options.samples must be a non-empty list of integers >= 1, got {samples!r}")


def _check_identity(config: dict) -> None:
    """The model, the dataset, the label (part of the result file's name) and the checkpoint pattern."""
    model, dataset, label = config["model"], config.get("dataset", "cifar10"), config["label"]
    timm = isinstance(model, str) and model.startswith("timm:") and len(model) > len("timm:")
    if not timm and model not in DEPTHS:
        raise ValueError(f"unknown model {model!r}; expected one of {sorted(DEPTHS)} or 'timm:<arch>'")
    if dataset not in FULL_SIZES:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {sorted(FULL_SIZES)}")
    if not isinstance(label, str) or not label or any(c in label for c in _UNSAFE_IN_NAMES) or label[0] == ".":
        raise ValueError(f"label {label!r} must be a plain file-name part (no '/', '\\\\', NUL, not starting '.')")
    pattern = config.get("checkpoint_pattern")
    if timm and pattern is None:
        raise ValueError(f"model {model!r} needs a 'checkpoint_pattern' (a path under the data directory)")
    if pattern is not None:
        try:
            pattern.format(arch="x")
        except (AttributeError, KeyError, IndexError, ValueError):
            raise ValueError(f"checkpoint_pattern must be a string using only {{arch}}, got {pattern!r}") from None
    if not isinstance(config.get("requires_full_data", False), bool):
        raise ValueError(f"requires_full_data must be true or false, got {config['requires_full_data']!r}")


def _check_sizes(config: dict) -> None:
    """The validation fraction and the image and resample counts (a negative ``test_images`` sliced away the
    last images; a string reached the split as a TypeError)."""
    fraction = config.get("val_fraction", 0.1)
    if not is_finite_number(fraction) or not 0 <= fraction < 1:
        raise ValueError(f"val_fraction must be a number in [0, 1), got {fraction!r}")
    for key, least in _SIZES.items():
        value = config.get(key)
        if value is not None and (not is_integer(value) or value < least):
            raise ValueError(f"{key} must be an integer >= {least}, got {value!r}")


def _check_options(name: str, options: dict, method: Callable[..., Any], given: tuple[str, ...]) -> None:
    """Option names the method takes, and each learning rate (``*lr``) a finite number > 0 (or None)."""
    parameters = inspect.signature(method).parameters
    known = [n for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY and n not in given]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for method {name!r}; known: {known}")
    check_learning_rates(options, "options.")


def check_learning_rates(options: dict, where: str) -> None:
    """Each ``*lr`` value of ``options`` a finite number > 0 or None."""
    for key, value in options.items():
        if key.endswith("lr") and value is not None and not (is_finite_number(value) and value > 0):
            raise ValueError(f"{where}{key} must be a finite number > 0, got {value!r}")
