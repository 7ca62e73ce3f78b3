"""Recipes, suites and tiers expand into the intended runs."""

from __future__ import annotations

import pytest
from sqs_bench.config import TIERS, expand_recipe, list_recipes, load_recipe, merge
from sqs_bench.runner import METHODS, suite_configs


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("name", list_recipes())
def test_every_recipe_expands_for_every_tier(name, tier):
    configs = expand_recipe(load_recipe(name), tier)
    assert configs and len({c["run_id"] for c in configs}) == len(configs)
    for config in configs:
        assert config["method"] in METHODS and config["tier"] == tier
        assert "rows" in config["paper"] and "kind" in config["report"]


def test_default_suite_is_table1_resnet20_with_four_methods():
    configs = suite_configs("default", "cpu")
    assert sorted(c["method"] for c in configs) == sorted(["sqs", "dgms", "magnitude_kmeans", "uniform"])
    assert {c["label"] for c in configs} == {"sqs", "dgms", "magnitude_kmeans", "uniform"}  # one run each
    assert {(c["model"], c["bits"], c["nonzero"], c["epochs"], c["batch_size"]) for c in configs} == {
        ("resnet20", 2, 0.5, 10, 128)
    }


def test_cifar10_suite_holds_table1_and_the_labelled_ablations():
    configs = suite_configs("cifar10", "cpu")
    table1 = [c for c in configs if c["recipe"].startswith("table1")]
    assert {c["model"] for c in table1} == {"resnet20", "resnet32", "resnet56"} and len(table1) == 15
    assert {c["label"] for c in table1 if c["method"] == "sqs"} == {"sqs", "sqs-appendix-recipe"}
    undistilled = {"sqs-appendix-recipe", "dgms-no-distillation", "magnitude_kmeans-no-distillation"}
    assert all(c["distill_weight"] == (0.0 if c["label"] in undistilled else 0.9) for c in table1)
    variants = [c for c in configs if c["recipe"] == "sqs_variants_resnet20"]
    assert len(variants) == 6 and all(c["method"] == "sqs" for c in variants)
    prior = [c for c in configs if c["recipe"] == "ablation_prior"]
    assert sorted((c["model"], c["nonzero"], c["sqs"]["prior"]["kind"]) for c in prior) == sorted(
        (model, nz, kind)
        for model in ("resnet56", "resnet20")
        for nz in (0.5, 0.4, 0.3, 0.2)
        for kind in ("spike_slab", "gaussian")
    )
    greedy = [c for c in configs if c["recipe"] == "ablation_greedy_vs_bayes"]
    assert sorted((c["model"], 2 ** c["bits"]) for c in greedy) == sorted(
        (model, k) for model in ("resnet20", "resnet56") for k in (2, 4, 8, 16)
    )
    # a grid over models keeps the labels (the model is in the run id) and the run ids stay unique
    assert {c["label"] for c in greedy} == {f"sqs_bits={b}" for b in (1, 2, 3, 4)}
    assert len({c["run_id"] for c in configs}) == len(configs)
    assert all(c["nonzero"] == 1.0 for c in greedy)
    (samples,) = [c for c in configs if c["recipe"] == "ablation_bayes_samples"]
    assert samples["bits"] == 4 and samples["nonzero"] == 0.5
    assert sorted(samples["options"]["samples"]) == [1, 4, 5, 20, 50]
    for config in prior + greedy + [samples]:
        assert config["meta"]["substitute"].startswith("SUBSTITUTE")


def test_tiers_override_the_budget_and_models():
    smoke = suite_configs("default", "smoke")
    assert all(c["epochs"] == 1 and c["max_batches"] == 2 and c["test_images"] == 64 for c in smoke)
    paper = expand_recipe(load_recipe("ablation_prior"), "paper")
    assert {c["model"] for c in paper} == {"timm:resnet18"} and {c["dataset"] for c in paper} == {"cifar100"}
    assert len(paper) == 8  # both substitutes map to the paper's one network, which runs once
    assert all(c["options"]["quant_lr"] == 5e-4 and c["options"]["gate_lr"] == 0.012 for c in paper)
    assert all(c["distill_weight"] == 0.0 for c in paper)  # the paper's recipe: no distillation
    # Table 1's labels mean the same at every tier: the appendix recipe is its own row, not a tier default
    table1 = expand_recipe(load_recipe("table1_resnet20"), "paper")
    sqs_rows = {c["label"]: (c["options"]["gate_lr"], c["distill_weight"]) for c in table1 if c["method"] == "sqs"}
    assert sqs_rows == {"sqs": (1e-4, 0.9), "sqs-appendix-recipe": (0.012, 0.0)}
    assert all("gate_lr" not in c.get("options", {}) for c in table1 if c["method"] != "sqs")
    greedy = expand_recipe(load_recipe("ablation_greedy_vs_bayes"), "paper")
    assert {c["model"] for c in greedy} == {"timm:resnet18", "timm:resnet50"} and {c["epochs"] for c in greedy} == {10}
    assert all(c["requires_full_data"] for c in paper + greedy)


def test_merge_is_recursive_and_does_not_alias():
    base = {"a": {"b": 1, "c": [1]}, "d": 2}
    out = merge(base, {"a": {"b": 3}, "e": 4})
    assert out == {"a": {"b": 3, "c": [1]}, "d": 2, "e": 4}
    out["a"]["c"].append(2)
    assert base["a"]["c"] == [1]


def test_unknown_names_fail_clearly():
    with pytest.raises(FileNotFoundError, match="table1_resnet20"):
        load_recipe("no_such_recipe")
    with pytest.raises(ValueError, match="cifar10"):
        suite_configs("nope", "cpu")
    with pytest.raises(ValueError, match="smoke"):
        expand_recipe(load_recipe("table1_resnet20"), "gpu")
