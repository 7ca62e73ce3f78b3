"""A recipe's keys, its tiers' precedence and its run ids: a misspelled key, a tier default overriding what a
labelled variant changes, two runs (or two recipes) writing one result file are refused, naming them."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from sqs_bench import config
from sqs_bench.config import TIERS, expand_recipe, load_recipe
from sqs_bench.runner import suite_configs

TINY = {
    "name": "tiny",
    "defaults": {"model": "resnet20", "bits": 2, "nonzero": 0.5, "epochs": 1, "distill_weight": 0.9},
    "runs": [{"method": "magnitude_kmeans", "options": {"lr": 5e-5}}, {"method": "uniform"}],
    "report": {"kind": "table1"},
}


def _recipe(**changes) -> dict:
    """TINY with ``changes``: ``run0={...}`` merged into the first run, other keys replaced."""
    recipe = copy.deepcopy(TINY)
    for key, value in changes.items():
        if key.startswith("run"):
            recipe["runs"][int(key[3:])].update(value)
        else:
            recipe[key] = value
    return recipe


@pytest.mark.parametrize(
    ("changes", "where", "key", "suggestion"),
    [
        ({"run0": {"epoch": 3}}, "run 1 (magnitude_kmeans)", "epoch", "epochs"),
        ({"run0": {"distill_wieght": 0.9}}, "run 1 (magnitude_kmeans)", "distill_wieght", "distill_weight"),
        ({"run1": {"nonzeros": 0.3}}, "run 2 (uniform)", "nonzeros", "nonzero"),
        ({"run1": {"grid": {"nonzeros": [0.3, 0.4]}}}, "run 2 (uniform), grid", "nonzeros", "nonzero"),
        ({"defaults": {**TINY["defaults"], "batch_sise": 8}}, "[defaults]", "batch_sise", "batch_size"),
        ({"tiers": {"smoke": {"test_image": 8}}}, "[tiers.smoke]", "test_image", "test_images"),
        ({"tiers": {"smoek": {}}}, "[tiers]", "smoek", "smoke"),
        ({"default": {"epochs": 2}}, "recipe 'tiny'", "default", "defaults"),
    ],
)
def test_a_misspelled_key_is_refused_naming_where_it_is_and_the_close_match(changes, where, key, suggestion):
    with pytest.raises(ValueError, match="unknown key") as err:
        expand_recipe(_recipe(**changes), "smoke")
    message = str(err.value)
    assert where in message and repr(key) in message and f"did you mean {suggestion!r}" in message


def test_the_shipped_recipes_hold_only_known_keys():
    for name in config.list_recipes():
        config.check_recipe_keys(load_recipe(name))


@pytest.fixture
def recipe_dir(tmp_path, monkeypatch) -> Path:
    """A copy of the shipped recipe folder that the config module reads instead."""
    folder = tmp_path / "recipes"
    shutil.copytree(config._recipe_dir(), folder)
    monkeypatch.setattr(config, "_recipe_dir", lambda: folder)
    return folder


def test_a_tier_default_replaces_the_recipe_defaults_but_not_what_a_run_sets(recipe_dir):
    (recipe_dir / "tiers.toml").write_text(
        "[smoke]\n[paper]\n[cpu]\ndistill_weight = 0.0\nmethod_options = { magnitude_kmeans = { lr = 0.5 } }\n"
    )
    recipe = _recipe(
        run0={"options": {}},
        run1={"method": "magnitude_kmeans", "label": "mine", "distill_weight": 0.3, "options": {"lr": 1}},
    )
    plain, explicit = expand_recipe(recipe, "cpu")
    assert (plain["distill_weight"], plain["options"]["lr"]) == (0.0, 0.5)  # the tier's, over [defaults]
    assert (explicit["distill_weight"], explicit["options"]["lr"]) == (0.3, 1)  # the run's own values


@pytest.mark.parametrize("tier", TIERS)
def test_each_labelled_variant_runs_its_change_at_every_tier(tier):
    """At the paper tier, tiers.toml's gate_lr 0.012 and distill_weight 0.0 overrode every variant's change:
    gate-lr-1e-3 and gates-frozen both ran with 0.012, no-distillation was sqs-appendix-recipe."""
    variants = {c["label"]: c for c in expand_recipe(load_recipe("sqs_variants_resnet20"), tier)}
    assert variants["gate-lr-1e-3"]["options"]["gate_lr"] == 1e-3
    assert variants["gates-frozen"]["options"]["gate_lr"] == 1e-6
    assert variants["no-distillation"]["distill_weight"] == 0.0
    assert {c["distill_weight"] for label, c in variants.items() if label != "no-distillation"} == {0.9}
    table1 = {c["label"]: c for c in expand_recipe(load_recipe("table1_resnet20"), tier)}
    assert table1["sqs-appendix-recipe"]["options"]["gate_lr"] == 0.012
    assert table1["sqs"]["options"]["gate_lr"] == 1e-4 and table1["sqs"]["distill_weight"] == 0.9
    assert table1["dgms"]["distill_weight"] == 0.9 and table1["dgms-no-distillation"]["distill_weight"] == 0.0


def test_two_labels_expanding_to_one_configuration_are_refused():
    recipe = _recipe(
        run1={"method": "magnitude_kmeans", "label": "undistilled", "distill_weight": 0.0, "options": {"lr": 5e-5}},
        tiers={"smoke": {"distill_weight": 0.0}},  # the recipe's tier table has the last word
    )
    expand_recipe(recipe, "cpu")
    with pytest.raises(ValueError, match="same configuration") as err:
        expand_recipe(recipe, "smoke")
    assert "'magnitude_kmeans'" in str(err.value) and "'undistilled'" in str(err.value)


def test_two_unlabelled_runs_of_one_method_are_refused_naming_both():
    """The second used to be dropped silently (configs.setdefault kept the first)."""
    recipe = _recipe(run0={"method": "uniform", "options": {}}, run1={"nonzero": 0.3})
    with pytest.raises(ValueError, match="tiny__resnet20__uniform") as err:
        expand_recipe(recipe, "smoke")
    assert "run 1 (uniform) and recipe 'tiny', run 2 (uniform)" in str(err.value) and "label" in str(err.value)


def test_model_map_still_runs_a_paper_model_once():
    """The paper tier maps ResNet-56 and ResNet-20 onto one ResNet-18: the intended merge, not a collision."""
    paper = expand_recipe(load_recipe("ablation_prior"), "paper")
    assert len(paper) == 8 and {c["model"] for c in paper} == {"timm:resnet18"}


def test_two_recipes_of_one_name_in_a_suite_are_refused_before_any_compute(recipe_dir):
    copied = (recipe_dir / "table1_resnet20.toml").read_text().replace("bits = 2 ", "bits = 3 ")
    (recipe_dir / "table1_resnet20_3bit.toml").write_text(copied)  # its name is still table1_resnet20
    with (recipe_dir / "suites.toml").open("a") as f:
        f.write('\n[mine]\nrecipes = ["table1_resnet20", "table1_resnet20_3bit"]\n')
    with pytest.raises(ValueError, match="table1_resnet20__resnet20__sqs") as err:
        suite_configs("mine", "smoke")
    assert "'table1_resnet20' and 'table1_resnet20_3bit'" in str(err.value)


def test_the_cpu_tier_still_expands_to_the_committed_runs_configs():
    """The fixes change no run of the committed results (docs/results/cifar10_runs): each one's recorded config
    is what the cifar10 suite expands to now, so --resume and the report keep them."""
    from sqs_bench.resume import recorded_config

    folder = Path(__file__).parents[2] / "docs" / "results" / "cifar10_runs"
    configs = {c["run_id"]: c for c in suite_configs("cifar10", "cpu")}
    saved = {p.stem: json.loads(p.read_text())["config"] for p in folder.glob("*.json")}
    assert len(saved) == 46 and set(saved) == set(configs)
    for run_id, recorded in saved.items():
        assert json.loads(json.dumps(recorded_config(configs[run_id]))) == recorded, run_id


def test_the_cli_refuses_a_misspelled_run_key_before_any_compute(recipe_dir, fake_data_dir, tmp_path, capsys):
    from sqs_bench.__main__ import main

    (recipe_dir / "tiny.toml").write_text(
        'name = "tiny"\n[defaults]\nmodel = "resnet20"\nbits = 2\nnonzero = 0.5\n'
        '[[runs]]\nmethod = "uniform"\nnonzeros = 0.3\n[report]\nkind = "table1"\n'
    )
    with (recipe_dir / "suites.toml").open("a") as f:
        f.write('\n[tiny]\nrecipes = ["tiny"]\n')
    out = tmp_path / "out"
    assert main(["run", "--suite", "tiny", "--tier", "smoke", "--data-dir", str(fake_data_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: recipe 'tiny', run 1 (uniform): unknown key 'nonzeros'; did you mean 'nonzero'?")
    assert "\n" not in err and not out.exists()
