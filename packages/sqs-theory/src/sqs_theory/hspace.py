"""The sparse-quantized parameter space H(T, s, K) of Appendix B.

Paper's definition (Appendix B)::

    I(T, s, K) = {I = [r_1, ..., r_T]^T : ||I||_0 <= s, r_i in {0,1}^K, ||r_i||_0 <= 1}
    H(T, s, K) = {theta = I E : E in [-B, B]^K, I in I(T, s, K)}

so ``theta in H`` iff ``||theta||_0 <= s``, ``theta`` has at most ``K`` distinct *non-zero* values, and
``||theta||_inf <= B``.  We use ``<= s`` throughout (the paper's text also writes ``||theta||_0 < s`` and
"consists of s many one-hot rows"; see the errata).

Projection onto H (``argmin_{theta in H} ||theta - x||^2``):

* :func:`project_exact` - exact dynamic programme.  Lemma: in an optimal solution every level's group
  of entries is a contiguous run of the *sorted* entries (a zero-assigned entry strictly between two
  entries of a level ``c != 0`` can be swapped with one of them for a strict gain of ``2|c| |x_a - x_z|``,
  and nearest-level cells are intervals).  So the optimum chooses at most K disjoint runs of total
  length at most s, each set to its clipped mean; everything else is 0.  O(T^2 K s) time.
* :func:`project_brute` - enumeration over I(T, s, K) with the optimal E for each I (tests only).
* :func:`project_heuristic` - FAST HEURISTIC for large T: alternate (support | levels) and
  (levels | support); cost never increases, but optimality is not guaranteed.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _validate as check

__all__ = [
    "Projection",
    "in_h",
    "index_decomposition",
    "index_space_size",
    "index_space_size_brute",
    "index_space_size_sympy",
    "log_index_space_size",
    "project_brute",
    "project_exact",
    "project_heuristic",
    "quantize_exact",
]


def _validate(s: int, K: int, B: float) -> tuple[int, int, float]:
    """``(s, K, B)`` checked: s >= 0 and K >= 1 integers (returned as ``int``), B finite and > 0."""
    return check.count("s", s), check.count("K", K, low=1), check.real("B", B, low=0.0, strict=True)


def _vector(name: str, x: np.ndarray) -> np.ndarray:
    """``x`` flattened to a float vector of finite reals."""
    return check.finite_array(name, x).ravel()


def in_h(theta: np.ndarray, *, s: int, K: int, B: float) -> bool:
    """Membership in H(T, s, K): ``||theta||_0 <= s``, <= K distinct non-zero values, all in [-B, B]."""
    s, K, B = _validate(s, K, B)
    theta = _vector("theta", theta)
    nz = theta[theta != 0]
    return bool(nz.size <= s and np.unique(nz).size <= K and np.all(np.abs(theta) <= B))


def index_decomposition(theta: np.ndarray, *, s: int, K: int, B: float) -> tuple[np.ndarray, np.ndarray]:
    """A witness ``(I, E)`` with ``theta = I E``, ``I in I(T, s, K)``, ``E in [-B, B]^K``."""
    if not in_h(theta, s=s, K=K, B=B):
        raise ValueError(f"theta is not in H(T, s={s}, K={K}) with B={B}")
    K = check.count("K", K, low=1)
    theta = _vector("theta", theta)
    levels = np.unique(theta[theta != 0])
    E = np.concatenate([levels, np.zeros(K - levels.size)])
    index = (theta[:, None] == levels[None, :]).astype(np.int8)  # (T, #levels), one-hot rows
    index = np.concatenate([index, np.zeros((theta.size, K - levels.size), np.int8)], axis=1)
    return index, E


def index_space_size(T: int, s: int, K: int) -> int:
    """``|I(T, s, K)| = sum_{j=0}^{min(s,T)} C(T, j) K^j`` (exact integer; T, s >= 0 and K >= 1 integers).

    ``(K + 1)^T`` at once when s >= T; otherwise each term from the last, C(T, j+1) K^(j+1) = C(T, j) K^j (T − j) K
    / (j + 1) (exact: j + 1 divides C(T, j) (T − j)). The integer has ~s log10(TK/s) digits, so a network-sized T
    and s take seconds (T = 270,000, s = T/2: 14.5 s): :func:`log_index_space_size` gives its logarithm in ms."""
    T, (s, K, _) = check.count("T", T), _validate(s, K, 1.0)
    if s >= T:
        return (K + 1) ** T
    total, term = 0, 1
    for j in range(s + 1):
        total += term
        term = term * (T - j) * K // (j + 1)
    return total


def log_index_space_size(T: int, s: int, K: int) -> float:
    """``log |I(T, s, K)|`` (natural log) in float64: T log(K + 1) when s >= T, else a log-sum-exp over j of
    log C(T, j) + j log K, with log C(T, j) = −log(T + 1) − log B(T − j + 1, j + 1) (scipy's ``betaln``). For T, s
    of a real network, where the exact integer of :func:`index_space_size` is out of reach. Against the log of
    the exact integer: relative error below 1e-9 up to T = 10^18 (3e-10 at T = 10^9, s = 1000; ~1e-16 where
    j ≪ T). The log-gamma form used until session 63 cancelled two terms of size T log T: 8.8 nats off at
    T = 2^53, s = 2."""
    from scipy.special import betaln, logsumexp  # deferred: scipy costs an import only this needs

    T, (s, K, _) = check.count("T", T), _validate(s, K, 1.0)
    if s >= T:
        return T * math.log1p(K)
    j = np.arange(s + 1, dtype=np.float64)
    terms = -math.log1p(T) - betaln(T - j + 1.0, j + 1.0) + j * math.log(K)
    return float(logsumexp(terms))


def index_space_size_sympy(T: int, s: int, K: int) -> int:
    """The same count through sympy's symbolic summation (independent exact arithmetic)."""
    import sympy  # deferred: importing sympy costs ~0.5 s and only this function needs it

    T, (s, K, _) = check.count("T", T), _validate(s, K, 1.0)

    j = sympy.Symbol("j", integer=True, nonnegative=True)
    total = sympy.summation(sympy.binomial(T, j) * sympy.Integer(K) ** j, (j, 0, min(s, T)))
    return int(total)


def index_space_size_brute(T: int, s: int, K: int) -> int:
    """Count I(T, s, K) by enumerating every row choice in {0, e_1, ..., e_K}^T (small T only)."""
    T, (s, K, _) = check.count("T", T), _validate(s, K, 1.0)
    if (K + 1) ** T > 2_000_000:
        raise ValueError(f"(K+1)^T = {(K + 1) ** T} is too many to enumerate")
    return sum(1 for rows in itertools.product(range(K + 1), repeat=T) if sum(r > 0 for r in rows) <= s)


@dataclass(frozen=True, kw_only=True)
class Projection:
    """A point of H(T, s, K) and its squared distance to the projected vector."""

    theta: np.ndarray = field(repr=False)
    cost: float
    method: str


# Run costs come from each run's mean and centred sum of squares, updated one entry at a time (Welford): the
# shorter form as differences of prefix sums, sum(x^2) - 2c sum(x) + n c^2, cancels every digit for entries far
# from zero (10^8 +- 1), and the DP then picked a partition up to 2.5x worse than the optimum (session 54).


def _run_cost(xs: np.ndarray, a: int, e: int, B: float) -> tuple[float, float]:
    """(SSE, level) of the run ``xs[a:e]`` set to its mean clipped to [-B, B]."""
    run = xs[a:e]
    c = float(np.clip(run.mean(), -B, B))
    return float(((run - c) ** 2).sum()), c


def _clipped_cost(count: Any, mean: Any, m2: Any, B: float) -> Any:
    """SSE of runs with ``count`` entries, ``mean`` and centred sum of squares ``m2``, set to the clipped mean."""
    return m2 + count * (mean - np.clip(mean, -B, B)) ** 2


def project_exact(x: np.ndarray, *, s: int, K: int, B: float) -> Projection:
    """Exact projection onto H(T, s, K) by dynamic programming over the sorted entries."""
    s, K, B = _validate(s, K, B)
    x = _vector("x", x)
    T, s = x.size, min(s, x.size)
    order = np.argsort(x, kind="stable")
    xs = x[order]
    f = np.full((T + 1, K + 1, s + 1), np.inf)  # f[i, j, m]: first i sorted entries, j runs, m kept
    parent = np.full((T + 1, K + 1, s + 1), -2, dtype=np.int64)  # -1: entry i-1 -> 0; a >= 0: run [a, i)
    f[0, 0, 0] = 0.0
    for i in range(T):
        cand = f[i] + xs[i] ** 2
        better = cand < f[i + 1]
        f[i + 1][better], parent[i + 1][better] = cand[better], -1
        mean = m2 = 0.0
        for e in range(i + 1, min(T, i + s) + 1):
            length, step = e - i, xs[e - 1] - mean
            mean += step / length
            m2 += step * (xs[e - 1] - mean)
            cand = f[i, :K, : s + 1 - length] + _clipped_cost(length, mean, m2, B)
            tgt = f[e, 1:, length:]
            better = cand < tgt
            tgt[better] = cand[better]
            parent[e, 1:, length:][better] = i
    j, m = np.unravel_index(np.argmin(f[T]), f[T].shape)
    theta_sorted, e = np.zeros(T), T
    while e > 0:
        a = int(parent[e, j, m])
        if a == -1:
            e -= 1
            continue
        theta_sorted[a:e] = _run_cost(xs, a, e, B)[1]
        j, m, e = j - 1, m - (e - a), a
    theta = np.empty(T)
    theta[order] = theta_sorted
    return Projection(theta=theta, cost=float(((theta - x) ** 2).sum()), method="exact-dp")


_BRUTE_MAX = 2_000_000  # index matrices project_brute may enumerate (T = 12, s = 6, K = 3: 0.9 million, < 1 s)


def _index_space_exceeds(T: int, s: int, K: int, limit: int) -> bool:
    """|I(T, s, K)| > limit, summed term by term and stopped once past it (the exact integer can be huge)."""
    total, term = 0, 1
    for j in range(min(s, T) + 1):
        total += term
        if total > limit:
            return True
        term = term * (T - j) * K // (j + 1)
    return False


def project_brute(x: np.ndarray, *, s: int, K: int, B: float) -> Projection:
    """Projection by enumerating I(T, s, K), with ``E_k = clip(mean of its entries)`` (tests only): at most
    2,000,000 index matrices (|I(T, s, K)|, :func:`index_space_size`), else a ValueError naming T, s and K
    (T = 40, s = 20 had run for more than five minutes); :func:`project_exact` has no such limit."""
    s, K, B = _validate(s, K, B)
    x = _vector("x", x)
    if _index_space_exceeds(x.size, s, K, _BRUTE_MAX):
        raise ValueError(
            f"project_brute would enumerate |I(T, s, K)| > {_BRUTE_MAX:,} index matrices at T={x.size}, s={s}, "
            f"K={K}: too many (use project_exact)"
        )
    best_cost, best = float((x**2).sum()), np.zeros_like(x)
    for j in range(1, min(s, x.size) + 1):
        labels = np.array(list(itertools.product(range(K), repeat=j)))  # (A, j)
        onehot = labels[..., None] == np.arange(K)  # (A, j, K)
        counts = onehot.sum(axis=1)
        for support in itertools.combinations(range(x.size), j):
            xs = x[list(support)]
            sums = np.einsum("ajk,j->ak", onehot, xs)
            levels = np.clip(np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0), -B, B)
            vals = np.take_along_axis(levels, labels, axis=1)  # (A, j)
            costs = ((vals - xs) ** 2).sum(axis=1) + (x**2).sum() - (xs**2).sum()
            a = int(np.argmin(costs))
            if costs[a] < best_cost:
                best_cost, best = float(costs[a]), np.zeros_like(x)
                best[list(support)] = vals[a]
    return Projection(theta=best, cost=float(((best - x) ** 2).sum()), method="brute-force")


def quantize_exact(values: np.ndarray, *, K: int, B: float) -> Projection:
    """Optimal K-level quantization of a fixed support (1-D k-means with levels clipped to [-B, B]).

    Exact DP over the sorted values (groups are contiguous runs): O(K n^2) time, O(K n) memory.
    """
    _, K, B = _validate(0, K, B)
    v = _vector("values", values)
    n = v.size
    if n == 0:
        return Projection(theta=v.copy(), cost=0.0, method="quantize-exact")
    order = np.argsort(v, kind="stable")
    vs = v[order]
    g = np.full((K + 1, n + 1), np.inf)
    g[0, 0] = 0.0
    arg = np.zeros((K + 1, n + 1), dtype=np.int64)
    starts = np.arange(n, dtype=float)
    means, m2s = np.zeros(n), np.zeros(n)  # of the runs [a, e), a < e, one entry added per e (Welford)
    for e in range(1, n + 1):
        cnt = e - starts[:e]
        step = vs[e - 1] - means[:e]
        means[:e] += step / cnt
        m2s[:e] += step * (vs[e - 1] - means[:e])
        run = _clipped_cost(cnt, means[:e], m2s[:e], B)  # (e,)
        for k in range(1, K + 1):
            cand = g[k - 1, :e] + run
            arg[k, e] = int(np.argmin(cand))
            g[k, e] = cand[arg[k, e]]
    k, e, out = int(np.argmin(g[:, n])), n, np.empty(n)
    while e > 0:
        start = int(arg[k, e])
        out[start:e] = _run_cost(vs, start, e, B)[1]
        k, e = k - 1, start
    theta = np.empty(n)
    theta[order] = out
    return Projection(theta=theta, cost=float(((theta - v) ** 2).sum()), method="quantize-exact")


_EXACT_QUANTIZE_MAX = 4000  # above this support size the O(K n^2) quantizer gives way to Lloyd


def _lloyd(values: np.ndarray, *, K: int, B: float, iters: int = 100) -> np.ndarray:
    """1-D Lloyd (k-means) from quantile initial levels; returns the quantized values (heuristic)."""
    levels = np.clip(np.quantile(values, (np.arange(K) + 0.5) / K), -B, B)
    for _ in range(iters):
        k = np.abs(values[:, None] - levels[None, :]).argmin(axis=1)
        sums, counts = np.bincount(k, values, K), np.bincount(k, minlength=K)
        new = np.where(counts > 0, np.clip(sums / np.maximum(counts, 1), -B, B), levels)
        if np.array_equal(new, levels):
            break
        levels = new
    return levels[np.abs(values[:, None] - levels[None, :]).argmin(axis=1)]


def _quantize(values: np.ndarray, *, K: int, B: float) -> np.ndarray:
    if values.size <= _EXACT_QUANTIZE_MAX:
        return quantize_exact(values, K=K, B=B).theta
    return _lloyd(values, K=K, B=B)


def project_heuristic(x: np.ndarray, *, s: int, K: int, B: float, max_iter: int = 50) -> Projection:
    """HEURISTIC projection for large T (not guaranteed optimal; cost never increases).

    Start from the top-s magnitudes; then alternate (a) the K-level quantization of the current
    support (:func:`quantize_exact`, or 1-D Lloyd above 4000 entries) and (b) the best support for
    the current levels (keep the s entries with the largest positive saving
    ``x_i^2 - min_k (x_i - c_k)^2``). ``max_iter >= 1`` rounds.
    """
    s, K, B = _validate(s, K, B)
    max_iter = check.count("max_iter", max_iter, low=1)
    x = _vector("x", x)
    support = np.argsort(-np.abs(x), kind="stable")[: min(s, x.size)]
    theta, cost = np.zeros_like(x), float((x**2).sum())
    for _ in range(max_iter):
        cand = np.zeros_like(x)
        cand[support] = _quantize(x[support], K=K, B=B)
        new_cost = float(((cand - x) ** 2).sum())
        if new_cost >= cost - 1e-15 * max(1.0, cost):
            break
        theta, cost = cand, new_cost
        levels = np.unique(theta[theta != 0])
        if levels.size == 0:
            break
        saving = x**2 - ((x[:, None] - levels[None, :]) ** 2).min(axis=1)
        ranked = np.argsort(-saving, kind="stable")[: min(s, x.size)]
        support = ranked[saving[ranked] > 0]
    return Projection(theta=theta, cost=cost, method="heuristic-alternating")
