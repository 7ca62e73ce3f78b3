"""The exact bootstrap distribution of a 0/1 statistic, for tests of bootstrap intervals (tests/bench, tests/theory):
resampling n values of which a fraction p are 1 gives Binomial(n, p) ones."""

import math


def binomial_quantile(n: int, p: float, q: float) -> int:
    """The smallest k with P(Binomial(n, p) ≤ k) ≥ q."""
    cumulative = 0.0
    for k in range(n + 1):
        cumulative += math.comb(n, k) * p**k * (1 - p) ** (n - k)
        if cumulative >= q:
            return k
    return n
