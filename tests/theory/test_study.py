"""The convergence study's bookkeeping (session 64's audit): which fit failed, NaN and zero values in the
summaries, the standard errors and the bootstrap, the provenance of a run, and the size guards."""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sqs_theory import convergence, risk, student, synthetic
from sqs_theory.__main__ import main
from sqs_theory._json import jsonable
from sqs_theory.checks import random_posterior
from sqs_theory.convergence import Tier, fit_point, machine_info, run_study
from sqs_theory.docs import convergence_block
from sqs_theory.hspace import project_brute

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "results" / "theory" / "convergence.json"
MAIN = "spike_slab/projection/moment_matched"


# --- F7: a failed fit names itself; FloatingPointError is a CLI error; NaN and 0 are counted --------------
def test_a_diverged_fit_names_n_seed_and_variant():
    """A learning rate of 1e8 makes sqs-core's posterior non-finite: its FloatingPointError had aborted the study
    without saying which fit it was."""
    tier = Tier(name="div", ns=(32,), seeds=(0,), steps=20, fp_restarts=1, fp_max_iter=5, draws=2, n_test=64,
                projection_starts=1, quant_lr=1e8, gate_lr=1e8)  # fmt: skip
    with pytest.raises(FloatingPointError, match=rf"\(at n=32, seed=0, variant {MAIN}\)$"):
        fit_point(tier, 32, 0)


def test_the_cli_reports_a_floating_point_error(capsys, tmp_path, monkeypatch):
    def diverged(_tier):
        raise FloatingPointError("the posterior of layer '0' holds NaN (at n=64, seed=0, variant x)")

    monkeypatch.setattr(convergence, "run_study", diverged)
    assert main(["convergence", "--tier", "tiny", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the posterior") and "n=64, seed=0" in err and "Traceback" not in err


def _fake_points(values: dict[int, list[float]], level=None) -> list[dict]:
    """Points of the study variant with the given d² per n (no compute)."""
    out = []
    for n, ds in values.items():
        for seed, d in enumerate(ds):
            acc = level(n, seed) if level else 1.0
            out.append({"n": n, "seed": seed, "variant": MAIN, **dict.fromkeys(convergence.ESTIMATORS, d),
                        "support_exact": True, "false_positive": 0, "level_accuracy": acc})  # fmt: skip
    return out


def _run_faked(monkeypatch, values, **kwargs) -> dict:
    tier = Tier(name="fake", ns=tuple(values), seeds=tuple(range(len(next(iter(values.values()))))), draws=2)
    points = _fake_points(values, **kwargs)
    monkeypatch.setattr(
        convergence, "fit_point", lambda t, n, seed: [q for q in points if (q["n"], q["seed"]) == (n, seed)]
    )
    return run_study(tier)


def test_the_summary_counts_the_undefined_level_accuracies(monkeypatch):
    """nanmean had dropped them silently; the docs table shows the count."""
    values = {64: [0.1, 0.2, 0.3], 128: [0.05, 0.06, 0.07], 256: [0.01, 0.02, 0.03]}
    undefined = ((64, 0), (64, 2))  # no true weight kept: level accuracy NaN
    result = _run_faked(
        monkeypatch, values, level=lambda n, seed: math.nan if (n, seed) in undefined else 0.5 + seed / 4
    )
    rows = {r["n"]: r for r in result["summary"]}
    assert rows[64]["level_accuracy_undefined"] == 2 and rows[64]["level_accuracy_mean"] == 0.75
    assert rows[128]["level_accuracy_undefined"] == 0 and rows[128]["level_accuracy_mean"] == 0.75
    result = json.loads(json.dumps(jsonable(result)))  # as written: NaN -> null
    result.update(machine={"processor": "x", "cpu_count": 1, "torch": "t"}, wall_time_s=1.0)
    for q in result["points"]:
        q.update(hellinger_sq_x_se=None, hellinger_sq_se=0.0, support_kept_from_init=True,
                 gate_logit_kept_min=None, gate_logit_pruned_max=-20.0)  # fmt: skip
    block = convergence_block(result)
    assert "| 0.75 (2 of 3 undefined) |" in block and "| 0.75 |" in block


def test_an_exact_zero_is_counted_and_logged_where_the_slopes_clamp_it(monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="sqs_theory.summary"):
        result = _run_faked(monkeypatch, {64: [0.1, 0.2], 128: [0.05, 0.0], 256: [0.01, 0.02]})
    fit = result["slopes"][MAIN]["hellinger_sq"]
    assert fit["zeros_clamped"] == 1 and result["slopes"][MAIN]["hellinger_sq_fp"]["zeros_clamped"] == 1
    assert "1 of 6 d² values are exactly 0" in caplog.text


# --- F10: standard errors with ddof = 1; the bootstrap only with >= 5 fits per n -------------------------
@given(st.lists(st.floats(0, 1), min_size=2, max_size=40))
def test_the_standard_error_uses_the_sample_deviation(values):
    mean, se = risk._mean_sd(values)
    m = len(values)
    reference = math.sqrt(sum((v - mean) ** 2 for v in values) / (m - 1) / m)
    assert se == pytest.approx(reference, rel=1e-9, abs=1e-15)


def test_one_value_has_no_standard_error_and_one_draw_is_refused():
    assert math.isnan(risk._mean_sd([0.3])[1])
    assert risk._mean_sd([0.0, 1.0])[1] == pytest.approx(0.5)  # ddof = 0 gave 0.354
    teacher = synthetic.make_teacher(4, 6, seed=0)
    x, y = synthetic.sample_data(teacher, 16, 0.1, torch.Generator().manual_seed(0))
    model = student.fit_student(teacher, x, y, sigma=0.1, density=0.6, spec=student.StudentSpec(steps=2))
    with pytest.raises(ValueError, match=r"^draws must be an integer >= 2, got 1 \(in risk_summary\)$"):
        risk.risk_summary(model, x, risk.predict(teacher, x), sigma=0.1, density=0.6, draws=1,
                          generator=torch.Generator())  # fmt: skip


@pytest.mark.parametrize(("fits", "reported"), [(2, False), (4, False), (5, True)])
def test_the_bootstrap_interval_needs_five_fits_per_n(monkeypatch, fits, reported):
    rng = np.random.default_rng(fits)
    values = {n: list(n**-1.0 * np.exp(rng.normal(0, 0.3, fits))) for n in (64, 128, 256)}
    result = _run_faked(monkeypatch, values)
    assert result["slope"] is not None and (result["slope_ci_bootstrap"] is not None) == reported


# --- F4: the provenance of a run -------------------------------------------------------------------------
def test_machine_info_records_the_cpu_threads_and_their_settings(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    info = machine_info()
    assert info["thread_env"]["OMP_NUM_THREADS"] == "1" and info["thread_env"]["MKL_NUM_THREADS"] == "3"
    assert info["torch_threads"] == torch.get_num_threads()
    assert info["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    if os.path.exists("/proc/cpuinfo") and "model name" in Path("/proc/cpuinfo").read_text():
        assert info["cpu_model"] in Path("/proc/cpuinfo").read_text() and info["cpu_model"] != "x86_64"


def test_cpu_model_reads_cpuinfo_and_falls_back_to_platform(tmp_path):
    from sqs_theory.provenance import cpu_model

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Example CPU @ 3.0GHz\n")
    assert cpu_model(cpuinfo) == "Example CPU @ 3.0GHz"
    assert cpu_model(tmp_path / "absent") and cpu_model(tmp_path / "absent") != "Example CPU @ 3.0GHz"


def test_the_help_says_when_results_reproduce():
    out = subprocess.run([sys.executable, "-m", "sqs_theory", "convergence", "--help"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert "bit-reproducible only on the same CPU" in " ".join(out.split()) and "--threads" in out


# --- F8: the teacher's pairs by index arithmetic; T bounded ---------------------------------------------
def _teacher_with_the_list(p: int, width: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The teacher as built before session 64: the list of every ordered pair."""
    rng = np.random.default_rng(seed)
    pairs = list(itertools.permutations(range(p), 2))
    chosen = rng.choice(len(pairs), size=width, replace=False)
    positive = [v for v in synthetic.LEVELS if v > 0]
    w1, w2 = np.zeros((width, p)), np.zeros((1, width))
    for j, index in enumerate(chosen):
        a, b = pairs[index]
        w1[j, a], w1[j, b] = rng.choice(positive), -rng.choice(positive)
        w2[0, j] = rng.choice(synthetic.LEVELS)
    return w1, w2


@given(st.integers(2, 9).flatmap(lambda p: st.tuples(st.just(p), st.integers(1, p * (p - 1)))),
       st.integers(0, 2**32))  # fmt: skip
def test_the_teacher_is_the_same_as_before(shape, seed):
    (p, width), model = shape, synthetic.make_teacher(shape[0], shape[1], seed=seed)
    w1, w2 = _teacher_with_the_list(p, width, seed)
    first, last = synthetic.layers(model)
    assert np.array_equal(first.weight.numpy(), w1.astype(np.float32))
    assert np.array_equal(last.weight.numpy(), w2.astype(np.float32))


def test_the_teacher_does_not_list_every_pair():
    """p = 1000: the list of p(p - 1) pairs took ~60 MB (p = 1e9 had exhausted the memory)."""
    tracemalloc.start()
    try:
        synthetic.make_teacher(1000, 6, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000, peak
    with pytest.raises(ValueError, match=r"T = width·\(p\+1\) <= 1,000,000.*p=1000000000"):
        synthetic.make_teacher(10**9, 6)


# --- F11: named ValueErrors for project_brute's size and random_posterior's arguments -------------------
@pytest.mark.parametrize(("T", "s", "K"), [(13, 7, 3), (40, 20, 4)])
def test_project_brute_refuses_a_space_too_large_to_enumerate(T, s, K):
    with pytest.raises(ValueError, match=rf"T={T}, s={s}, K={K}"):
        project_brute(np.linspace(-1, 1, T), s=s, K=K, B=2.0)


@pytest.mark.parametrize(
    ("args", "name"),
    [((0, 4, 2), "rng"), ((np.random.RandomState(0), 4, 2), "rng"), ((None, -1, 2), "T"), ((None, 4, 0), "K")],
)
def test_random_posterior_names_a_bad_argument(args, name):
    rng, T, K = args
    rng = np.random.default_rng(0) if rng is None else rng
    with pytest.raises(ValueError, match=rf"^{name} must .*\(in random_posterior\)$"):
        random_posterior(rng, T, K, level_var=0.0)
