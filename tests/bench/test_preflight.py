"""A recipe's values are checked, for every run of the suite, before the first run computes: a typo in a later
run (an SQSConfig key, a method option, bits = 0) used to fail only when that run started, hours into a
paper-tier suite, and an unknown key as a TypeError the CLI printed as a traceback."""

from __future__ import annotations

import copy

import pytest
from sqs_bench import runner
from sqs_bench.config import expand_recipe, load_recipe

RECIPE = load_recipe("table1_resnet20")  # runs 0-1: sqs; 2: dgms; 3: magnitude_kmeans; ...; 6: uniform


def _set(path: str, value):
    """A mutation of the recipe: ``defaults.bits``, ``runs.0.sqs.windows``, ``runs.2.options.lr`` ..."""

    def mutate(recipe):
        *parents, key = path.split(".")
        node = recipe
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[key] = value

    return mutate


CASES = {
    "an SQSConfig value": (_set("runs.0.sqs.windows", "outliers"), "windows"),
    "an SQSConfig key": (_set("runs.0.sqs.temprature", 1e-3), "temprature"),
    "a prior key": (_set("runs.0.sqs.prior.slab_sd", 1.0), "slab_sd"),
    "bits 0": (_set("defaults.bits", 0), "bits"),
    "bits a string": (_set("defaults.bits", "two"), "bits"),
    "nonzero above 1": (_set("defaults.nonzero", 1.5), "nonzero"),
    "negative epochs": (_set("defaults.epochs", -1), "epochs"),
    "epochs a string": (_set("defaults.epochs", "ten"), "epochs"),
    "batch size 0": (_set("defaults.batch_size", 0), "batch_size"),
    "distillation weight 2": (_set("defaults.distill_weight", 2.0), "distill_weight"),
    "a negative learning rate": (_set("runs.0.options.gate_lr", -1.0), "gate_lr"),
    "a sample count of 0": (_set("runs.0.options.samples", [0]), "samples"),
    "an unknown SQS option": (_set("runs.0.options.qaunt_lr", 1e-3), "qaunt_lr"),
    "an unknown baseline option": (_set("runs.3.options.kmeans_iter", 10), "kmeans_iter"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_value_in_any_run_is_named_before_any_compute(case, monkeypatch):
    mutate, name = CASES[case]
    recipe = copy.deepcopy(RECIPE)
    mutate(recipe)
    configs = expand_recipe(recipe, "cpu")  # the recipe as written (smoke sets its own budget)
    monkeypatch.setattr(runner, "_data", lambda *args: pytest.fail("data loaded before the values were checked"))
    with pytest.raises(ValueError, match=name) as err:
        runner.check_requirements(configs, None, {})
    assert "table1_resnet20__resnet20__" in str(err.value)  # the run is named


def test_the_shipped_recipes_pass_the_check(monkeypatch):
    monkeypatch.setattr(runner, "_data", lambda *args: None)
    monkeypatch.setattr(runner, "require_timm", lambda: None)  # the paper tier's models; not installed here
    for suite in ("default", "cifar10"):
        for tier in ("smoke", "cpu", "paper"):
            runner.check_requirements(runner.suite_configs(suite, tier), None, {})
