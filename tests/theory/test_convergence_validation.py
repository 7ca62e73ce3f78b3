"""Input validation of the convergence study (synthetic, projection, student, risk, recovery, hellinger,
convergence): a bad argument is a ValueError naming the parameter, its value and the function, never NaN, inf,
a wrong number, a cryptic torch / numpy error, an IndexError or a ZeroDivisionError. Each case of BAD_CALLS
records what the call did before it was checked."""

from __future__ import annotations

import copy
import functools
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sqs_theory import convergence, hellinger, projection, rates, recovery, risk, student, synthetic
from sqs_theory.convergence import Tier

from .strategies import teacher_seeds

torch.set_num_threads(1)
NAN, INF = math.nan, math.inf
TEACHER = synthetic.make_teacher(4, 6, seed=0)
T1, T2 = TEACHER[0].weight.double().numpy(), TEACHER[2].weight.double().numpy()
X, Y = synthetic.sample_data(TEACHER, 32, 0.1, torch.Generator().manual_seed(0))
X_TEST = torch.rand(64, 4, generator=torch.Generator().manual_seed(1))
F0 = risk.predict(TEACHER, X_TEST)
SPEC = student.StudentSpec(steps=2)
TINY = convergence.TIERS["tiny"]


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@functools.cache
def _sqs_model() -> torch.nn.Module:
    return student.fit_student(TEACHER, X, Y, sigma=0.1, density=0.6, spec=SPEC)


def _fit_fp(**kwargs):
    args = {"sigma": 0.1, "init_noise": 0.3, "restarts": 1, "max_iter": 5, "generator": _gen(), **kwargs}
    return synthetic.fit_full_precision(TEACHER, X, Y, **args)


def _canonicalize(x=X, y=Y, **kwargs):
    args = {"sigma": 0.1, "s": 18, "k": 4, "starts": 1, "seed": 0, **kwargs}
    return projection.canonicalize_(copy.deepcopy(TEACHER), x, y, **args)


def _project(w1=T1, w2=T2, **kwargs):
    return projection.project_rescaled(w1, w2, **{"s": 18, "k": 4, "scales": np.ones(6), **kwargs})


def _risk(x_test=X_TEST, f0=F0, model=None, **kwargs):
    args = {"sigma": 0.1, "density": 0.6, "draws": 2, "generator": _gen(), **kwargs}
    return risk.risk_summary(model or _sqs_model(), x_test, f0, **args)


def _tier(**kwargs) -> Tier:
    return Tier(**{"name": "x", "ns": (64,), "seeds": (0,), **kwargs})


# label: (call, parameter, function); the comment says what the call did before
BAD_CALLS = {
    # hellinger
    "hellinger_sq_gaussian sigma=inf": (
        lambda: hellinger.hellinger_sq_gaussian([0.0], [1.0], INF),
        "sigma",
        "hellinger_sq_gaussian",
    ),  # 0
    "hellinger_sq_gaussian sigma=True": (
        lambda: hellinger.hellinger_sq_gaussian([0.0], [1.0], True),
        "sigma",
        "hellinger_sq_gaussian",
    ),  # σ = 1
    "hellinger_sq_gaussian f nan": (
        lambda: hellinger.hellinger_sq_gaussian([NAN], [1.0], 1.0),
        "f",
        "hellinger_sq_gaussian",
    ),  # NaN
    "hellinger_sq_gaussian inf - inf": (
        lambda: hellinger.hellinger_sq_gaussian([1.0], [INF], 1.0),
        "f0",
        "hellinger_sq_gaussian",
    ),
    "hellinger_sq_gaussian complex": (
        lambda: hellinger.hellinger_sq_gaussian([1j], [0.0], 1.0),
        "f",
        "hellinger_sq_gaussian",
    ),  # TypeError
    "hellinger_sq empty": (lambda: hellinger.hellinger_sq([], [], 1.0), "f", "hellinger_sq"),  # NaN
    "parametric_reference k=0": (lambda: hellinger.parametric_reference(0, 10), "k", "parametric_reference"),  # 0.0
    "parametric_reference k=2.5": (lambda: hellinger.parametric_reference(2.5, 10), "k", "parametric_reference"),
    "parametric_reference n=0": (lambda: hellinger.parametric_reference(3, 0), "n", "parametric_reference"),  # inf
    "parametric_reference n<0": (lambda: hellinger.parametric_reference(3, [64, -5]), "n", "parametric_reference"),
    "bootstrap_slope_ci seed=-1": (
        lambda: hellinger.bootstrap_slope_ci([1, 2, 4], [1, 2, 3], seed=-1),
        "seed",
        "bootstrap_slope_ci",
    ),  # numpy's message
    "bootstrap_slope_ci seed=2.5": (
        lambda: hellinger.bootstrap_slope_ci([1, 2, 4], [1, 2, 3], seed=2.5),
        "seed",
        "bootstrap_slope_ci",
    ),  # TypeError
    # recovery
    "match_units fewer units": (
        lambda: recovery.match_units(T1, T2, T1[:5], T2[:, :5]),
        "s1",
        "match_units",
    ),  # a perm of 5
    "match_units nan": (lambda: recovery.match_units(T1, T2, T1 * NAN, T2), "s1", "match_units"),  # scipy's message
    "best_unit_scale nan": (
        lambda: recovery.best_unit_scale(np.array([NAN]), np.ones(1), np.ones(1), np.ones(1)),
        "s1",
        "best_unit_scale",
    ),  # a number
    "best_unit_scale shapes": (
        lambda: recovery.best_unit_scale(np.ones(2), np.ones(1), np.ones(1), np.ones(1)),
        "s1",
        "best_unit_scale",
    ),  # broadcast
    "recovery levels=[]": (
        lambda: recovery.recovery(T1, T2, T1, T2, levels=[]),
        "levels",
        "recovery",
    ),  # numpy's argmin
    "recovery levels nan": (
        lambda: recovery.recovery(T1, T2, T1, T2, levels=[NAN, 1.0]),
        "levels",
        "recovery",
    ),  # ignored
    "recovery w2 1-D": (
        lambda: recovery.recovery(T1, T2, T1, T2[0], levels=synthetic.LEVELS),
        "w2",
        "recovery",
    ),  # IndexError
    "recovery w2 narrower": (
        lambda: recovery.recovery(T1, T2, T1, T2[:, :5], levels=synthetic.LEVELS),
        "w2",
        "recovery",
    ),  # IndexError
    "recovery complex": (
        lambda: recovery.recovery(T1, T2, T1 + 1j, T2, levels=synthetic.LEVELS),
        "w1",
        "recovery",
    ),  # imaginary part dropped
    # synthetic
    "make_teacher width=2.5": (lambda: synthetic.make_teacher(4, 2.5), "width", "make_teacher"),  # TypeError
    "make_teacher seed=True": (lambda: synthetic.make_teacher(4, 6, seed=True), "seed", "make_teacher"),  # seed 1
    "make_teacher seed=-1": (lambda: synthetic.make_teacher(4, 6, seed=-1), "seed", "make_teacher"),  # numpy's message
    "sample_data n=2.5": (lambda: synthetic.sample_data(TEACHER, 2.5, 0.1, _gen()), "n", "sample_data"),  # TypeError
    "sample_data sigma=inf": (
        lambda: synthetic.sample_data(TEACHER, 8, INF, _gen()),
        "sigma",
        "sample_data",
    ),  # Y = NaN
    "sample_data generator=0": (
        lambda: synthetic.sample_data(TEACHER, 8, 0.1, 0),
        "generator",
        "sample_data",
    ),  # TypeError
    "mlp_from_weights 1-D": (
        lambda: synthetic.mlp_from_weights(np.zeros(4), np.zeros((1, 6))),
        "w1",
        "mlp_from_weights",
    ),  # IndexError
    "mlp_from_weights nan": (
        lambda: synthetic.mlp_from_weights(np.full((6, 4), NAN), np.zeros((1, 6))),
        "w1",
        "mlp_from_weights",
    ),  # a NaN network
    "mlp_from_weights w2 width": (
        lambda: synthetic.mlp_from_weights(np.zeros((6, 4)), np.zeros((1, 5))),
        "w2",
        "mlp_from_weights",
    ),  # RuntimeError
    "mlp_from_weights 1e200": (
        lambda: synthetic.mlp_from_weights(np.full((6, 4), 1e200), np.zeros((1, 6))),
        "w1",
        "mlp_from_weights",
    ),  # inf weights
    "gaussian_nll sigma=0": (lambda: synthetic.gaussian_nll(TEACHER, X, Y, 0.0), "sigma", "gaussian_nll"),  # inf
    "training_nll sigma<0": (lambda: synthetic.training_nll(TEACHER, X, Y, -1.0), "sigma", "training_nll"),  # as σ = 1
    "training_nll y (n,)": (
        lambda: synthetic.training_nll(TEACHER, X, Y[:, 0], 0.1),
        "y",
        "training_nll",
    ),  # (n, n) residual
    "training_nll y nan": (lambda: synthetic.training_nll(TEACHER, X, Y * NAN, 0.1), "y", "training_nll"),  # NaN
    "training_nll x float64": (
        lambda: synthetic.training_nll(TEACHER, X.double(), Y, 0.1),
        "x",
        "training_nll",
    ),  # RuntimeError
    "training_nll x numpy": (
        lambda: synthetic.training_nll(TEACHER, X.numpy(), Y, 0.1),
        "x",
        "training_nll",
    ),  # TypeError
    "training_nll empty": (lambda: synthetic.training_nll(TEACHER, X[:0], Y[:0], 0.1), "x", "training_nll"),  # NaN
    "fit_full_precision sigma=0": (lambda: _fit_fp(sigma=0.0), "sigma", "fit_full_precision"),  # NLL NaN
    "fit_full_precision init_noise=nan": (lambda: _fit_fp(init_noise=NAN), "init_noise", "fit_full_precision"),  # NaN
    "fit_full_precision restarts=2.5": (lambda: _fit_fp(restarts=2.5), "restarts", "fit_full_precision"),  # TypeError
    "fit_full_precision max_iter=nan": (lambda: _fit_fp(max_iter=NAN), "max_iter", "fit_full_precision"),  # ran
    "fit_full_precision generator=None": (
        lambda: _fit_fp(generator=None),
        "generator",
        "fit_full_precision",
    ),  # unseeded
    # student (and rates.log_sigma_n_sq, which proof_log_std calls)
    "proof_log_std n=0": (
        lambda: student.proof_log_std(0, s=10, N=6, p=4, B=1.5),
        "n",
        "proof_log_std",
    ),  # ZeroDivisionError
    "proof_log_std n=nan": (lambda: student.proof_log_std(NAN, s=10, N=6, p=4, B=1.5), "n", "proof_log_std"),  # NaN
    "proof_log_std s=0": (
        lambda: student.proof_log_std(100, s=0, N=6, p=4, B=1.5),
        "s",
        "proof_log_std",
    ),  # math domain error
    "proof_log_std p=0": (lambda: student.proof_log_std(100, s=10, N=6, p=0, B=1.5), "p", "proof_log_std"),  # a number
    "proof_log_std N=2.5": (
        lambda: student.proof_log_std(100, s=10, N=2.5, p=4, B=1.5),
        "N",
        "proof_log_std",
    ),  # a number
    "proof_log_std B=inf": (lambda: student.proof_log_std(100, s=10, N=6, p=4, B=INF), "B", "proof_log_std"),  # -inf
    "log_sigma_n_sq n=0": (
        lambda: rates.log_sigma_n_sq(0, 10, 1, 6, 4, 1.5),
        "n",
        "log_sigma_n_sq",
    ),  # ZeroDivisionError
    "log_sigma_n_sq L=0": (lambda: rates.log_sigma_n_sq(100, 10, 0, 6, 4, 1.5), "L", "log_sigma_n_sq"),  # a number
    "StudentSpec steps=2.5": (lambda: student.StudentSpec(steps=2.5), "steps", "StudentSpec"),  # accepted
    "StudentSpec steps=nan": (lambda: student.StudentSpec(steps=NAN), "steps", "StudentSpec"),  # accepted
    "StudentSpec quant_lr=True": (lambda: student.StudentSpec(quant_lr=True), "quant_lr", "StudentSpec"),  # accepted
    "fit_student density=0": (
        lambda: student.fit_student(TEACHER, X, Y, sigma=0.1, density=0.0, spec=SPEC),
        "density",
        "fit_student",
    ),  # math domain error
    "fit_student density=nan": (
        lambda: student.fit_student(TEACHER, X, Y, sigma=0.1, density=NAN, spec=SPEC),
        "density",
        "fit_student",
    ),
    "fit_student density=1e-9": (
        lambda: student.fit_student(TEACHER, X, Y, sigma=0.1, density=1e-9, spec=SPEC),
        "density",
        "fit_student",
    ),
    "fit_student sigma<0": (
        lambda: student.fit_student(TEACHER, X, Y, sigma=-1.0, density=0.6, spec=SPEC),
        "sigma",
        "fit_student",
    ),  # ran as σ = 1
    "fit_student spec=None": (
        lambda: student.fit_student(TEACHER, X, Y, sigma=0.1, density=0.6, spec=None),
        "spec",
        "fit_student",
    ),  # AttributeError
    "fit_student y rows": (
        lambda: student.fit_student(TEACHER, X, Y[:5], sigma=0.1, density=0.6, spec=SPEC),
        "y",
        "fit_student",
    ),  # RuntimeError
    # projection
    "project_rescaled s=-1": (lambda: _project(s=-1), "s", "project_rescaled"),  # kept all weights but one
    "project_rescaled s=2.5": (lambda: _project(s=2.5), "s", "project_rescaled"),  # TypeError
    "project_rescaled iterations=0": (lambda: _project(iterations=0), "iterations", "project_rescaled"),  # None
    "project_rescaled scales<0": (
        lambda: _project(scales=-np.ones(6)),
        "scales",
        "project_rescaled",
    ),  # "B must be finite"
    "project_rescaled scales=0": (lambda: _project(scales=np.zeros(6)), "scales", "project_rescaled"),  # clipped
    "project_rescaled scales length": (lambda: _project(scales=np.ones(5)), "scales", "project_rescaled"),  # broadcast
    "project_rescaled w1 nan": (lambda: _project(w1=T1 * NAN), "w1", "project_rescaled"),  # "B must be finite"
    "project_rescaled empty": (
        lambda: _project(w1=np.zeros((0, 4)), w2=np.zeros((1, 0)), s=0, scales=np.ones(0)),
        "w1",
        "project_rescaled",
    ),  # ZeroDivisionError
    "canonicalize_ sigma=nan": (lambda: _canonicalize(sigma=NAN), "sigma", "canonicalize_"),  # "min() arg is an empty"
    "canonicalize_ sigma=0": (lambda: _canonicalize(sigma=0.0), "sigma", "canonicalize_"),  # NLL inf
    "canonicalize_ starts=2.5": (lambda: _canonicalize(starts=2.5), "starts", "canonicalize_"),  # TypeError
    "canonicalize_ seed=-1": (lambda: _canonicalize(seed=-1), "seed", "canonicalize_"),  # numpy's message
    "canonicalize_ y nan": (lambda: _canonicalize(y=Y * NAN), "y", "canonicalize_"),  # "min() arg is an empty"
    # risk
    "predict x int": (lambda: risk.predict(TEACHER, X_TEST.long()), "x", "predict"),  # RuntimeError
    "draw_from_q_ unprepared": (
        lambda: risk.draw_from_q_(copy.deepcopy(TEACHER), _gen()),
        "model",
        "draw_from_q_",
    ),  # did nothing
    "draw_from_q_ generator=None": (lambda: risk.draw_from_q_(_sqs_model(), None), "generator", "draw_from_q_"),
    "risk_summary draws=2.5": (lambda: _risk(draws=2.5), "draws", "risk_summary"),  # TypeError
    "risk_summary density=0": (lambda: _risk(density=0.0), "density", "risk_summary"),  # sqs-core's "nonzero"
    "risk_summary f0 nan": (lambda: _risk(f0=F0 * NAN), "f0", "risk_summary"),  # every estimate NaN
    "risk_summary f0 of length 1": (lambda: _risk(f0=F0[:1]), "f0", "risk_summary"),  # broadcast: a wrong risk
    "risk_summary x_test empty": (lambda: _risk(x_test=X_TEST[:0], f0=F0[:0]), "x_test", "risk_summary"),  # NaN
    # convergence
    "Tier ns=2.5": (lambda: _tier(ns=(64, 8.5)), "ns[1]", "Tier"),  # int(8.5) = 8, silently
    "Tier seeds=-1": (lambda: _tier(seeds=(-1,)), "seeds[0]", "Tier"),  # accepted
    "Tier seeds repeated": (lambda: _tier(seeds=(0, 0)), "seeds", "Tier"),  # the same fits counted twice
    "Tier draws=nan": (lambda: _tier(draws=NAN), "draws", "Tier"),  # accepted
    "Tier p=0": (lambda: _tier(p=0), "p", "Tier"),  # accepted
    "Tier init_noise=nan": (lambda: _tier(init_noise=NAN), "init_noise", "Tier"),  # accepted
    "Tier test_seed=-1": (lambda: _tier(test_seed=-1), "test_seed", "Tier"),  # accepted
    "Tier check_ns outside ns": (lambda: _tier(check_ns=(128,)), "check_ns", "Tier"),  # StopIteration in run_study
    "Tier ablation_ns outside ns": (lambda: _tier(ablation_ns=(128,)), "ablation_ns", "Tier"),  # never run
    "fit_point n=2.5": (lambda: convergence.fit_point(TINY, 2.5, 0), "n", "fit_point"),  # RuntimeError
    "fit_point seed=True": (lambda: convergence.fit_point(TINY, 64, True), "seed", "fit_point"),  # seed 1
    "theory_reference k_sqs=-1": (lambda: convergence.theory_reference(TINY, 18, -1), "k_sqs", "theory_reference"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_argument_is_a_value_error_naming_it_and_the_function(case):
    call, name, where = BAD_CALLS[case]
    with pytest.raises(ValueError, match=rf"^{re.escape(name)} must .* \(in {where}\)$"):
        call()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        # a broadcast (n,) against (n, 1) averaged over the wrong pairs
        (lambda: hellinger.hellinger_sq_gaussian(np.zeros(3), np.zeros((3, 1)), 1.0), r"f and f0 must have the same"),
        (lambda: synthetic.sample_data(TEACHER, 8, 1e200, _gen()), r"Y overflows float32 at sigma=1e\+200"),  # inf Y
        (lambda: synthetic.training_nll(TEACHER, X, Y, 1e-30), r"NLL is inf at sigma=1e-30"),  # inf
        (lambda: _fit_fp(sigma=1e-200), r"training NLL is nan at sigma=1e-200"),  # NaN
        (lambda: Tier.from_dict({"ns": [64], "seeds": [0]}), r"missing: \['name'\]"),  # TypeError
        (lambda: convergence.fit_point("tiny", 64, 2**62), r"torch seed .* >= 2\*\*63"),  # numpy / torch overflow
    ],
)
def test_values_beyond_range_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@given(data=st.data(), bad=st.sampled_from([NAN, INF, -INF]), which=st.sampled_from(["f", "f0"]))
def test_hellinger_refuses_a_non_finite_prediction_anywhere(data, bad, which):
    values = {"f": np.zeros(5), "f0": np.zeros(5)}
    values[which][data.draw(st.integers(0, 4))] = bad
    with pytest.raises(ValueError, match=rf"^{which} must be finite"):
        hellinger.hellinger_sq(values["f"], values["f0"], 0.5)


@given(f=st.floats(-3, 3), f0=st.floats(-3, 3), sigma=st.sampled_from([1e-200, 1e-160, 1e160, 1e200]))
def test_hellinger_at_extreme_sigma_is_its_closed_form(f, f0, sigma):
    """σ² past float64's range (an OverflowError before) or below its normal floats (0/0 = NaN at f = f0 before):
    1 − exp(−((f − f0)/σ)²/8), finite, in [0, 1]."""
    got = float(hellinger.hellinger_sq_gaussian(f, f0, sigma))
    with np.errstate(over="ignore"):
        want = -math.expm1(-float(np.float64((f - f0) / sigma) ** 2) / 8.0)
    assert 0.0 <= got <= 1.0 and got == pytest.approx(want, rel=1e-12, abs=1e-300)


@given(n=st.floats(1.0, 1e300), factor=st.floats(1.0, 1e8))
def test_sigma_n_is_finite_for_every_n(n, factor):
    """log σ_n² − log σ_{n·c}² = log c for every n (s/(32n) underflowed to log 0 at n = 1e308 before)."""
    here, there = rates.log_sigma_n_sq(n, 10, 1, 6, 4, 1.5), rates.log_sigma_n_sq(n * factor, 10, 1, 6, 4, 1.5)
    assert math.isfinite(there) and here - there == pytest.approx(math.log(factor), abs=1e-9 * max(1.0, abs(here)))


@given(teacher_seeds)
def test_integral_floats_are_taken_as_the_ints(seed):
    """2.0 is the count 2 (make_teacher(4.0) and sample_data(n=8.0) were TypeErrors), with the same result."""
    a, b = synthetic.make_teacher(4.0, 6.0, seed=float(seed)), synthetic.make_teacher(4, 6, seed=seed)
    assert np.array_equal(synthetic.teacher_theta(a), synthetic.teacher_theta(b))
    xa, ya = synthetic.sample_data(b, 8.0, 0.1, torch.Generator().manual_seed(seed))
    xb, yb = synthetic.sample_data(b, 8, 0.1, torch.Generator().manual_seed(seed))
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert student.StudentSpec(steps=2.0).steps == 2 and type(student.StudentSpec(steps=2.0).steps) is int


@given(
    key=st.sampled_from(
        ["steps", "fp_restarts", "fp_max_iter", "projection_starts", "check_factor", "draws", "n_test"]
    ),
    bad=st.one_of(st.floats(0.1, 100).filter(lambda v: not v.is_integer()), st.just(True), st.integers(-5, 0)),
)
def test_tier_counts_are_integers_above_zero(key, bad):
    low = 2 if key == "draws" else 1  # a standard error over the M draws needs two
    with pytest.raises(ValueError, match=rf"^{key} must be an integer >= {low}, got .* \(in Tier\)$"):
        _tier(**{key: bad})


@given(rows=st.integers(1, 7), cols=st.integers(1, 5))
def test_recovery_refuses_a_student_of_another_shape(rows, cols):
    if (rows, cols) == T1.shape:
        return
    with pytest.raises(ValueError, match=r"^w1 must have the shape of teacher_w1"):
        recovery.recovery(T1, T2, np.ones((rows, cols)), np.ones((1, rows)), levels=synthetic.LEVELS)
