"""Appendix B: the rates, the prior lambda, sigma_n^2, Condition ``cond:bound`` and Lemma ``bound``.

All checks run over :func:`sqs_theory.rates.default_grid` unless given a grid.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import numpy as np
from scipy import integrate
from scipy.special import log_ndtr
from scipy.stats import norm

from . import _validate as check
from .kl import GaussianMixture, kl_mixture
from .rates import (
    GridPoint,
    check_bn_above_one,
    cond_bound_sigma_sq,
    default_grid,
    eps_n,
    lambda_condition_max_m,
    log_sigma_n_sq,
    r_n,
    sigma_n_bracket,
)
from .verdict import Verdict, equality, ratio_at_most_one

__all__ = [
    "bound_elbo_pre_algebra",
    "check_bound_elbo_algebra",
    "check_chernoff_tail",
    "check_condition_implies_lemma_bound",
    "check_footnote_sigma_n",
    "check_lambda_condition",
    "check_lower_tail_typo",
    "check_prior_variance_typo",
    "check_r_n_lower",
    "check_sigma_n_algebra",
]


def check_lambda_condition(
    delta: float, grid: Iterable[GridPoint] | None = None, *, delta_s: float | None = None
) -> Verdict:
    """Theorem's ``-log lambda = log T + delta[(L+1) log N + log(sqrt(n) p)]`` vs Lemma ``lmbound1``'s
    ``lambda <= T^-1 exp(-M n r_n / s_n)`` for a diverging ``M``.

    ``M_max(n)`` (the largest admissible ``M``) must grow with ``n`` along every ``(L, N, s, p)`` line: the Lemma
    asks for "any positive diverging sequence", with no lower bound (``points_M_max_below_1`` counts the points
    below 1, for information: before session 65 they failed a line, so delta = 0.6 was reported as failing
    although M_max grows on every line). It equals ``delta log^(2 delta_s - 1)(n)`` times a ratio in
    ``[1, ...)``, with ``delta_s`` the delta of s_n (the paper's: > 1; default ``delta``, one constant). So with
    one constant it diverges iff ``delta > 1/2``, and with s_n's own ``delta_s > 1`` for every ``delta > 0``
    (erratum B10).
    """
    lines: dict[tuple[int, int, int, int], list[tuple[float, float]]] = defaultdict(list)
    for g in grid if grid is not None else default_grid():
        m_max = lambda_condition_max_m(g.n, g.L, g.N, g.s, g.p, delta, delta_s=delta_s)
        lines[(g.L, g.N, g.s, g.p)].append((g.n, m_max))
    failing, below_one = 0, 0
    worst: tuple[float, tuple[int, int, int, int] | None] = (math.inf, None)
    for key, pts in lines.items():
        m = np.array([v for _, v in sorted(pts)])
        below_one += int((m < 1).sum())
        if m.size > 1 and not np.all(np.diff(m) > 0):
            failing += 1
        if m.min() < worst[0]:
            worst = (float(m.min()), key)
    return Verdict(
        name=f"lambda-condition(delta={delta:g})" + ("" if delta_s is None else f", s_n's delta={delta_s:g}"),
        location="Theorem formal_convergence vs Lemma lmbound1",
        kind="condition",
        claim="the Theorem's lambda satisfies lambda <= T^-1 exp(-M n r_n*/s_n) with M diverging",
        holds=failing == 0,
        details={
            "delta": delta,
            **({} if delta_s is None else {"delta_s": delta_s}),
            "lines_failing": failing,
            "lines": len(lines),
            "points_M_max_below_1": below_one,
            "min_M_max": worst[0],
            "argmin_(L,N,s,p)": str(worst[1]),
        },
    )


@check.arguments(n="positive", s="positive", L="count", N="count", p="count", B="positive")
def check_sigma_n_algebra(
    n: float = 1e4, s: float = 10, L: int = 2, N: int = 8, p: int = 10, B: float = 3.0
) -> Verdict:
    """Claim: ``16 s_n^2 log(3N) (2BN)^{2L} {(p+1+1/(BN-1))^2 + ...} = s*/(2n)`` with the defined ``s_n^2``.

    The definition has ``(p+1+1/(BN-1))`` unsquared, so the left side exceeds ``s*/(2n)``.
    """

    def lhs(squared: bool) -> float:
        return math.exp(
            math.log(16)
            + log_sigma_n_sq(n, s, L, N, p, B, squared=squared)
            + math.log(math.log(3 * N))
            + 2 * L * math.log(2 * B * N)
            + math.log(sigma_n_bracket(p, B, N, True))
        )

    target = s / (2 * n)
    return equality(
        name="sigma_n-definition",
        location="App. B, definition of sigma_n^2 vs the last display of Lemma bound_elbo's proof",
        claim="16 sigma_n^2 log(3N)(2BN)^{2L}{(p+1+1/(BN-1))^2+...} = s*/(2n)",
        claimed=lhs(False),
        reference=target,
        keys=("lhs_paper_sigma", "s/(2n)"),
        extra={"lhs_squared_sigma": lhs(True), "ratio": lhs(False) / target},
    )


@check.arguments(L="count", N="count", p="count", B="positive")
def bound_elbo_pre_algebra(L: int, N: int, p: int, B: float) -> float:
    """The display after 'Combined with Equation (20)' divided by ``8 sigma_n^2 log(3N)`` (B·N > 1)."""
    check_bn_above_one(B, N)
    first = sum(B ** (2 * ell - 2) * (4 * B * B) ** (L - ell) for ell in range(1, L + 1))
    first += 2 * sum(
        B ** (ell - 1) * B ** (k - 1) * (4 * B * B) ** (L - ell) * (2 * B) ** (ell - k)
        for ell in range(1, L + 1)
        for k in range(1, ell)
    )
    second = sum(N ** (2 * (L - ell)) * (4 * B * B) ** (L - ell) for ell in range(1, L + 1))
    second += 2 * sum(
        N ** (L - ell) * N ** (L - k) * (4 * B * B) ** (L - ell) * (2 * B) ** (ell - k)
        for ell in range(1, L + 1)
        for k in range(1, ell)
    )
    return 2 * N ** (2 * L - 2) * (p + 1 + 1 / (B * N - 1)) ** 2 * first + 2 * second


def check_bound_elbo_algebra(
    Ls: Iterable[int] = (1, 2, 3, 5, 8), Ns: Iterable[int] = (2, 4, 16, 64), ps: Iterable[int] = (1, 5, 50)
) -> Verdict:
    """'With some algebra' chain: pre-algebra display <= ``16 s^2 log(3N)(2BN)^{2L}{(...)^2 + ...}``."""
    worst = -math.inf
    for L in Ls:
        for N in Ns:
            for p in ps:
                for B in (2.5, 4.0):
                    final = 2 * (2 * B * N) ** (2 * L) * sigma_n_bracket(p, B, N, True)
                    worst = max(worst, bound_elbo_pre_algebra(L, N, p, B) / final)
    return ratio_at_most_one(
        name="bound_elbo-algebra",
        location="App. B, 'with some algebra' chain in Lemma bound_elbo's proof",
        claim="pre-algebra expression <= 16 sigma^2 log(3N) (2BN)^{2L} {(p+1+1/(BN-1))^2 + ...}",
        ratio=worst,
        key="max_ratio_lhs_over_rhs",
        tol=1e-12,
    )


def check_r_n_lower(grid: Iterable[GridPoint] | None = None) -> Verdict:
    """``s*/(2n) <= r_n*`` (last step of the sigma_n display)."""
    return ratio_at_most_one(
        name="r_n-lower",
        location="App. B, end of the f_theta - f_theta* bound",
        claim="s*/(2n) <= r_n*",
        ratio=max(g.s / (2 * g.n) / r_n(g.n, g.L, g.N, g.s, g.p) for g in (grid or default_grid())),
        key="max_ratio",
    )


def check_footnote_sigma_n(grid: Iterable[GridPoint] | None = None, B: float = 3.0) -> Verdict:
    """Footnote: the proof's ``sigma_n^2`` satisfies Condition ``cond:bound`` (and ``T = NL``)."""
    pts = list(grid or default_grid())
    undefined, violated, example = 0, 0, None
    for g in pts:
        bound = cond_bound_sigma_sq(g.T, g.n, r_n(g.n, g.L, g.N, g.s, g.p))
        if math.isnan(bound):
            undefined += 1
        elif log_sigma_n_sq(g.n, g.s, g.L, g.N, g.p, B) > math.log(bound):
            violated += 1
        if example is None and g.L >= 2:
            example = g
    if example is None:
        raise ValueError("the grid must contain a point with L >= 2")
    return Verdict(
        name="footnote-sigma_n",
        location="App. B, footnote to sigma_n^2 (Condition cond:bound)",
        kind="condition",
        claim="sigma_n^2 <= 1/(2 log(T/(r_n* log^2 n))) (the footnote's reason uses T = NL)",
        holds=violated == 0,
        details={
            "points": len(pts),
            "violated": violated,
            "undefined_log<=0": undefined,
            "T": example.T,
            "NL": example.N * example.L,
        },
    )


@check.arguments(sigmas="positives", B="positive")
def check_chernoff_tail(sigmas: Iterable[float] = (0.05, 0.1, 0.2, 0.4, 0.7, 1.0), B: float = 3.0) -> Verdict:
    """Lemma ``bound``: ``int_{B+1}^inf N(t; B, s^2) dt <= exp(-1/(2 s^2)) / 2`` (quadrature reference)."""
    worst = -math.inf
    for s in sigmas:

        def dens(t: float, s: float = s) -> float:
            return math.exp(-((t - B) ** 2) / (2 * s * s)) / math.sqrt(2 * math.pi * s * s)

        tail = integrate.quad(dens, B + 1, B + 1 + 60 * s, epsabs=0, epsrel=1e-12, limit=200)[0]
        if tail > 1e-250:  # the ratio from the quadrature, as long as it resolves the tail
            worst = max(worst, tail / (0.5 * math.exp(-1 / (2 * s * s))))
        else:  # the exact tail Phi(-1/s) in log space: exp(-1/(2 s^2)) underflows (0/0 at s = 0.01)
            worst = max(worst, math.exp(float(log_ndtr(-1 / s)) - math.log(0.5) + 1 / (2 * s * s)))
    return ratio_at_most_one(
        name="chernoff-tail",
        location="App. B, proof of Lemma bound",
        claim="P(N(B, s^2) > B+1) <= exp(-1/(2 s^2))/2",
        ratio=worst,
        key="max_ratio_tail_over_bound",
    )


@check.arguments(B="positive", sigma="positive")
def check_lower_tail_typo(B: float = 3.0, sigma: float = 0.3) -> Verdict:
    """Claim: ``q(theta_i < -(B+1)) <= int_{-inf}^{-(B+1)} N(t; B, s^2) dt`` (density centred at +B).

    The witness q puts all slab mass on the component ``mu = -B`` (allowed by ``|mu_k| <= B``).
    """
    log_stated = float(norm.logcdf(-(B + 1), loc=B, scale=sigma))
    log_actual = float(norm.logcdf(-(B + 1), loc=-B, scale=sigma))
    return Verdict(
        name="lower-tail-density",
        location="App. B, proof of Lemma bound (second display)",
        kind="bound",
        claim="q(theta_i < -(B+1)) <= int_{-inf}^{-(B+1)} N(t; B, sigma_m^2) dt",
        holds=log_actual <= log_stated,
        details={
            "stated_integral": math.exp(log_stated),
            "q_mass_mu=-B": math.exp(log_actual),
            "log_stated_integral": log_stated,
        },
    )


def check_condition_implies_lemma_bound(delta: float = 1.5, grid: Iterable[GridPoint] | None = None) -> Verdict:
    """Condition ``cond:bound`` (``log^2 n``) implies Lemma ``bound``'s ``s^2 <= 1/(2 log(T/eps_n^2))``."""
    bad, undefined = 0, 0
    for g in grid or default_grid():
        rn = r_n(g.n, g.L, g.N, g.s, g.p)
        cond, eps2 = cond_bound_sigma_sq(g.T, g.n, rn), eps_n(g.n, g.L, g.N, g.s, g.p, delta) ** 2
        if math.isnan(cond) or eps2 >= g.T:
            undefined += 1
        elif cond > 1 / (2 * math.log(g.T / eps2)):
            bad += 1
    return Verdict(
        name=f"cond-bound-implies-lemma(delta={delta:g})",
        location="Condition cond:bound vs proof of Lemma bound",
        kind="condition",
        claim="sigma^2 <= 1/(2 log(T/(r_n log^2 n))) implies sigma^2 <= 1/(2 log(T/eps_n^2))",
        holds=bad == 0,
        details={"violations": bad, "undefined": undefined, "delta": delta},
    )


@check.arguments(sigma_n_sq="positive", sigma0_sq="positive")
def check_prior_variance_typo(sigma_n_sq: float = 1e-3, sigma0_sq: float = 1.0) -> Verdict:
    """Eq. (53)-(55): ``KL[GMM || N(0, sigma_n^2)]`` is written for ``KL[GMM || N(0, sigma_0^2)]``."""
    slab = GaussianMixture(weights=np.array([0.9, 0.1]), means=np.array([1.0, -1.0]), variances=np.full(2, sigma_n_sq))
    return equality(
        name="prior-variance-typo",
        location="App. B, KL bound in Lemma bound_elbo's proof, line after eq. (53)",
        claim="sum KL[spike-GMM || spike-N(0, s0^2)] = ... gamma* KL[GMM || N(0, sigma_n^2)]",
        claimed=kl_mixture(slab, GaussianMixture.single(0.0, sigma_n_sq)),
        reference=kl_mixture(slab, GaussianMixture.single(0.0, sigma0_sq)),
        keys=("kl_to_N(0,sigma_n^2)", "kl_to_N(0,sigma_0^2)"),
    )
