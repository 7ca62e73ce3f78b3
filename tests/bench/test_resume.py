"""``run --resume`` continues an interrupted suite: results already in --out of runs configured as now are kept
(not recomputed, their files untouched), the missing runs are run; a result of another tier or configuration,
or an unreadable one, is refused before any compute, naming it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import sqs_core as sqs
from sqs_bench.__main__ import main

UNIFORM = "table1_resnet20__resnet20__uniform"
KMEANS = "table1_resnet20__resnet20__magnitude_kmeans"
BOTH = ("--method", "uniform", "--method", "magnitude_kmeans")


def _run(data_dir: Path, out: Path, *extra: str) -> int:
    return main(["run", "--tier", "smoke", "--data-dir", str(data_dir), "--out", str(out), *extra])


@pytest.fixture
def interrupted(fake_data_dir, tmp_path) -> Path:
    """An --out folder holding the first of the two runs: a suite stopped after it."""
    out = tmp_path / "runs"
    assert _run(fake_data_dir, out, "--method", "uniform") == 0
    return out


def test_resume_keeps_the_finished_run_and_runs_the_rest(fake_data_dir, interrupted, capsys):
    first = interrupted / f"{UNIFORM}.json"
    before, stamp = first.read_bytes(), first.stat().st_mtime_ns
    capsys.readouterr()
    assert _run(fake_data_dir, interrupted, *BOTH, "--resume") == 0
    printed = capsys.readouterr().out
    assert first.read_bytes() == before and first.stat().st_mtime_ns == stamp  # not run again
    assert json.loads((interrupted / f"{KMEANS}.json").read_text())["run_id"] == KMEANS
    assert f"{KMEANS}:" in printed and f"{UNIFORM}:" not in printed
    assert "1 result(s) written" in printed and "(1 kept from an earlier run)" in printed
    assert _run(fake_data_dir, interrupted, *BOTH, "--resume") == 0  # all done: nothing to run
    assert "0 result(s) written" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda r: r | {"tier": "cpu"}, r"tier 'cpu', this run's is 'smoke'"),
        (lambda r: r | {"config": r["config"] | {"epochs": 7}}, r"another configuration \(differs in epochs\)"),
        (lambda r: r | {"schema": 0}, r"schema 0"),
        (lambda r: "{ not json", r"unreadable"),
    ],
)
def test_resume_refuses_a_result_that_is_not_this_runs(fake_data_dir, interrupted, capsys, edit, reason):
    first = interrupted / f"{UNIFORM}.json"
    edited = edit(json.loads(first.read_text()))
    first.write_text(edited if isinstance(edited, str) else json.dumps(edited))
    before = first.read_bytes()
    capsys.readouterr()
    assert _run(fake_data_dir, interrupted, *BOTH, "--resume") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --resume keeps only") and UNIFORM in err and "--overwrite" in err
    assert re.search(reason, err), err
    assert first.read_bytes() == before and not (interrupted / f"{KMEANS}.json").exists()  # nothing computed


def test_resume_and_overwrite_exclude_each_other(fake_data_dir, interrupted, capsys):
    assert _run(fake_data_dir, interrupted, *BOTH, "--resume", "--overwrite") == 2
    assert "exclude each other" in capsys.readouterr().err
    assert not (interrupted / f"{KMEANS}.json").exists()


def test_resume_replaces_the_artifact_an_interrupted_run_left(fake_data_dir, tmp_path, capsys):
    """An SQS run stopped after writing its artifact and before its result: without --resume the artifact is
    refused as an existing output, with it the run is run again and the artifact replaced."""
    out = tmp_path / "runs"
    artifact = out / "artifacts" / "table1_resnet20__resnet20__sqs.sqs"
    artifact.parent.mkdir(parents=True)
    artifact.write_bytes(b"half a file")
    assert _run(fake_data_dir, out, "--method", "sqs") == 2
    assert "--overwrite" in capsys.readouterr().err and artifact.read_bytes() == b"half a file"
    assert _run(fake_data_dir, out, "--method", "sqs", "--resume") == 0
    assert sqs.compression_report(artifact).compressed_weights > 0  # a whole artifact now
    assert json.loads((out / "table1_resnet20__resnet20__sqs.json").read_text())["metrics"]["nonzero"] == 0.5
