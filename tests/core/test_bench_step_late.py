"""packages/sqs-core/benchmarks/bench_step_late.py end to end on a tiny case: it trains and saves a scheduled
state, reloads it in processes of their own, and reports each round's ratio and the timed steps' peak; bad
arguments stop it before any work. (The figures it measures belong in docs/, never in a test.)"""

from __future__ import annotations

import json

import pytest
from benchmark_scripts import run_benchmark


def run_script(*args: str):
    return run_benchmark("bench_step_late.py", *args)


def test_trains_saves_and_times_each_mode_in_its_own_process(tmp_path):
    state, out = tmp_path / "state", tmp_path / "late.json"
    common = ("--only", "resnet20:4", "--steps", "4", "--prune-to", "0.5", "--warmup", "1", "--timed", "2")
    done = run_script(*common, "--rounds", "2", "--state", str(state), "--out", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert len(result["rounds"]) == 2 and [sorted(r) for r in result["rounds"]] == [["plain", "sqs"]] * 2
    for r in result["rounds"]:
        assert len(r["sqs"]["steps_s"]) == 3 and r["sqs"]["steps_peak_rss_mib"] > 0
        assert r["sqs"]["time_ratio"] == pytest.approx(r["sqs"]["step_s"] / r["plain"]["step_s"])
        assert r["plain"]["certified_fraction"] is None and 0 <= r["sqs"]["certified_fraction"] <= 1
    ratios = [r["sqs"]["time_ratio"] for r in result["rounds"]]
    assert result["summary"]["sqs"]["time_ratio_min"] == min(ratios)
    meta = json.loads((state / "meta.json").read_text())
    assert meta["steps"] == 4 and meta["nonzero"] == pytest.approx(0.5)  # the ramp ended inside the 4 steps
    again = run_script(*common, "--rounds", "1", "--state", str(state))
    assert again.returncode == 0 and "reusing the state" in again.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--only", "resnet20:0"), "--only"),
        (("--prune-to", "0"), "--prune-to"),
        (("--rounds", "0"), "--rounds"),
        (("--timed", "-1"), "--timed"),
    ],
)
def test_bad_arguments_stop_before_any_work(tmp_path, args, named):
    done = run_script(*args, "--state", str(tmp_path / "state"))
    assert done.returncode == 2 and named in done.stderr
    assert not (tmp_path / "state").exists()
