"""Tables and plots are built from result JSON alone, for every report kind of the shipped recipes."""

from __future__ import annotations

import json

import pytest
from sqs_bench.config import expand_recipe, load_recipe
from sqs_bench.report import build_report, load_results


def _fake_result(config: dict, drop: float) -> dict:
    """A result shaped like ``runner.run_config``'s, with made-up accuracies (for the report only)."""
    samples = config.get("options", {}).get("samples", [])
    names = ["greedy", *(f"bayes_M{m}" for m in samples)] if config["method"] == "sqs" else ["hard"]
    evaluations = [
        {
            "name": name,
            "inference": name.split("_")[0],
            "samples": int(name[7:]) if name.startswith("bayes") else None,
            "acc": 90.0 - drop - i,
            "drop": drop + i,
            "drop_ci": [drop + i - 1, drop + i + 1],
            "val_acc": 95.0,
        }
        for i, name in enumerate(names)
    ]
    primary = evaluations[1] if len(evaluations) > 1 else evaluations[0]
    metrics = {
        "model": config["model"],
        "method": config["method"],
        "bits": config["bits"],
        "nonzero": config.get("nonzero", 0.55),
        "compression_rate_paper": 30.0,
        "compression_rate_file": None,
        "fp32_acc": 90.0,
        "acc": primary["acc"],
        "drop": primary["drop"],
        "drop_ci": primary["drop_ci"],
        "inference": primary["name"],
        "val_acc": 95.0,
        "fp32_val_acc": 99.0,
        "test_images": 1017,
    }
    return {
        "run_id": config["run_id"],
        "recipe": config["recipe"],
        "tier": config["tier"],
        "label": config["label"],
        "meta": config["meta"],
        "paper": config["paper"],
        "report": config["report"],
        "git_commit": None,
        "machine": {"platform": "test", "cpu_count": 2, "torch": "x"},
        "wall_time_s": 1.5,
        "metrics": metrics,
        "evaluations": evaluations,
        "config": config,
    }


@pytest.fixture
def results_dir(tmp_path):
    for name in ("table1_resnet20", "ablation_bayes_samples", "ablation_greedy_vs_bayes", "ablation_prior"):
        for i, config in enumerate(expand_recipe(load_recipe(name), "cpu")):
            config = {k: v for k, v in config.items()}
            (tmp_path / f"{config['run_id']}.json").write_text(json.dumps(_fake_result(config, drop=1.0 + i)))
    (tmp_path / "unrelated.json").write_text("[1, 2]")
    return tmp_path


def test_report_has_one_section_and_plot_per_recipe(results_dir):
    path = build_report(results_dir, results_dir / "out")
    text = path.read_text()
    assert text.count("\n## ") == 4 and text.count("SUBSTITUTE") == 3
    for recipe in ("table1_resnet20", "ablation_bayes_samples", "ablation_greedy_vs_bayes", "ablation_prior"):
        assert (results_dir / "out" / f"{recipe}.png").stat().st_size > 0
    assert "| sqs | P+Q | 2 | 50.0 | 30.0× | – | 90.00 |" in text  # Table 1 row of the primary evaluation
    assert "| 4 | 40 | 20 | 5.6 | 3.21 |" in text  # the paper's Table 4 row, kept apart from ours
    assert "Reported by the paper" in text and "figure only" in text


def test_rows_keep_every_inference_mode(results_dir):
    results = load_results(results_dir)
    assert len(results) == 7 + 1 + 8 + 16  # table1_resnet20: two SQS runs, two undistilled baselines; 2 models
    samples = next(r for r in results if r["recipe"] == "ablation_bayes_samples")
    text = build_report(results_dir).read_text()
    assert [e["name"] for e in samples["evaluations"]] == [
        "greedy",
        "bayes_M4",
        "bayes_M1",
        "bayes_M5",
        "bayes_M20",
        "bayes_M50",
    ]
    assert text.count("| resnet20 | sqs | 4 | 50.0 | spike_slab | bayes |") == 5


def test_no_results_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no result JSON"):
        build_report(tmp_path)


@pytest.mark.parametrize("prefix", ["../escape", "", "a/b", ".", "..", ".hidden", "a\\b", "x\0y", 3])
def test_a_prefix_that_is_not_a_plain_file_name_is_refused_before_anything_is_written(results_dir, prefix):
    out = results_dir / "out"
    with pytest.raises(ValueError, match="prefix"):
        build_report(results_dir, out, prefix=prefix)
    assert not out.exists() and not (results_dir.parent / "escape.json").exists()


def test_summary_json_holds_the_issue_keys(results_dir):
    build_report(results_dir, results_dir / "out", prefix="cifar10")
    table1 = json.loads((results_dir / "out" / "cifar10.json").read_text())
    required = {"model", "method", "bits", "nonzero", "compression_rate_paper", "compression_rate_file"}
    required |= {"fp32_acc", "acc", "drop", "drop_ci"}
    assert len(table1["rows"]) == 7 and all(required <= set(row) for row in table1["rows"])
    assert {row["method"] for row in table1["rows"]} == {"sqs", "dgms", "magnitude_kmeans", "uniform"}
    assert table1["paper"]["table1_resnet20"]["fp32_acc"] == 92.60
    ablations = json.loads((results_dir / "out" / "cifar10_ablations.json").read_text())["ablations"]
    assert set(ablations) == {"ablation_bayes_samples", "ablation_greedy_vs_bayes", "ablation_prior"}
    assert len(ablations["ablation_bayes_samples"]["rows"]) == 6  # greedy and five M
    assert all(a["substitute"].startswith("SUBSTITUTE") for a in ablations.values())


def test_a_recipe_relabelled_since_its_older_runs_is_reported_with_its_current_label(tmp_path):
    """Results of one recipe run at different times carry different labels; the report shows today's."""
    for i, config in enumerate(expand_recipe(load_recipe("ablation_prior"), "cpu")):
        config = dict(config, meta=dict(config["meta"], substitute="SUBSTITUTE: an outdated label"))
        (tmp_path / f"{config['run_id']}.json").write_text(json.dumps(_fake_result(config, drop=1.0 + i)))
    text = build_report(tmp_path).read_text()
    assert "an outdated label" not in text
    assert load_recipe("ablation_prior")["substitute"] in text
    ablations = json.loads((tmp_path / "results_ablations.json").read_text())["ablations"]
    assert ablations["ablation_prior"]["substitute"] == load_recipe("ablation_prior")["substitute"]
