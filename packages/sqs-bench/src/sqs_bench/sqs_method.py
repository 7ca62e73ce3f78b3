"""The SQS runner, written against sqs-core's public API (docs/api-contract.md).

Recipe knobs map one to one onto the library: the ``sqs`` table of a run goes straight into
``sqs.SQSConfig`` (its ``prior`` sub-table becomes ``sqs.SpikeSlabPrior`` or ``sqs.GaussianPrior``), so a
variant is a config, never code. Flow: ``prepare_`` → AdamW on ``sqs.param_groups`` → the shared training loop
with ``sqs.Objective``, ``sqs.PruningSchedule`` and ``sqs.GateTemperatureSchedule`` → greedy accuracy
(``sqs.greedy_``) and Bayesian-averaging accuracy for each requested M (``sqs.BayesianAverage``) → the
artifact (``sqs.save``) and its ``sqs.compression_report``: ``paper_rate`` (the paper's formula, as for the
baselines), ``paper_plus_mask_rate`` (one mask bit per weight added) and ``file_rate`` (the honest rate from
the artifact's bytes for the compressed tensors).
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqs_core as sqs
import torch
from torch import nn

from sqs_bench.data import CifarSplits
from sqs_bench.train import Budget, fit, predict

__all__ = ["OPTION_TABLES", "build_config", "check_option_tables", "run_sqs"]

logger = logging.getLogger(__name__)

_PRIORS = {"spike_slab": "SpikeSlabPrior", "gaussian": "GaussianPrior"}
OPTION_TABLES: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "groups": (sqs.param_groups, ("model",)),
    "objective": (sqs.Objective, ("model", "num_data")),
    "pruning": (sqs.PruningSchedule, ("model", "target_nonzero", "total_steps")),
    "gate_schedule": (sqs.GateTemperatureSchedule, ("model", "total_steps")),
}
"""Option table of an SQS run -> (the sqs-core callable it goes to, the arguments :func:`run_sqs` passes itself)."""


def check_option_tables(options: dict[str, Any]) -> None:
    """A ValueError naming an option table that is not a table, or a key its sqs-core callable does not take
    (``objective = {betta = ...}`` was a TypeError after the suite's earlier runs had computed)."""
    from sqs_bench.preflight import check_learning_rates

    for name, (function, given) in OPTION_TABLES.items():
        table = options.get(name)
        if table is None:
            continue
        if not isinstance(table, dict):
            raise ValueError(f"options.{name} must be a table, got {table!r}")
        parameters = inspect.signature(function).parameters
        known = sorted(n for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY and n not in given)
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise ValueError(
                f"unknown key(s) {unknown} in options.{name} (for sqs.{function.__name__}); known: {known}"
            )
        check_learning_rates(table, f"options.{name}.")


def build_config(knobs: dict[str, Any], *, bits: int, nonzero: float) -> Any:
    """``sqs.SQSConfig`` from a recipe's ``sqs`` table; ``num_components`` defaults to 2**bits.

    ``prior = {kind = "spike_slab" | "gaussian", ...}``: the other keys go to that prior's constructor; a
    spike-and-slab ``keep_prob`` (λ) defaults to the run's target ``nonzero``.
    Lists become tuples (TOML has no tuples; ``include``/``exclude`` are tuples in the config).
    """
    kwargs: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in knobs.items()}
    kwargs.setdefault("num_components", 2**bits)
    if "prior" in kwargs:
        prior = dict(kwargs["prior"])
        kind = prior.pop("kind", "spike_slab")
        if kind not in _PRIORS:
            raise ValueError(f"unknown prior kind {kind!r}; expected one of {sorted(_PRIORS)}")
        if kind == "spike_slab":
            prior.setdefault("keep_prob", nonzero)
        kwargs["prior"] = getattr(sqs, _PRIORS[kind])(**prior)
    return sqs.SQSConfig(**kwargs)


def _train(
    model: nn.Module, teacher: nn.Module, data: CifarSplits, budget: Budget, nonzero: float, knobs: dict
) -> dict:
    """Variational learning (Algorithm 1) with the shared loop; returns the loop's timing record.

    ``knobs`` holds the keyword arguments of ``param_groups``, ``Objective``, ``PruningSchedule`` and
    ``GateTemperatureSchedule`` (beyond those the runner fixes).
    """
    total = budget.total_steps(data.train_x.shape[0])
    objective = sqs.Objective(model, num_data=data.train_x.shape[0], **knobs["objective"])
    optimizer = torch.optim.AdamW(sqs.param_groups(model, **knobs["groups"]))
    pruning = sqs.PruningSchedule(model, target_nonzero=nonzero, total_steps=total, **knobs["pruning"])
    gate_tau = sqs.GateTemperatureSchedule(model, total_steps=total, **knobs["gate_schedule"])

    def before_step(step: int) -> None:
        pruning.step(step)
        gate_tau.step(step)

    record = fit(
        model,
        optimizer,
        data.train_x,
        data.train_y,
        budget,
        regularizer=objective,
        before_step=before_step,
        teacher=teacher,
        desc="sqs",
    )
    record["final_kl"] = objective.kl().item()
    return record


def _evaluate(model: nn.Module, data: CifarSplits, nonzero: float, samples: list[int], seed: int) -> list[dict]:
    """Greedy and Bayesian-averaging predictions on the validation and test images."""
    evaluations: list[dict[str, Any]] = []
    sqs.greedy_(model, nonzero=nonzero)
    evaluations.append(
        {
            "name": "greedy",
            "inference": "greedy",
            "samples": None,
            "val_preds": predict(model, data.val_x),
            "test_preds": predict(model, data.test_x),
        }
    )
    for m in samples:
        sqs.variational_(model)
        averaged = sqs.BayesianAverage(model, samples=m, nonzero=nonzero, generator=torch.Generator().manual_seed(seed))
        evaluations.append(
            {
                "name": f"bayes_M{m}",
                "inference": "bayes",
                "samples": m,
                "val_preds": predict(averaged, data.val_x),
                "test_preds": predict(averaged, data.test_x),
            }
        )
    return evaluations


def _bits(num_components: int) -> float | int:
    """log2 K, as an int when K is a power of two."""
    bits = math.log2(num_components)
    return int(bits) if bits.is_integer() else bits


def run_sqs(
    model: nn.Module,
    data: CifarSplits,
    budget: Budget,
    *,
    bits: int,
    nonzero: float,
    artifact: Path,
    sqs_config: dict[str, Any] | None = None,
    quant_lr: float = 5e-5,
    gate_lr: float = 0.012,
    weight_lr: float | None = None,
    samples: list[int] | tuple[int, ...] = (4,),
    groups: dict[str, Any] | None = None,
    objective: dict[str, Any] | None = None,
    pruning: dict[str, Any] | None = None,
    gate_schedule: dict[str, Any] | None = None,
) -> tuple[dict, list[dict]]:
    """Compress a copy of ``model`` with SQS; returns (record, evaluations).

    ``evaluations`` holds greedy plus one Bayesian average per M in ``samples`` (the first M is the primary
    result); the artifact is written to ``artifact`` and its report gives both compression rates.
    ``groups`` / ``objective`` / ``pruning`` / ``gate_schedule`` are extra keyword arguments for
    ``sqs.param_groups`` / ``sqs.Objective`` / ``sqs.PruningSchedule`` / ``sqs.GateTemperatureSchedule``.
    """
    teacher, model = model, copy.deepcopy(model)
    config = build_config(sqs_config or {}, bits=bits, nonzero=nonzero)
    sqs.prepare_(model, config)
    knobs = {
        "groups": {"quant_lr": quant_lr, "gate_lr": gate_lr, "weight_lr": weight_lr, **(groups or {})},
        "objective": objective or {},
        "pruning": pruning or {},
        "gate_schedule": gate_schedule or {},
    }
    train = _train(model, teacher, data, budget, nonzero, knobs)
    evaluations = _evaluate(model, data, nonzero, list(samples), budget.seed)
    artifact.parent.mkdir(parents=True, exist_ok=True)
    sqs.save(model, str(artifact), nonzero=nonzero)
    report = sqs.compression_report(str(artifact))
    record = {
        "method": "sqs",
        "bits": _bits(config.num_components),
        "num_components": config.num_components,
        "nonzero": report.nonzero_weights / report.compressed_weights,  # measured over the compressed layers
        "target_nonzero": nonzero,
        "compressed_weights": report.compressed_weights,
        "compression_rate_paper": report.paper_rate,
        "compression_rate_paper_plus_mask": report.paper_plus_mask_rate,
        "compression_rate_file": report.file_rate,
        "artifact": str(artifact),
        "artifact_bytes": artifact.stat().st_size,
        "compression_report": str(report),
        "primary": f"bayes_M{samples[0]}" if samples else "greedy",
        "train": train,
    }
    logger.info("sqs: %d layers compressed, artifact %s", len(sqs.sqs_layers(model)), artifact)
    return record, evaluations
