"""The command line end to end on the smoke tier: result JSON, the report, and the clear failures."""

from __future__ import annotations

import json

import pytest
import sqs_core as sqs
from sqs_bench.__main__ import main
from sqs_bench.data import load_splits
from sqs_bench.models import build_model
from sqs_bench.train import predict

METRICS = {
    "model",
    "method",
    "bits",
    "nonzero",
    "compression_rate_paper",
    "compression_rate_file",
    "fp32_acc",
    "acc",
    "drop",
    "drop_ci",
}
BASELINES = ("dgms", "magnitude_kmeans", "uniform")


def _run(args: list[str]) -> int:
    return main(["run", "--suite", "default", *args])


def test_smoke_baselines_write_json_and_a_report(fake_data_dir, tmp_path, capsys):
    out = tmp_path / "results"
    labels = [arg for m in BASELINES for arg in ("--label", m)]  # the distilled baselines, one run each
    assert _run(["--tier", "smoke", "--data-dir", str(fake_data_dir), "--out", str(out), *labels]) == 0
    files = sorted(out.glob("*.json"))
    assert [f.stem.split("__")[-1] for f in files] == list(BASELINES)
    for path in files:
        result = json.loads(path.read_text())
        assert set(result["metrics"]) >= METRICS and result["tier"] == "smoke"
        assert {"platform", "cpu_count", "torch"} <= set(result["machine"]) and "git_commit" in result
        m = result["metrics"]
        assert m["compression_rate_file"] is None and m["test_images"] == 30
        assert m["drop"] == pytest.approx(m["fp32_acc"] - m["acc"])
        assert m["drop_ci"][0] <= m["drop"] <= m["drop_ci"][1]
        assert result["config"]["epochs"] == 1 and result["wall_time_s"] > 0
        assert len(result["predictions"]["fp32"]) == 30
    assert "table1_resnet20__resnet20__uniform" in capsys.readouterr().out
    assert main(["report", "--results", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "| uniform | P+Q | 2 | 50.0 |" in report and "Reported by the paper" in report
    assert (out / "table1_resnet20.png").stat().st_size > 0


def test_missing_data_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SQS_DATA_DIR", raising=False)
    assert _run(["--tier", "smoke", "--out", str(tmp_path)]) == 2
    assert "SQS_DATA_DIR" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert _run(["--tier", "smoke", "--data-dir", str(tmp_path / "empty"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "data_batch_1" in err and "cs.toronto.edu" in err


def test_paper_tier_refuses_partial_data_before_computing(fake_data_dir, tmp_path, capsys):
    assert _run(["--tier", "paper", "--data-dir", str(fake_data_dir), "--out", str(tmp_path)]) == 2
    assert "50,000" in capsys.readouterr().err and not list(tmp_path.glob("*.json"))


def test_paper_tier_ablations_need_timm(fake_data_dir, tmp_path, capsys):
    try:
        import timm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("timm is installed here")
    args = ["run", "--suite", "cifar10", "--tier", "paper", "--recipe", "ablation_prior"]
    assert main([*args, "--data-dir", str(fake_data_dir), "--out", str(tmp_path)]) == 2
    assert "timm" in capsys.readouterr().err


def test_smoke_sqs_runs_through_the_cli(fake_data_dir, tmp_path):
    out = tmp_path / "sqs"
    assert _run(["--tier", "smoke", "--data-dir", str(fake_data_dir), "--out", str(out), "--method", "sqs"]) == 0
    result = json.loads((out / "table1_resnet20__resnet20__sqs.json").read_text())
    assert [e["name"] for e in result["evaluations"]] == ["greedy", "bayes_M4"]
    assert result["metrics"]["inference"] == "bayes_M4" and result["metrics"]["nonzero"] == 0.5
    assert result["metrics"]["compression_rate_file"] > 1 and result["metrics"]["compression_rate_paper"] > 1
    artifact = out / "artifacts" / "table1_resnet20__resnet20__sqs.sqs"
    assert artifact.is_file()
    # the file alone reproduces the greedy model: same predictions on the same test images
    skeleton = sqs.load(artifact, build_model("resnet20"))
    test_x = load_splits(fake_data_dir, val_fraction=0.1, seed=0).test_x
    greedy = result["predictions"]["greedy"]
    assert predict(skeleton, test_x[: len(greedy)]).tolist() == greedy


def test_the_commit_is_read_once_per_suite_before_any_run(fake_data_dir, tmp_path, monkeypatch):
    """A commit made while a long suite runs must not be recorded for runs of the code loaded before it."""
    from sqs_bench import runner

    commits = iter(["commit-at-start", "commit-made-later", "commit-made-even-later"])
    monkeypatch.setattr(runner, "git_commit", lambda: next(commits))
    out = tmp_path / "results"
    args = ["--tier", "smoke", "--data-dir", str(fake_data_dir), "--out", str(out), "--label", "uniform"]
    assert _run([*args, "--label", "magnitude_kmeans"]) == 0
    assert {json.loads(p.read_text())["git_commit"] for p in out.glob("*.json")} == {"commit-at-start"}
