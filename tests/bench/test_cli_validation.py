"""The CLI refuses bad input with a one-line error naming the bad value, before any compute, and never
leaves a half-written or silently replaced result."""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqs_bench import runner
from sqs_bench.__main__ import main
from sqs_bench.data import DataNotFoundError, load_cifar10

RUN_ID = "table1_resnet20__resnet20__uniform"


def _run(data_dir: Path, out: Path, *extra: str) -> int:
    return main(["run", "--tier", "smoke", "--data-dir", str(data_dir), "--out", str(out), *extra])


def _error(capsys) -> str:
    """The one line the CLI printed on stderr, which must start with ``error:``."""
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def smoke_result(fake_data_dir, tmp_path_factory) -> dict:
    """One real smoke result (uniform, the quickest method), loaded from its JSON file."""
    out = tmp_path_factory.mktemp("smoke")
    assert _run(fake_data_dir, out, "--method", "uniform") == 0
    return json.loads((out / f"{RUN_ID}.json").read_text())


def _write(folder: Path, result: dict, name: str = f"{RUN_ID}.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(result))
    return folder / name


def test_rerun_refuses_to_replace_a_result_unless_overwrite(fake_data_dir, tmp_path, capsys, caplog):
    out = tmp_path / "runs"
    assert _run(fake_data_dir, out, "--method", "uniform") == 0
    path = out / f"{RUN_ID}.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"tier": "cpu"}))  # a cpu result of the same id
    before = path.read_bytes()
    capsys.readouterr()
    assert _run(fake_data_dir, out, "--method", "uniform") == 2
    err = _error(capsys)
    assert RUN_ID in err and "tier cpu" in err and "--overwrite" in err
    assert path.read_bytes() == before
    assert _run(fake_data_dir, out, "--method", "uniform", "--overwrite") == 0
    assert json.loads(path.read_text())["tier"] == "smoke"
    assert any("replacing" in r.message and r.levelname == "WARNING" for r in caplog.records)


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))  # the result JSON is larger


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="needs RLIMIT_FSIZE")
def test_a_write_failing_midway_leaves_no_partial_result(fake_data_dir, tmp_path):
    out = tmp_path / "runs"
    out.mkdir()
    args = ["run", "--tier", "smoke", "--data-dir", str(fake_data_dir), "--out", str(out), "--method", "uniform"]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "sqs_bench", *args, "--threads", "1"],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=_limit_file_size,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().startswith("error: could not write") and RUN_ID in proc.stderr
    assert list(out.iterdir()) == []  # neither a truncated result nor a temporary file


@pytest.mark.parametrize("kind", ["file", "under_a_file"])
def test_a_bad_out_fails_before_any_compute(fake_data_dir, tmp_path, capsys, monkeypatch, kind):
    def computed(*args, **kwargs):
        raise AssertionError("compute started before --out was checked")

    monkeypatch.setattr(runner, "load_splits", computed)
    monkeypatch.setattr(runner, "_run_method", computed)
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" if kind == "file" else tmp_path / "afile" / "sub"
    assert _run(fake_data_dir, out, "--method", "uniform") == 2
    err = _error(capsys)
    assert str(out) in err and ("is not a folder" in err if kind == "file" else "cannot be created" in err)


@pytest.mark.parametrize("threads", ["0", "-1", "two"])
def test_threads_below_one_is_an_argument_error(fake_data_dir, tmp_path, capsys, threads):
    with pytest.raises(SystemExit) as exit_:
        _run(fake_data_dir, tmp_path, "--threads", threads)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--threads" in err and ">= 1" in err and threads in err and "Traceback" not in err


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 2], lambda b: b"\x80\x04garbage" + bytes(100)])
def test_a_corrupted_cifar_batch_names_the_file_and_says_to_download_again(fake_data_dir, tmp_path, capsys, damage):
    data = tmp_path / "data"
    shutil.copytree(fake_data_dir, data)
    batch = data / "cifar-10-batches-py" / "data_batch_5"
    batch.write_bytes(damage(batch.read_bytes()))
    with pytest.raises(DataNotFoundError, match=r"data_batch_5.*corrupted.*download"):
        load_cifar10(data, train=True)
    assert _run(data, tmp_path / "out", "--method", "uniform") == 2
    assert str(batch) in _error(capsys)


@pytest.mark.parametrize("flag", ["--recipe", "--label", "--model"])
def test_an_unknown_filter_value_is_named_with_the_known_ones(fake_data_dir, tmp_path, capsys, flag):
    assert _run(fake_data_dir, tmp_path / "out", flag, "nosuch") == 2
    err = _error(capsys)
    assert f"unknown {flag} 'nosuch'" in err and "known:" in err
    assert {"--recipe": "table1_resnet20", "--label": "magnitude_kmeans", "--model": "resnet20"}[flag] in err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.json"))


def test_a_data_dir_that_is_a_file_is_not_a_folder(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert _run(tmp_path / "afile", tmp_path / "out", "--method", "uniform") == 2
    err = _error(capsys)
    assert "afile is not a folder" in err and "does not exist" not in err


def test_a_run_refused_for_missing_data_creates_no_output_folder(tmp_path, capsys):
    """The output folder is created only after every check that can refuse the run (it was created first)."""
    out = tmp_path / "new" / "out"
    assert _run(tmp_path / "nodata", out, "--method", "uniform") == 2
    assert "does not exist" in _error(capsys)
    assert not (tmp_path / "new").exists()


def _nan_acc(result: dict) -> None:
    result["metrics"]["acc"] = math.nan


def _no_drop_ci(result: dict) -> None:
    del result["metrics"]["drop_ci"]


def _reversed_drop_ci(result: dict) -> None:
    low, high = result["metrics"]["drop_ci"]
    result["metrics"]["drop_ci"] = [high + 5.0, low]


def _acc_string(result: dict) -> None:
    result["evaluations"][0]["acc"] = "92"


def _metrics_list(result: dict) -> None:
    result["metrics"] = []


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (_nan_acc, "'metrics.acc' must be a finite number"),
        (_no_drop_ci, "missing key 'metrics.drop_ci'"),
        (_reversed_drop_ci, "'metrics.drop_ci' must be a [low, high] pair of finite numbers with low <= high"),
        (_acc_string, "'evaluations[0].acc' must be a finite number"),
        (_metrics_list, "'metrics' must be an object"),
    ],
)
def test_report_refuses_a_damaged_result_naming_file_and_key(smoke_result, tmp_path, capsys, mutate, field):
    result = json.loads(json.dumps(smoke_result))
    mutate(result)
    path = _write(tmp_path / "runs", result)
    assert main(["report", "--results", str(tmp_path / "runs")]) == 2
    err = _error(capsys)
    assert str(path) in err and field in err
    assert not (tmp_path / "runs" / "report.md").exists() and not (tmp_path / "runs" / "results.json").exists()


def test_report_refuses_garbage_json_naming_the_file(smoke_result, tmp_path, capsys):
    _write(tmp_path / "runs", smoke_result)
    (tmp_path / "runs" / "broken.json").write_text("{not json")
    assert main(["report", "--results", str(tmp_path / "runs")]) == 2
    assert "broken.json is not readable JSON" in _error(capsys)


def test_report_refuses_results_of_two_tiers(smoke_result, tmp_path, capsys):
    _write(tmp_path / "runs" / "smoke", smoke_result)
    _write(tmp_path / "runs" / "cpu", smoke_result | {"tier": "cpu"})
    assert main(["report", "--results", str(tmp_path / "runs")]) == 2
    err = _error(capsys)
    assert "more than one tier" in err and "cpu:" in err and "smoke:" in err and "one tier's folder" in err
    assert main(["report", "--results", str(tmp_path / "runs" / "cpu")]) == 0


def test_report_refuses_two_results_of_the_same_run(smoke_result, tmp_path, capsys):
    first = _write(tmp_path / "runs" / "a", smoke_result)
    second = _write(tmp_path / "runs" / "b", smoke_result)
    assert main(["report", "--results", str(tmp_path / "runs")]) == 2
    err = _error(capsys)
    assert "two results of the same run" in err and str(first) in err and str(second) in err


def test_report_out_that_is_a_file_is_an_error(smoke_result, tmp_path, capsys):
    _write(tmp_path / "runs", smoke_result)
    (tmp_path / "afile").write_text("x")
    assert main(["report", "--results", str(tmp_path / "runs"), "--out", str(tmp_path / "afile")]) == 2
    assert "afile is not a folder" in _error(capsys)


def test_atomic_writes_keep_the_usual_file_mode(tmp_path):
    """A result file gets 0o666 less the umask, as before writes were atomic (mkstemp would give 0o600)."""
    from sqs_bench.results import write_atomic

    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "r.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644


def test_atomic_writes_follow_a_symlink_and_refuse_a_folder(tmp_path):
    """Result files go through sqs-core's writer: a symlinked result file has its target rewritten (the link
    stays), and a folder where the file should be is an OutputFolderError naming it, left untouched."""
    from sqs_bench.results import OutputFolderError, write_atomic

    (tmp_path / "target.json").write_text("old")
    (tmp_path / "r.json").symlink_to(tmp_path / "target.json")
    write_atomic(tmp_path / "r.json", "{}")
    assert (tmp_path / "r.json").is_symlink() and (tmp_path / "target.json").read_text() == "{}"
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(OutputFolderError, match=r"folder\.json"):
        write_atomic(tmp_path / "folder.json", "{}")
    assert (tmp_path / "folder.json").is_dir() and not any((tmp_path / "folder.json").iterdir())
