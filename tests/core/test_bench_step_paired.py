"""packages/sqs-core/benchmarks/bench_step_paired.py end to end on a tiny case: every step's ratio to the plain step
of its round, the windowed medians and the run's total-time ratio computed from them; bad arguments stop it before
any work. (The figures it measures belong in docs/, never in a test.)"""

from __future__ import annotations

import json
from statistics import median

import pytest
from benchmark_scripts import run_benchmark


def run_script(*args: str):
    return run_benchmark("bench_step_paired.py", *args)


def test_reports_window_medians_and_the_run_ratio(tmp_path):
    out = tmp_path / "paired.json"
    args = ("--only", "resnet20:2", "--modes", "sqs", "--steps", "15", "--window", "6", "--prune-to", "0.5")
    done = run_script(*args, "--out", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    sqs, plain = result["sqs"], result["plain"]
    ratios = [t / p for t, p in zip(sqs["steps_s"], plain["steps_s"], strict=True)]
    assert sqs["ratios"] == pytest.approx(ratios) and len(ratios) == 15
    assert sqs["window_ratios"] == pytest.approx([median(ratios[:6]), median(ratios[6:12]), median(ratios[12:])])
    assert sqs["run_time_ratio"] == pytest.approx(sum(sqs["steps_s"][1:]) / sum(plain["steps_s"][1:]))
    assert result["window"] == 6 and "windows of 6 steps" in done.stdout


@pytest.mark.parametrize(("args", "named"), [(("--window", "0"), "--window"), (("--steps", "14"), "--steps")])
def test_bad_arguments_stop_before_any_work(tmp_path, args, named):
    out = tmp_path / "paired.json"
    done = run_script("--only", "resnet20:2", *args, "--out", str(out))
    assert done.returncode == 2 and named in done.stderr
    assert not out.exists()
