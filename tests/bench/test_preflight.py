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
    # values that passed the check and failed after the suite's earlier runs had computed
    "an objective option key": (_set("runs.1.options.objective", {"betta": 1e-3}), r"betta.*options\.objective"),
    "a param_groups option key": (_set("runs.1.options.groups", {"other_lrr": 1e-4}), r"other_lrr.*options\.groups"),
    "a pruning option key": (_set("runs.1.options.pruning", {"schedul": "cubic"}), r"schedul.*options\.pruning"),
    "an option table not a table": (_set("runs.1.options.gate_schedule", 0.5), r"options\.gate_schedule"),
    "a nested learning rate": (_set("runs.1.options.groups", {"other_lr": -1.0}), r"options\.groups\.other_lr"),
    "an unknown model": (_set("defaults.model", "resnet44"), "resnet44"),
    "an unknown dataset": (_set("defaults.dataset", "mnist"), "mnist"),
    "a timm model without checkpoint_pattern": (_set("defaults.model", "timm:resnet18"), "checkpoint_pattern"),
    "SQS with zero epochs": (_set("defaults.epochs", 0), "epochs must be >= 1 for SQS"),
    "zero bootstrap resamples": (_set("defaults.bootstrap_resamples", 0), "bootstrap_resamples"),
    "fractional bootstrap resamples": (_set("defaults.bootstrap_resamples", 1.5), "bootstrap_resamples"),
    "zero test images": (_set("defaults.test_images", 0), "test_images"),
    "negative test images": (_set("defaults.test_images", -17), "test_images"),  # [:-17] scored 1000 images
    "negative validation images": (_set("defaults.val_images", -1), "val_images"),
    "a validation fraction string": (_set("defaults.val_fraction", "x"), "val_fraction"),
    "a validation fraction of 1": (_set("defaults.val_fraction", 1.0), "val_fraction"),
    "a label with a slash": (_set("runs.6.label", "w/o-training"), "label 'w/o-training'"),
    "a hidden label": (_set("runs.6.label", ".x"), "label '.x'"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_value_in_any_run_is_named_before_any_compute(case, monkeypatch):
    mutate, name = CASES[case]
    recipe = copy.deepcopy(RECIPE)
    mutate(recipe)
    configs = expand_recipe(recipe, "cpu")  # the recipe as written (smoke sets its own budget)
    monkeypatch.setattr(runner, "_data", lambda *args: pytest.fail("data loaded before the values were checked"))
    monkeypatch.setattr(runner, "_checkpoint_record", lambda *a: pytest.fail("checkpoint read first"), raising=False)
    with pytest.raises(ValueError, match=name) as err:
        runner.check_requirements(configs, None, {})
    assert str(err.value).startswith("table1_resnet20__")  # the run is named


def test_the_shipped_recipes_pass_the_check(monkeypatch):
    monkeypatch.setattr(runner, "_data", lambda *args: None)
    monkeypatch.setattr(runner, "require_timm", lambda: None)  # the paper tier's models; not installed here
    monkeypatch.setattr(runner, "_checkpoint_record", lambda *args: None, raising=False)  # nor checkpoints
    for suite in ("default", "cifar10"):
        for tier in ("smoke", "cpu", "paper"):
            runner.check_requirements(runner.suite_configs(suite, tier), None, {})


def test_a_missing_checkpoint_of_a_later_run_is_found_before_the_first_run_computes(fake_data_dir, tmp_path, capsys):
    """The fake data holds a ResNet-20 checkpoint only: the ResNet-32 runs' absence was found after the
    ResNet-20 runs had computed."""
    from sqs_bench.__main__ import main

    out = tmp_path / "out"
    args = ["--suite", "cifar10", "--tier", "smoke", "--data-dir", str(fake_data_dir), "--out", str(out)]
    args += ["--recipe", "table1_resnet20", "--recipe", "table1_resnet32", "--method", "uniform"]
    assert main(["run", *args]) == 2
    assert "resnet32-" in capsys.readouterr().err
    assert not out.exists() or not list(out.glob("*.json"))
