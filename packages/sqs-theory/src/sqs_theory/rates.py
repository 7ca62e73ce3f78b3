"""The rates and hyperparameters of Theorem ``convergence`` / Appendix B, as plain functions.

Symbols: ``n`` samples, ``L`` hidden layers of width ``N``, input dimension ``p``, sparsity ``s``
(``s*`` in the paper), ``delta`` the log-power.  ``T`` is the number of network parameters; the paper
never writes it out, we use ``T = (p + 1) N + (L - 1)(N + 1) N + (N + 1)`` (weights and biases of an
L-hidden-layer, width-N, scalar-output network).  Logarithms are natural.

Domains (checked; a ``ValueError`` names the bad argument): ``L, N, p, T >= 1`` integers (an integral float
such as ``2.0`` is taken as the int), ``s > 0`` and ``delta > 0`` finite reals, ``n >= 1`` finite, and
``n > 1`` wherever a power ``log^a(n)`` appears (``eps_n``, ``s_n``, ``lambda_condition_max_m``).
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from . import _validate as check

__all__ = [
    "GridPoint",
    "cond_bound_sigma_sq",
    "default_grid",
    "eps_n",
    "lambda_condition_max_m",
    "log_sigma_n_sq",
    "n_params",
    "neg_log_lambda",
    "r_n",
    "s_n",
    "sigma_n_bracket",
]


_LOG_FLOAT_MAX = math.log(sys.float_info.max)


def _exp_or_inf(exponent: float) -> float:
    """e^exponent, +inf past float range (``math.exp`` and ``**`` raise OverflowError there), 0 below it."""
    return math.exp(exponent) if exponent < _LOG_FLOAT_MAX else math.inf


def _log_power(n: float, a: float) -> float:
    """log(n)^a for n > 1."""
    return _exp_or_inf(a * math.log(math.log(n)))


def _architecture(L: int, N: int, p: int) -> tuple[int, int, int]:
    return check.count("L", L, low=1), check.count("N", N, low=1), check.count("p", p, low=1)


def _n(n: float, *, log_power: bool = False) -> float:
    """The sample size: finite, >= 1 (> 1 where ``log^a(n)`` is raised to a power)."""
    return check.real("n", n, low=1.0, strict=log_power)


def _delta(delta: float) -> float:
    return check.real("delta", delta, low=0.0, strict=True)


def _s(s: float) -> float:
    return check.real("s", s, low=0.0, strict=True)


def n_params(L: int, N: int, p: int) -> int:
    """``T``: weights and biases of an L-hidden-layer, width-N network with p inputs and one output."""
    L, N, p = _architecture(L, N, p)
    return (p + 1) * N + (L - 1) * (N + 1) * N + (N + 1)


def r_n(n: float, L: int, N: int, s: float, p: int) -> float:
    """``r_n(L, p, s) = ((L + 1) s / n) log N + (s / n) log(p sqrt(n / s))`` (Appendix B, eq. def_sstar).

    Evaluated as (s / n) [(L + 1) log N + log p + (log n − log s) / 2]: a finite bracket times s / n, so finite,
    ±inf or 0, never NaN (the literal form gave 0 · inf = NaN at n = 1e100, s = 1e-300, and with N = 1 at
    (L + 1) s past float range)."""
    n, s, (L, N, p) = _n(n), _s(s), _architecture(L, N, p)
    return (s / n) * _rate_bracket(n, L, N, s, p)


def _rate_bracket(n: float, L: int, N: int, s: float, p: int) -> float:
    """b = (L + 1) log N + log p + (log n − log s) / 2, so that r_n = (s / n) b: finite for finite n, s > 0."""
    return (L + 1) * math.log(N) + math.log(p) + 0.5 * (math.log(n) - math.log(s))


def eps_n(n: float, L: int, N: int, s: float, p: int, delta: float) -> float:
    """``eps_n = sqrt(r_n) log^delta(n)`` (Lemma ``lmbound1``); ``n > 1``, ``delta > 0``."""
    _n(n, log_power=True)
    _delta(delta)
    rate = r_n(n, L, N, s, p)
    if rate < 0:
        raise ValueError(
            f"r_n = {rate:.6g} < 0 at n={n!r}, L={L!r}, N={N!r}, s={s!r}, p={p!r} (s above n p^2 N^(2(L+1))): "
            "eps_n = sqrt(r_n) is undefined"
        )
    b = _rate_bracket(n, L, N, s, p)
    if b == 0:
        return 0.0
    # in log space: sqrt(r_n) may underflow to 0 beside a log^delta(n) past float range (0 * inf = NaN)
    return _exp_or_inf(0.5 * (math.log(s) - math.log(n) + math.log(b)) + delta * math.log(math.log(n)))


def s_n(s: float, n: float, delta: float) -> float:
    """``s_n = s* log^(2 delta - 1)(n)`` (Section 3.2, before Lemma ``lmbound1``); s > 0, n > 1, delta > 0."""
    _s(s)
    _n(n, log_power=True)
    _delta(delta)
    return s * _log_power(n, 2 * delta - 1)


def neg_log_lambda(n: float, L: int, N: int, p: int, delta: float, *, T: int | None = None) -> float:
    """``-log lambda = log T + delta [(L + 1) log N + log(sqrt(n) p)]`` (Theorem ``formal_convergence``).

    ``T`` defaults to :func:`n_params` (weights and biases); pass the parameter count of another architecture.
    """
    n, delta, (L, N, p) = _n(n), _delta(delta), _architecture(L, N, p)
    T = n_params(L, N, p) if T is None else check.count("T", T, low=1)
    return math.log(T) + delta * ((L + 1) * math.log(N) + math.log(math.sqrt(n) * p))


def lambda_condition_max_m(
    n: float, L: int, N: int, s: float, p: int, delta: float, *, delta_s: float | None = None
) -> float:
    """Largest ``M`` with ``lambda <= T^-1 exp(-M n r_n / s_n)`` for the Theorem's lambda.

    Lemma ``lmbound1`` needs this for a diverging ``M``: ``M_max = (-log lambda - log T) s_n / (n r_n)``.
    ``n > 1``, ``s > 0``, ``delta > 0`` (the Theorem's, in lambda); ``delta_s`` the delta of
    ``s_n = s* log^(2 delta - 1)(n)``, which the paper defines for delta > 1 and writes with the same symbol
    (default: ``delta``, one constant; erratum B10). With s_n / (n r_n) = log^(2 delta_s - 1)(n) / b, b = (L + 1)
    log N + log p + (log n - log s) / 2 (s cancels), and -log lambda - log T = delta [(L + 1) log N + log(sqrt(n) p)],
    it is evaluated in log space: the literal product gave 0 * inf = NaN and 0 / 0 at the edges of float range.
    +inf where b <= 0 (r_n <= 0: every M >= 0 satisfies the condition, the margin being >= 0).
    """
    n, s, delta, (L, N, p) = _n(n, log_power=True), _s(s), _delta(delta), _architecture(L, N, p)
    delta_s = delta if delta_s is None else check.real("delta_s", delta_s, low=0.0, strict=True)
    log_n = math.log(n)
    b = _rate_bracket(n, L, N, s, p)
    if b <= 0:
        return math.inf
    margin_terms = (L + 1) * math.log(N) + math.log(p) + 0.5 * log_n  # > 0: n > 1
    return _exp_or_inf(math.log(delta) + math.log(margin_terms) + (2 * delta_s - 1) * math.log(log_n) - math.log(b))


def check_bn_above_one(B: float, N: int) -> None:
    """A ValueError unless B·N > 1: the proof's 1/(BN − 1) (a pole at B·N = 1; negative below)."""
    if not B * N > 1:
        raise ValueError(f"B·N must be > 1 (the proof's 1/(BN - 1)), got B={B!r}, N={N!r}")


@check.arguments(p="count", B="positive", N="count")
def sigma_n_bracket(p: int, B: float, N: int, squared: bool) -> float:
    """``{(p+1+1/(BN-1))^(1 or 2) + 1/((2BN)^2-1) + 2/(2BN-1)^2}`` of sigma_n^2 and its bound: p, N >= 1 integers,
    B > 0 finite, B·N > 1."""
    check_bn_above_one(B, N)
    first = p + 1 + 1 / (B * N - 1)
    return (first**2 if squared else first) + 1 / ((2 * B * N) ** 2 - 1) + 2 / (2 * B * N - 1) ** 2


@check.arguments(n="at_least_one", s="positive", L="count", N="count", p="count", B="positive")
def log_sigma_n_sq(n: float, s: float, L: int, N: int, p: int, B: float, *, squared: bool = False) -> float:
    """``log sigma_n^2`` of the proof of Lemma ``bound_elbo`` (log space: ``(2BN)^(-2L)`` underflows).

    ``sigma_n^2 = s/(32 n) log(3N)^-1 (2BN)^(-2L) {(p+1+1/(BN-1)) + 1/((2BN)^2-1) + 2/(2BN-1)^2}^-1``;
    ``squared=True`` uses ``(p+1+1/(BN-1))^2``, the form the proof's final algebra needs. n >= 1, s > 0 and
    B > 0 finite, L, N, p >= 1 integers, B·N > 1 (a ValueError names the argument; ``n=0`` had divided by zero,
    ``p=0`` returned a number).
    """
    ratio = s / (32 * n)
    return (
        (math.log(ratio) if ratio >= sys.float_info.min else math.log(s) - math.log(32) - math.log(n))  # underflow
        - math.log(math.log(3 * N))
        - 2 * L * math.log(2 * B * N)
        - math.log(sigma_n_bracket(p, B, N, squared))
    )


def cond_bound_sigma_sq(T: int, n: float, rn: float) -> float:
    """Condition ``cond:bound``: ``sigma_k^2 <= 1 / (2 log(T / (r_n log^2 n)))``; NaN where the condition is
    undefined (the log <= 0, or r_n <= 0). ``T`` >= 1, ``n`` > 1 and ``rn`` finite (n = 1 divided by 0 before)."""
    T, n, rn = check.count("T", T, low=1), _n(n, log_power=True), check.real("rn", rn)
    if rn <= 0:
        return math.nan
    arg = T / (rn * math.log(n) ** 2)
    return 1 / (2 * math.log(arg)) if arg > 1 else math.nan


@dataclass(frozen=True, kw_only=True)
class GridPoint:
    """One ``(n, L, N, s, p)`` configuration of the numerical grid."""

    n: float
    L: int
    N: int
    s: int
    p: int

    @property
    def T(self) -> int:  # noqa: N802 - the paper's symbol
        return n_params(self.L, self.N, self.p)


def default_grid() -> Iterator[GridPoint]:
    """n in 1e2..1e12, L in {1,2,4,8}, N in {2,8,32,128}, s in {1,10,100,1000}, p in {1,10,100}.

    Points with ``s > T`` or ``s >= n`` are skipped (the oracle sparsity cannot exceed either).
    """
    for n, L, N, s, p in itertools.product(
        (1e2, 1e3, 1e4, 1e6, 1e9, 1e12), (1, 2, 4, 8), (2, 8, 32, 128), (1, 10, 100, 1000), (1, 10, 100)
    ):
        point = GridPoint(n=n, L=L, N=N, s=s, p=p)
        if s <= point.T and s < n:
            yield point
