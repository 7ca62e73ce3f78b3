"""``run --resume`` continues an interrupted suite: results already in --out of runs configured as now are kept
(not recomputed, their files untouched), the missing runs are run; a result of another tier or configuration,
or an unreadable one, is refused before any compute, naming it."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import sqs_core as sqs
import torch
from conftest import write_fake_checkpoint, write_fake_cifar
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


@pytest.fixture
def other_data(tmp_path) -> Path:
    """A data folder holding other CIFAR images and labels, with the same checkpoint file."""
    root = tmp_path / "other_data"
    write_fake_cifar(root, seed=1)
    write_fake_checkpoint(root)
    return root


def test_resume_refuses_a_result_computed_on_other_data(fake_data_dir, interrupted, other_data, capsys):
    """The data folder was neither recorded nor compared: results on two test sets ended up in one table."""
    capsys.readouterr()
    assert _run(other_data, interrupted, *BOTH, "--resume") == 2
    err = capsys.readouterr().err
    assert UNIFORM in err and "other data" in err and "--overwrite" in err
    assert not (interrupted / f"{KMEANS}.json").exists()  # nothing computed


def test_resume_refuses_a_result_computed_with_another_checkpoint(fake_data_dir, interrupted, tmp_path, capsys):
    data = tmp_path / "same_data_other_checkpoint"
    shutil.copytree(fake_data_dir, data)
    write_fake_checkpoint(data, seed=1)  # same file name, other weights
    capsys.readouterr()
    assert _run(data, interrupted, *BOTH, "--resume") == 2
    err = capsys.readouterr().err
    assert UNIFORM in err and "other checkpoint" in err and "resnet20-00000000.th" in err


def test_a_result_records_its_data_and_checkpoint(fake_data_dir, interrupted):
    result = json.loads((interrupted / f"{UNIFORM}.json").read_text())
    checkpoint = fake_data_dir / "resnet-cifar10" / "resnet20-00000000.th"
    assert result["checkpoint"] == {
        "path": str(checkpoint),
        "sha256": hashlib.sha256(checkpoint.read_bytes()).hexdigest(),
    }
    assert (result["data"]["train"], result["data"]["val"], result["data"]["test"]) == (90, 10, 30)
    labels = torch.tensor(result["predictions"]["labels"], dtype=torch.int64).numpy().tobytes()
    assert result["data"]["test_labels_sha256"] == hashlib.sha256(labels).hexdigest()


def test_resume_keeps_a_result_written_before_fingerprints_were_recorded(fake_data_dir, interrupted, caplog):
    first = interrupted / f"{UNIFORM}.json"
    older = {k: v for k, v in json.loads(first.read_text()).items() if k not in ("data", "checkpoint")}
    first.write_text(json.dumps(older))
    with caplog.at_level(logging.INFO, logger="sqs_bench.resume"):
        assert _run(fake_data_dir, interrupted, *BOTH, "--resume") == 0
    assert json.loads(first.read_text()) == older  # kept, untouched
    assert any(
        "records no data or checkpoint fingerprint" in r.message and r.levelname == "INFO" for r in caplog.records
    )


def test_the_committed_results_are_kept_by_resume():
    """docs/results/cifar10_runs (written before fingerprints were recorded): all kept, no input compared."""
    from sqs_bench.resume import check_inputs, split_done
    from sqs_bench.runner import SCHEMA_VERSION, suite_configs

    configs = suite_configs("cifar10", "cpu")
    kept, todo = split_done(configs, Path(__file__).parents[2] / "docs/results/cifar10_runs", schema=SCHEMA_VERSION)
    assert len(kept) == 46 and todo == []
    check_inputs(kept, configs, lambda config: pytest.fail("nothing recorded to compare"))
