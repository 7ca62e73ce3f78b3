"""What ``report`` writes and refuses: the committed report reproduced byte for byte, no result overwritten by a
summary, no stale output of an earlier report left beside a new one, every machine named, no table mixing
test sets, no paper row the plot cannot draw."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sqs_bench.__main__ import main
from sqs_bench.config import expand_recipe, load_recipe
from sqs_bench.report import build_report
from sqs_bench.results import ResultFileError
from test_report import _fake_result

COMMITTED = Path(__file__).parents[2] / "docs" / "results"


def _write_recipe(folder: Path, recipe: str, *, edit=lambda i, result: result) -> list[Path]:
    """Fake results of every cpu run of ``recipe`` (``edit(i, result)`` may change each) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, config in enumerate(expand_recipe(load_recipe(recipe), "cpu")):
        path = folder / f"{config['run_id']}.json"
        path.write_text(json.dumps(edit(i, _fake_result(config, drop=1.0 + i))))
        paths.append(path)
    return paths


def test_the_committed_report_is_reproduced_from_the_committed_runs(tmp_path):
    out = tmp_path / "report"
    build_report(COMMITTED / "cifar10_runs", out, prefix="cifar10")
    for path in sorted(out.iterdir()):
        assert path.read_bytes() == (COMMITTED / path.name).read_bytes(), path.name


def test_a_prefix_that_would_overwrite_a_result_is_refused(tmp_path):
    """``--prefix <run id>`` with the default --out replaced that result by the Table 1 summary."""
    paths = _write_recipe(tmp_path, "table1_resnet20")
    before = {p: p.read_bytes() for p in paths}
    with pytest.raises(ValueError, match="would overwrite the result file") as err:
        build_report(tmp_path, prefix=paths[0].stem)
    assert str(paths[0]) in str(err.value)
    assert {p: p.read_bytes() for p in paths} == before and not (tmp_path / "report.md").exists()


def test_a_second_report_removes_the_outputs_of_the_first_it_does_not_rewrite(tmp_path):
    first, second, out = tmp_path / "first", tmp_path / "second", tmp_path / "out"
    _write_recipe(first, "table1_resnet20")
    _write_recipe(second, "ablation_prior")
    (out / "keep").mkdir(parents=True)
    (out / "unrelated.png").write_bytes(b"not ours")
    build_report(first, out)
    assert (out / "table1_resnet20.png").exists() and (out / "results.json").exists()
    build_report(second, out)
    assert sorted(p.name for p in out.iterdir()) == [
        "ablation_prior.png",
        "keep",
        "report.md",
        "results_ablations.json",
        "unrelated.png",
    ]


def test_every_machine_is_named_with_its_threads(tmp_path):
    """The first result's machine was printed as the machine of all."""

    def edit(i: int, result: dict) -> dict:
        big = {"platform": "Linux-big", "cpu_count": 64, "torch": "2.0", "torch_threads": 16}
        small = {"platform": "Linux-small", "cpu_count": 2, "torch": "2.0", "torch_threads": 1}
        return result | {"machine": big if i == 2 else small}

    _write_recipe(tmp_path, "table1_resnet20", edit=edit)
    text = build_report(tmp_path).read_text()
    assert "Machines (2," in text
    assert "Linux-small, 2 CPUs, torch 2.0, 1 torch thread(s) (6 results)" in text
    assert "Linux-big, 64 CPUs, torch 2.0, 16 torch thread(s) (1 results)" in text


@pytest.mark.parametrize(
    ("field", "edit"),
    [
        ("metrics.test_images", lambda r: r["metrics"].update(test_images=64)),
        ("metrics.fp32_acc", lambda r: r["metrics"].update(fp32_acc=88.0)),
        ("predictions.labels", lambda r: r.update(predictions={"labels": [1, 0]})),
        ("data.test_labels_sha256", lambda r: r.update(data={"test_labels_sha256": "other"})),
    ],
)
def test_a_recipe_whose_results_disagree_on_the_test_set_is_refused(tmp_path, field, edit):
    def changed(i: int, result: dict) -> dict:
        result |= {"predictions": {"labels": [0, 1]}, "data": {"test_labels_sha256": "same"}}
        if i == 3:
            edit(result)
        return result

    paths = _write_recipe(tmp_path, "table1_resnet20", edit=changed)
    with pytest.raises(ResultFileError, match=f"disagree on {field}") as err:
        build_report(tmp_path)
    named = [p for p in paths if str(p) in str(err.value)]
    assert len(named) == 2 and paths[3] in named  # the odd one out and one it disagrees with


@pytest.mark.parametrize(
    "row",
    [
        {"method": "SQS", "compression_rate": 32},  # no drop
        {"method": "SQS", "compression_rate": None, "drop": 1.0},
        {"method": "SQS", "compression_rate": [16, 32], "drop": 1.0},
    ],
)
def test_a_paper_row_the_plot_cannot_draw_is_refused_naming_it(tmp_path, row):
    def edit(i: int, result: dict) -> dict:
        return result | {"paper": result["paper"] | {"rows": [row]}}

    _write_recipe(tmp_path, "table1_resnet20", edit=edit)
    with pytest.raises(ResultFileError, match=r"paper\.rows\[0\]\.(drop|compression_rate)"):
        build_report(tmp_path)


@pytest.mark.parametrize(
    "command",
    [["run", "--tier", "smoke", "--out", ""], ["report", "--results", ""], ["report", "--results", "x", "--out", " "]],
)
def test_an_empty_folder_argument_is_refused(tmp_path, monkeypatch, capsys, command):
    """``--out ""`` is Path("."): results and reports went into the current folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SQS_DATA_DIR", raising=False)  # were the refusal lost, no suite could start computing
    with pytest.raises(SystemExit) as exit_:
        main(command)
    assert exit_.value.code == 2 and "expected a folder path" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_committed_results_folder_keeps_every_other_file_when_reported_in_place(tmp_path):
    """docs/results holds other benchmarks' files: re-reporting into it removes nothing of theirs."""
    folder = tmp_path / "results"
    shutil.copytree(COMMITTED, folder)
    before = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    build_report(folder / "cifar10_runs", folder, prefix="cifar10")
    assert {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
