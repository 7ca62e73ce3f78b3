"""Appendix B, proof of Lemma ``bound_elbo``: the Gaussian moment steps and the sub-Gaussian sup bounds.

Notation of the proof: ``W ~ N(mu_k, sigma_n^2)`` given ``z = k``, ``W* = mu_(i)``, ``d = mu_k - mu_(i)``,
``phi_o = sum_{k != (i)} phi_k(W*)`` (mass of the non-dominant components).

Exact reference for the absolute exponential moment (``Z ~ N(0, 1)``)::

    E exp(t |d + sigma Z|) = e^{t d + t^2 sigma^2/2} Phi(d/sigma + t sigma)
                           + e^{-t d + t^2 sigma^2/2} Phi(t sigma - d/sigma),

so for ``d = 0`` it is ``2 exp(t^2 sigma^2 / 2) Phi(t sigma)``, not the paper's ``2 exp(t^2 sigma^2 / 2)``.
Every closed form here is checked against ``scipy.integrate.quad`` in the tests.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import integrate
from scipy.special import log_ndtr

from . import _validate as check
from .verdict import Verdict, equality

_LOG_FLOAT_MAX = math.log(np.finfo(float).max)

__all__ = [
    "abs_mgf",
    "abs_mgf_quad",
    "check_gaussian_abs_mgf",
    "check_log_slip",
    "check_mu_separation",
    "check_shifted_abs_mgf",
    "check_squared_mgf",
    "check_sup_bound_mc",
    "check_tau_condition",
    "check_tau_condition_squared",
    "log_abs_mgf",
    "sq_mgf_quad",
    "sup_deviation_mc",
]


@check.arguments(t="real", sigma="positive", d="real")  # sigma = 0 divided by zero; sigma < 0 gave a wrong value
def log_abs_mgf(t: float, sigma: float, d: float = 0.0) -> float:
    """``log E exp(t |d + sigma Z|)`` in closed form (log space; see the module docstring)."""
    half = t * t * sigma * sigma / 2
    a = t * d + half + float(log_ndtr(d / sigma + t * sigma))
    b = -t * d + half + float(log_ndtr(t * sigma - d / sigma))
    return float(np.logaddexp(a, b))


def abs_mgf(t: float, sigma: float, d: float = 0.0) -> float:
    """``E exp(t |d + sigma Z|)`` in closed form; +inf where it exceeds the float range (its log is finite)."""
    log_value = log_abs_mgf(t, sigma, d)
    return math.exp(log_value) if log_value < _LOG_FLOAT_MAX else math.inf


def _piecewise_quad(f: Callable[[float], float], pts: Sequence[float]) -> float:
    """``int f`` over ``[pts[0], pts[-1]]``, one adaptive quad per piece; a ValueError where ``f`` overflows."""
    try:
        return sum(integrate.quad(f, a, b, epsabs=0, epsrel=1e-13, limit=200)[0] for a, b in itertools.pairwise(pts))
    except OverflowError:
        raise ValueError("the integrand exceeds the float range: the moment is beyond 1.8e308") from None


@check.arguments(t="real", sigma="positive", d="real")
def abs_mgf_quad(t: float, sigma: float, d: float = 0.0) -> float:
    """``E exp(t |d + sigma Z|)`` by quadrature in ``z`` (the reference), split at the kink ``-d/sigma``."""
    kink = -d / sigma
    lo, hi = min(kink, -t * sigma) - 40.0, max(kink, t * sigma) + 40.0

    def f(z: float) -> float:
        return math.exp(t * abs(d + sigma * z) - z * z / 2) / math.sqrt(2 * math.pi)

    pts = sorted({lo, kink - t * sigma, kink, kink + t * sigma, hi})
    pts = [x for x in pts if lo <= x <= hi]
    return _piecewise_quad(f, pts)


def _check_squared_domain(t: float, sigma: float) -> None:
    """A ValueError unless t < 1/(2 sigma^2), where E exp(t (d + sigma Z)^2) is finite."""
    if 2 * t * sigma * sigma >= 1:
        raise ValueError(f"t must be < 1/(2 sigma^2) = {1 / (2 * sigma * sigma):g} (the moment diverges), got {t!r}")


@check.arguments(t="real", sigma="positive", d="real")
def sq_mgf_quad(t: float, sigma: float, d: float = 0.0) -> float:
    """``E exp(t (d + sigma Z)^2)`` for ``t < 1/(2 sigma^2)`` by quadrature (the reference)."""
    _check_squared_domain(t, sigma)
    width = 40.0 / math.sqrt(1 - 2 * t * sigma * sigma)
    center = d * sigma * 2 * t / (1 - 2 * t * sigma * sigma)

    def f(z: float) -> float:
        return math.exp(t * (d + sigma * z) ** 2 - z * z / 2) / math.sqrt(2 * math.pi)

    pts = [center - width, center - 1, center, center + 1, center + width]
    return _piecewise_quad(f, pts)


@check.arguments(t="real", sigma="positive")
def check_gaussian_abs_mgf(t: float = 1.0, sigma: float = 0.5) -> Verdict:
    """Claim: ``E_N(mu, s^2) exp(t |W - mu|) = 2 exp(t^2 s^2 / 2)``; truth has a factor ``Phi(t s)``."""
    paper, true = 2 * math.exp(t * t * sigma * sigma / 2), abs_mgf_quad(t, sigma)
    return equality(
        name="gaussian-abs-mgf",
        location="App. B, proof of Lemma bound_elbo (first term of eq. 21)",
        claim="E exp(t|W-mu|) = 2 exp(t^2 sigma^2/2)",
        claimed=paper,
        reference=true,
        keys=("paper", "quadrature"),
        extra={"closed_form": abs_mgf(t, sigma), "paper_is_upper": paper >= true},
    )


@check.arguments(t="real", sigma="positive", d="real")
def check_shifted_abs_mgf(t: float = 2.0, sigma: float = 0.3, d: float = -1.0) -> Verdict:
    """Claim: ``E_N(mu_k, s^2) exp(t|W - mu_(i)|) = 2 exp(t d + s^2 t^2 / 2)``; false (e.g. for d < 0)."""
    return equality(
        name="shifted-abs-mgf",
        location="App. B, proof of Lemma bound_elbo (second term of eq. 21)",
        claim="E_{N(mu_k,s^2)} exp(t|W-mu_(i)|) = 2 exp(t(mu_k-mu_(i)) + s^2 t^2/2)",
        claimed=2 * math.exp(t * d + sigma * sigma * t * t / 2),
        reference=abs_mgf_quad(t, sigma, d),
        keys=("paper", "quadrature"),
        extra={"valid_bound_2exp(t|d|+..)": 2 * math.exp(t * abs(d) + sigma * sigma * t * t / 2), "d": d},
    )


@check.arguments(B="positive", t="real", sigma="positive")
def check_mu_separation(B: float = 3.0, t: float = 2.0, sigma: float = 0.3) -> Verdict:
    """Claim: ``sup |mu_i* - mu_j*| <= 4`` (and ``mu^2 <= 4``), used with ``|mu| <= B`` and ``B > 2``."""
    d = 2 * B  # mu = +B and mu = -B are both allowed
    log_true, log_claim = log_abs_mgf(t, sigma, d), math.log(2) + 4 * t + t * t * sigma * sigma / 2
    return Verdict(
        name="mu-separation",
        location="App. B, proof of Lemma bound_elbo (after eq. 21; eq. 58)",
        kind="bound",
        claim="|mu_k - mu_(i)| <= 4 given |mu_k| <= B, B > 2; hence E exp(t|W-W*|) <= 2exp(4t+t^2s^2/2)",
        holds=d <= 4 and log_true <= log_claim,
        details={"B": B, "max_separation": d, "log_moment": log_true, "log_paper_bound": log_claim},
    )


def _t_choice(N: int, sigma: float) -> float:
    """The proof's ``t = sqrt(2 log(3 N^2)) / sigma_n``."""
    return math.sqrt(2 * math.log(3 * N * N)) / sigma


@check.arguments(N="count", sigma="positive", gap="real", phi_o="probability")
def check_tau_condition(N: int = 4, sigma: float = 0.05, gap: float = 1.0, *, phi_o: float = 0.5) -> Verdict:
    """Per entry the proof needs ``E exp(t|W - W*|) <= (3/2) 2 exp(t^2 s^2/2)`` at the chosen t.

    The paper asks only ``phi_o <= 1/2``; what the step uses is ``phi_o exp(4t) <= 1/2``.
    """
    t = _t_choice(N, sigma)
    with np.errstate(divide="ignore"):  # phi_o = 0 or 1: one of the two parts has weight 0, log -inf
        log_weights = np.log1p(-phi_o), np.log(phi_o)
    log_lhs = float(np.logaddexp(log_weights[0] + log_abs_mgf(t, sigma), log_weights[1] + log_abs_mgf(t, sigma, gap)))
    log_rhs = math.log(3) + t * t * sigma * sigma / 2
    return Verdict(
        name=f"tau-condition(phi_o={phi_o:g})",
        location="App. B, proof of Lemma bound_elbo (choice of tau after eq. 21)",
        kind="condition",
        claim="sum_{k!=(i)} phi_k <= 1/2 suffices for 2N^2(...) <= 3N^2 exp(t^2 s^2/2)",
        holds=log_lhs <= log_rhs,
        details={
            "phi_o": phi_o,
            "t": t,
            "log_moment": log_lhs,
            "log_bound": log_rhs,
            "needed_phi_o": 0.5 * math.exp(-4 * t),
        },
    )


@check.arguments(N="count", sigma="positive")
def check_log_slip(N: int = 4, sigma: float = 0.05) -> Verdict:
    """Claim: ``3N^2/t + t s^2/2 = sqrt(2 s^2 log(3N^2))`` at ``t = sqrt(2 log 3N^2)/s``.

    Taking logs of ``exp(t E) <= 3 N^2 exp(t^2 s^2 / 2)`` gives ``log(3N^2)/t``, not ``3N^2/t``.
    """
    t = _t_choice(N, sigma)
    return equality(
        name="sup-bound-log-slip",
        location="App. B, proof of Lemma bound_elbo (bound on E sup|W-W*|)",
        claim="3N^2/t + t sigma^2/2 = sqrt(2 sigma^2 log(3N^2))",
        claimed=3 * N * N / t + t * sigma * sigma / 2,
        reference=math.sqrt(2 * sigma * sigma * math.log(3 * N * N)),
        keys=("paper_lhs", "claimed_value"),
        rel_tol=1e-12,
        extra={
            "corrected_lhs": math.log(3 * N * N) / t + t * sigma * sigma / 2,
            "final": math.sqrt(8 * sigma**2 * math.log(3 * N)),
        },
    )


@check.arguments(N="count", sigma="positive", gap="real", phi_o="probability", n_mc="count", seed="seed")
def sup_deviation_mc(
    N: int, sigma: float, gap: float, phi_o: float, *, n_mc: int = 4000, seed: int = 0
) -> dict[str, float]:
    """Monte Carlo ``E sup_ij |W - W*|`` and ``E sup_ij (W - W*)^2`` over the ``N^2`` entries of a layer.

    Each entry is ``W* + sigma Z`` with probability ``1 - phi_o`` and ``W* + gap + sigma Z`` otherwise.
    """
    rng = np.random.default_rng(seed)
    shift = np.where(rng.random((n_mc, N * N)) < phi_o, gap, 0.0)
    dev = np.abs(shift + sigma * rng.standard_normal((n_mc, N * N))).max(axis=1)
    return {
        "sup_abs": float(dev.mean()),
        "sup_abs_se": float(dev.std(ddof=1) / math.sqrt(n_mc)),
        "sup_sq": float((dev**2).mean()),
        "sup_sq_se": float((dev**2).std(ddof=1) / math.sqrt(n_mc)),
    }


@check.arguments(N="count", sigma="positive", gap="real", phi_o="probability")
def check_sup_bound_mc(N: int = 4, sigma: float = 0.05, gap: float = 1.0, *, phi_o: float = 0.5) -> Verdict:
    """``E sup|W-W*| <= sqrt(8 s^2 log 3N)`` and ``E sup (W-W*)^2 <= 8 s^2 log 3N`` by Monte Carlo.

    With ``phi_o = 1/2`` (allowed by the paper's condition on tau) both fail; with ``phi_o = 0`` (the
    corrected condition ``phi_o <= exp(-4t)/2`` is numerically 0 here) both hold.
    """
    mc = sup_deviation_mc(N, sigma, gap, phi_o)
    b1, b2 = math.sqrt(8 * sigma**2 * math.log(3 * N)), 8 * sigma**2 * math.log(3 * N)
    holds = mc["sup_abs"] - 4 * mc["sup_abs_se"] <= b1 and mc["sup_sq"] - 4 * mc["sup_sq_se"] <= b2
    return Verdict(
        name=f"sup-bound-mc(phi_o={phi_o:g})",
        location="App. B, proof of Lemma bound_elbo (E sup bounds)",
        kind="bound",
        claim="E sup|W-W*| <= sqrt(8 s^2 log 3N), E sup(W-W*)^2 <= 8 s^2 log 3N under the tau condition",
        holds=holds,
        details={
            "sup_abs": mc["sup_abs"],
            "bound_abs": b1,
            "sup_sq": mc["sup_sq"],
            "bound_sq": b2,
            "phi_o": phi_o,
        },
    )


@check.arguments(t="real", sigma="positive", d="real")
def check_squared_mgf(t: float = 1.0, sigma: float = 0.5, d: float = 1.5) -> Verdict:
    """``E exp(t (d + s Z)^2) = (1 - 2 t s^2)^(-1/2) exp(d^2 t / (1 - 2 t s^2))`` (correct in the paper)."""
    _check_squared_domain(t, sigma)
    c = 1 - 2 * t * sigma * sigma
    return equality(
        name="squared-mgf",
        location="App. B, proof of Lemma bound_elbo (eq. 29 terms)",
        claim="E exp(t(W-W*)^2) = exp(d^2 t/(1-2ts^2)) / sqrt(1-2ts^2)",
        claimed=math.exp(d * d * t / c) / math.sqrt(c),
        reference=sq_mgf_quad(t, sigma, d),
        keys=("closed_form", "quadrature"),
    )


@check.arguments(N="count", sigma="positive", gap="real")
def check_tau_condition_squared(N: int = 4, sigma: float = 0.05, gap: float = 1.0) -> Verdict:
    """Claim: pick tau with ``phi_o <= exp(16t/(1-2ts^2))`` - vacuous (RHS > 1); needs ``exp(-16t/...)``.

    At the proof's ``t = 1/(4 s^2)``, ``phi_o = 1/2`` satisfies the stated condition, yet the bound
    ``exp(E t sup (W-W*)^2) <= 2 N^2 / sqrt(1 - 2 t s^2)`` then fails.
    """
    t, phi_o = 1 / (4 * sigma * sigma), 0.5
    c = 1 - 2 * t * sigma * sigma
    log_rhs_condition = 16 * t / c
    log_lhs = 2 * math.log(N) - 0.5 * math.log(c) + float(np.logaddexp(0.0, math.log(phi_o) + gap * gap * t / c))
    log_bound = math.log(2 * N * N) - 0.5 * math.log(c)
    mc = sup_deviation_mc(N, sigma, gap, phi_o, n_mc=500)
    return Verdict(
        name="tau-condition-squared",
        location="App. B, proof of Lemma bound_elbo (after eq. 29)",
        kind="condition",
        claim="choose tau with sum_{k!=(i)} phi_k <= exp(16t/(1-2t sigma^2))",
        holds=log_rhs_condition < 0 and log_lhs <= log_bound,
        details={
            "log_condition_rhs": log_rhs_condition,
            "phi_o": phi_o,
            "log_lhs": log_lhs,
            "log_bound": log_bound,
            "t_times_mc_E_sup_sq": t * mc["sup_sq"],
        },
    )
