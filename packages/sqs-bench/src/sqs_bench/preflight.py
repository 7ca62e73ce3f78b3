"""A run's values checked before any run of a suite computes (:func:`check_run_values`).

A typo in a recipe's later run (an ``sqs`` table key such as ``temprature``, a method option, ``bits = 0``)
failed only when that run started, hours into a paper-tier suite, and an unknown key as a TypeError the CLI
printed as a traceback. Every run of the suite is checked here first: bits, the target non-zero rate, the
training budget, the method's option names and learning rates, and, for SQS, the ``sqs.SQSConfig`` its ``sqs``
table builds and its sample counts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from sqs_bench.results import is_finite_number, is_integer
from sqs_bench.train import Budget

__all__ = ["BUDGET_KEYS", "budget_of", "check_run_values"]

BUDGET_KEYS = ("epochs", "batch_size", "max_batches", "seed", "bn_images", "distill_weight", "distill_temperature")
_INTEGER_KEYS = ("epochs", "batch_size", "max_batches", "seed", "bn_images")


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


def _check_values(config: dict, method: Callable[..., Any], given: tuple[str, ...]) -> None:
    bits, nonzero = config["bits"], config.get("nonzero", 1.0)
    if not is_integer(bits) or bits < 1:
        raise ValueError(f"bits must be an integer >= 1, got {bits!r}")
    if not is_finite_number(nonzero) or not 0 < nonzero <= 1:
        raise ValueError(f"nonzero must be a number in (0, 1], got {nonzero!r}")
    budget_of(config)
    options = dict(config.get("options", {}))
    _check_options(config["method"], options, method, given)
    if config["method"] == "sqs":
        from sqs_bench.sqs_method import build_config  # imports sqs-core only for SQS runs

        build_config(config.get("sqs", {}), bits=bits, nonzero=nonzero)
        samples = options.get("samples", [4])
        if not samples or not all(is_integer(m) and m >= 1 for m in samples):
            raise ValueError(f"options.samples must be a non-empty list of integers >= 1, got {samples!r}")


def _check_options(name: str, options: dict, method: Callable[..., Any], given: tuple[str, ...]) -> None:
    """Option names the method takes, and each learning rate (``*lr``) a finite number > 0 (or None)."""
    parameters = inspect.signature(method).parameters
    known = [n for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY and n not in given]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for method {name!r}; known: {known}")
    for key, value in options.items():
        if key.endswith("lr") and value is not None and not (is_finite_number(value) and value > 0):
            raise ValueError(f"options.{key} must be a finite number > 0, got {value!r}")
