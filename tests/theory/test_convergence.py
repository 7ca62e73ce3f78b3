"""The Hellinger convergence study (issue 4 item 5): closed forms, rate fits, tiers, the CLI and the committed run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate
from sqs_theory.__main__ import main
from sqs_theory.convergence import ESTIMATORS, TIERS, Tier, fit_point
from sqs_theory.hellinger import (
    bootstrap_slope_ci,
    fit_slope,
    hellinger_sq,
    hellinger_sq_gaussian,
    parametric_reference,
)

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "theory"
finite = st.floats(-5, 5, allow_nan=False)
sigmas = st.floats(0.05, 2.0)


@given(st.lists(finite, min_size=1, max_size=20), sigmas)
def test_identical_functions_have_zero_distance(f, sigma):
    assert hellinger_sq(np.array(f), np.array(f), sigma) == 0.0


@given(finite, st.floats(0, 3), st.floats(0, 3), sigmas)
def test_increasing_in_the_gap(f0, a, b, sigma):
    lo, hi = sorted((a, b))
    d_lo, d_hi = hellinger_sq_gaussian(f0 + lo, f0, sigma), hellinger_sq_gaussian(f0 - hi, f0, sigma)
    assert d_lo <= d_hi + 1e-15 and 0.0 <= d_lo <= 1.0 and 0.0 <= d_hi <= 1.0


@settings(max_examples=25, deadline=None)
@given(st.floats(-2, 2), st.floats(-2, 2), st.floats(0.2, 2.0))
def test_matches_numerical_integration(f, f0, sigma):
    def dens(y, m):
        return np.exp(-((y - m) ** 2) / (2 * sigma**2)) / np.sqrt(2 * np.pi * sigma**2)

    bc, _ = integrate.quad(lambda y: np.sqrt(dens(y, f) * dens(y, f0)), -np.inf, np.inf)
    assert abs(float(hellinger_sq_gaussian(f, f0, sigma)) - (1.0 - bc)) < 1e-7


def test_sigma_must_be_positive():
    with pytest.raises(ValueError, match="sigma"):
        hellinger_sq(np.zeros(2), np.zeros(2), 0.0)


@given(st.floats(-2.5, -0.2), st.floats(-3, 3), st.integers(4, 8))
def test_slope_fit_recovers_exact_power_law(alpha, log_c, k):
    ns = np.geomspace(64, 64 * 2 ** (k - 1), k)
    fit = fit_slope(ns, np.exp(log_c) * ns**alpha)
    assert abs(fit["slope"] - alpha) < 1e-8
    lo, hi = fit["slope_ci"]
    assert lo - 1e-8 <= alpha <= hi + 1e-8


@settings(max_examples=15)
@given(st.floats(-2.0, -0.3), st.integers(3, 6), st.integers(2, 4), st.integers(0, 1000))
def test_bootstrap_interval_brackets_the_slope(alpha, k, reps, seed):
    """Exact power law: every resample has the same slope. Noisy: the interval holds the OLS slope."""
    ns = np.repeat(np.geomspace(64, 64 * 4 ** (k - 1), k), reps)
    lo, hi = bootstrap_slope_ci(ns, ns**alpha, resamples=50, seed=seed)
    assert lo == pytest.approx(alpha, abs=1e-8) and hi == pytest.approx(alpha, abs=1e-8)
    noisy = ns**alpha * np.exp(np.random.default_rng(seed).normal(0, 0.3, ns.size))
    lo, hi = bootstrap_slope_ci(ns, noisy, resamples=400, seed=seed)
    assert lo <= fit_slope(ns, noisy)["slope"] <= hi


def test_fits_reject_bad_input():
    with pytest.raises(ValueError, match="3 points"):
        fit_slope([64, 128], [1.0, 0.5])
    with pytest.raises(ValueError, match="finite"):
        fit_slope([64, 128, 256], [1.0, 0.0, 0.5])
    with pytest.raises(ValueError, match="two distinct"):
        bootstrap_slope_ci([64, 64, 64], [1.0, 0.9, 0.8])


_NAN = float("nan")


@pytest.mark.parametrize(
    ("ns", "values", "kwargs", "message"),
    [
        ([0, 1, 2, 4], [1, 2, 3, 4], {}, "ns"),  # log 0: the fit was NaN, silently
        ([-1, 1, 2, 4], [1, 2, 3, 4], {}, "ns"),
        ([_NAN, 1, 2, 4], [1, 2, 3, 4], {}, "ns"),
        ([1, 2, 4], [_NAN, 2, 3], {}, "values"),
        ([1, 2, 4], [0, 2, 3], {}, "values"),
        ([1, 2, 4, 8], [1, 2, 3], {}, "same length"),
        ([[1, 2], [4, 8]], [[1, 2], [3, 4]], {}, "1-D"),
        ([1, 2, 4], [1, 2, 3], {"level": 2}, "level"),  # the interval was [nan, nan]
        ([1, 2, 4], [1, 2, 3], {"level": _NAN}, "level"),
        ([1, 2, 4], [1, 2, 3], {"resamples": 2.5}, "resamples"),
    ],
)
@pytest.mark.parametrize("fit", [fit_slope, bootstrap_slope_ci])
def test_fits_name_a_bad_point_or_setting(fit, ns, values, kwargs, message):
    if fit is fit_slope:
        kwargs = {k: v for k, v in kwargs.items() if k != "resamples"}
        if not kwargs and message == "resamples":
            return
    with pytest.raises(ValueError, match=message):
        fit(ns, values, **kwargs)


@given(st.integers(1, 50), st.integers(1, 10**6))
def test_parametric_reference(k, n):
    assert parametric_reference(k, n) == pytest.approx(k / (8 * n))


def test_tier_validation_and_round_trip():
    tier = TIERS["quick"]
    assert Tier.from_dict(tier.to_dict()) == tier
    json.dumps(tier.to_dict())
    with pytest.raises(ValueError, match="steps"):
        Tier(name="x", ns=(64,), seeds=(0,), steps=0)
    with pytest.raises(ValueError, match="sigma"):
        Tier(name="x", ns=(64,), seeds=(0,), sigma=-1.0)
    with pytest.raises(ValueError, match="n >= 8"):
        Tier(name="x", ns=(), seeds=(0,))
    with pytest.raises(ValueError, match="unknown"):
        Tier.from_dict({**tier.to_dict(), "bogus": 1})


def test_tiers_meet_the_issue():
    """Issue 4 item 5: >= 5 values of n spanning >= 32x, several seeds (quick: a subset, still a grid)."""
    full = TIERS["full"]
    assert len(full.ns) >= 5 and max(full.ns) / min(full.ns) >= 32 and len(full.seeds) >= 2
    assert set(full.ablation_ns) <= set(full.ns) and set(full.check_ns) <= set(full.ns)


def _check_points(result: dict) -> None:
    for q in result["points"]:
        assert {"n", "seed", "hellinger_sq", "variant"} <= set(q)
        for key in ESTIMATORS:
            assert 0.0 <= q[key] <= 1.0, (key, q[key])
        assert q["true_positive"] + q["false_negative"] == result["teacher"]["s"]


def test_tiny_tier_writes_json_and_png(tmp_path, capsys):
    assert main(["convergence", "--tier", "tiny", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "convergence.json").read_text())
    assert (tmp_path / "convergence.png").stat().st_size > 0
    assert result["tier"] == "tiny" and result["theory"]["theory_slope"] == -1.0 and result["teacher"]["in_h"]
    assert {"slope", "slope_ci", "points", "slopes", "config", "seeds", "machine", "wall_time_s"} <= set(result)
    assert result["machine"]["torch_threads"] == 1 and Tier.from_dict(result["config"]).name == "tiny"
    assert {q["variant"] for q in result["points"]} == {
        "spike_slab/projection/moment_matched",
        "spike_slab/projection/plugin",
        "gaussian/projection/moment_matched",
        "gaussian/projection/plugin",
        "spike_slab/default/plugin",
    }
    _check_points(result)
    # two n values, one seed: too few points for a CI, so the slope is absent rather than invented
    assert result["slope"] is None and result["slope_ci"] is None
    assert "slope None" in capsys.readouterr().out


def test_quick_tier_converges(tmp_path):
    """The quick tier (the one `nox -s theory` runs, ~30 s on one thread): the squared Hellinger distance
    falls with n, its fitted log-log slope has a confidence interval below zero, and the support is
    recovered at the largest n."""
    assert main(["convergence", "--tier", "quick", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "convergence.json").read_text())
    _check_points(result)
    assert result["slope_ci"] is not None and result["slope_ci"][1] < 0, result["slope_ci"]
    main_points = [q for q in result["points"] if q["variant"] == result["main_variant"]]
    largest = max(q["n"] for q in main_points)
    smallest = min(q["n"] for q in main_points)
    med = {n: sorted(q["hellinger_sq"] for q in main_points if q["n"] == n) for n in (smallest, largest)}
    assert med[largest][len(med[largest]) // 2] < med[smallest][len(med[smallest]) // 2] / 10


@pytest.fixture(scope="module")
def committed() -> dict:
    path = RESULTS / "convergence.json"
    if not path.exists():
        pytest.skip("docs/results/theory/convergence.json not generated yet")
    return json.loads(path.read_text())


def test_committed_run_is_the_full_tier(committed):
    assert committed["tier"] == "full" and (RESULTS / "convergence.png").stat().st_size > 0
    assert Tier.from_dict(committed["config"]) == TIERS["full"], "the committed JSON is from another full tier"
    main_pts = [q for q in committed["points"] if q["variant"] == committed["main_variant"]]
    assert sorted({q["n"] for q in main_pts}) == sorted(TIERS["full"].ns)
    assert len(main_pts) == len(TIERS["full"].ns) * len(TIERS["full"].seeds)
    _check_points(committed)


def test_committed_slope_is_the_fit_of_its_points(committed):
    """The reported slope and CI are recomputed from the committed points (nothing typed in by hand)."""
    main_pts = [q for q in committed["points"] if q["variant"] == committed["main_variant"]]
    fit = fit_slope([q["n"] for q in main_pts], [q["hellinger_sq"] for q in main_pts])
    assert committed["slope"] == pytest.approx(fit["slope"], rel=1e-12)
    assert committed["slope_ci"] == pytest.approx(fit["slope_ci"], rel=1e-12)
    lo, hi = committed["slope_ci"]
    assert lo < committed["slope"] < hi
    for row in committed["summary"]:
        at = [q["hellinger_sq"] for q in main_pts if q["n"] == row["n"]]
        assert row["median"] == pytest.approx(float(np.median(at)), rel=1e-12)


def test_committed_run_supports_the_claims_of_the_docs(committed):
    """docs/theory.md §7 reads the committed run in words; these are the statements it makes."""
    by = {}
    for q in committed["points"]:
        by.setdefault(q["variant"], []).append(q)
    main_pts, summary = by[committed["main_variant"]], committed["summary"]
    k = committed["theory"]["parametric"]["k_sqs"]
    # the risk falls, faster than n^-1 over the whole grid, and the bound ε_n² falls more slowly
    assert summary[-1]["median"] < summary[0]["median"] / 100
    assert committed["slope_ci"][1] < -1 and committed["theory"]["eps_n_sq_slope_on_grid"] > committed["slope"]
    # the largest n are in the parametric regime: exact support, n × median d² within 2x of k/8
    for row in summary[-4:]:
        assert row["support_exact"] >= 0.9 and 0.5 * k / 8 <= row["n_times_median"] <= 2 * k / 8
    assert summary[0]["support_exact"] < 0.5  # ... and the smallest are not
    # the five estimators coincide; support never changed during SQS training; the optimiser converged
    keys = ("hellinger_sq", "hellinger_sq_avg", "hellinger_sq_sampled", "hellinger_sq_bma", "hellinger_sq_greedy")
    assert all(max(q[k] for k in keys) <= 1.05 * min(q[k] for k in keys) for q in main_pts)
    assert all(q["support_kept_from_init"] for q in main_pts)
    for r in committed["optimizer_check"]:  # more steps move the risk far less than the seeds do
        row = next(row for row in summary if row["n"] == r["n"])
        assert abs(r["hellinger_sq"] - r["hellinger_sq_at_tier_steps"]) < 0.5 * (row["q75"] - row["q25"])
    # full precision stays above SQS once the support is recovered
    assert all(row["median_fp"] > row["median"] for row in summary[-4:])

    def median(variant, key, n):
        return float(np.median([q[key] for q in by[variant] if q["n"] == n]))

    for n in TIERS["full"].ablation_ns:
        # Gaussian prior: q̂' never contracts; with the moment-matched likelihood nothing does
        assert median("gaussian/projection/moment_matched", "hellinger_sq", n) > 0.5
        assert median("gaussian/projection/moment_matched", "hellinger_sq_greedy", n) > 0.5
        assert median("gaussian/projection/plugin", "hellinger_sq", n) > 0.5
        # ... while its plug-in deterministic estimators equal the spike-and-slab ones
        gauss = median("gaussian/projection/plugin", "hellinger_sq_avg", n)
        assert gauss == pytest.approx(median("spike_slab/projection/plugin", "hellinger_sq_avg", n), rel=0.05)
    for n in TIERS["full"].default_ns:  # sqs-core's defaults as shipped do not converge
        assert median("spike_slab/default/plugin", "hellinger_sq_greedy", n) > 0.1


def test_a_fit_is_reproducible():
    tier = Tier(name="t", ns=(64,), seeds=(0,), steps=20, fp_restarts=1, fp_max_iter=50, projection_starts=2, draws=2,
                n_test=256)  # fmt: skip
    first, second = fit_point(tier, 64, 3), fit_point(tier, 64, 3)
    assert [{k: v for k, v in q.items() if k != "wall_s"} for q in first] == [
        {k: v for k, v in q.items() if k != "wall_s"} for q in second
    ]


def test_a_failed_plot_leaves_the_previous_png_whole(tmp_path, monkeypatch):
    """The figure is drawn into memory and then replaces the file atomically: a plot that fails half-way (here
    savefig writes some bytes and raises) leaves the previous PNG as it was and no temporary file behind."""
    import matplotlib.figure
    from sqs_theory.plots import plot_convergence

    committed = json.loads((RESULTS / "convergence.json").read_text())
    png = tmp_path / "convergence.png"
    plot_convergence(committed, png)
    before = png.read_bytes()

    def broken_savefig(self, target, **kwargs):
        if hasattr(target, "write"):
            target.write(b"half a png")
        else:
            Path(target).write_bytes(b"half a png")
        raise OSError("disk full")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", broken_savefig)
    with pytest.raises(OSError, match="disk full"):
        plot_convergence(committed, png)
    assert png.read_bytes() == before and before.startswith(b"\x89PNG")
    assert [p.name for p in tmp_path.iterdir()] == ["convergence.png"]
