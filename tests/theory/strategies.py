"""Shared hypothesis strategies for the sqs-theory tests."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from sqs_theory.kl import GaussianMixture
from sqs_theory.likelihood import SpikeGMMPosterior
from sqs_theory.rates import GridPoint, n_params

means = st.floats(min_value=-3.0, max_value=3.0, allow_nan=False)
variances = st.floats(min_value=1e-3, max_value=4.0, allow_nan=False)
prior_variances = st.floats(min_value=0.1, max_value=4.0, allow_nan=False)
probabilities = st.floats(min_value=0.01, max_value=0.99, allow_nan=False)


@st.composite
def simplex(draw: st.DrawFn, k: int, *, floor: float = 0.01) -> np.ndarray:
    """A probability vector of length k with every entry >= floor / k-ish."""
    raw = np.array(draw(st.lists(st.floats(floor, 1.0), min_size=k, max_size=k)))
    return raw / raw.sum()


@st.composite
def gaussian_mixtures(draw: st.DrawFn, *, k_min: int = 1, k_max: int = 4, k: int | None = None) -> GaussianMixture:
    """A 1-D GMM with means in [-3, 3] and variances in [1e-3, 4]."""
    k = k if k is not None else draw(st.integers(k_min, k_max))
    return GaussianMixture(
        weights=draw(simplex(k)),
        means=np.array(draw(st.lists(means, min_size=k, max_size=k))),
        variances=np.array(draw(st.lists(variances, min_size=k, max_size=k))),
    )


@st.composite
def mixture_pairs(draw: st.DrawFn, *, k_max: int = 3) -> tuple[GaussianMixture, GaussianMixture]:
    """Two GMMs with the same number of components (Lemma mix matches them by index)."""
    k = draw(st.integers(1, k_max))
    return draw(gaussian_mixtures(k=k)), draw(gaussian_mixtures(k=k))


@st.composite
def posteriors(draw: st.DrawFn, *, T: int, K: int, level_var: float = 0.0) -> SpikeGMMPosterior:
    """A spike-and-GMM posterior with shared levels in [-2, 2]."""
    return SpikeGMMPosterior(
        lam_tilde=np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=T, max_size=T))),
        phi=np.stack([draw(simplex(K, floor=0.0 + 1e-3)) for _ in range(T)]),
        mu=np.array(draw(st.lists(st.floats(-2.0, 2.0), min_size=K, max_size=K))),
        var=np.full(K, level_var),
    )


# Rounded to 6 decimals: squares never underflow, so "distance 0" and "equal" coincide.
entries = st.one_of(
    st.floats(-4.0, 4.0, allow_nan=False).map(lambda v: round(v, 6)),
    st.sampled_from([0.0, 1.0, -1.0, 2.5, 3.0]),
)


@st.composite
def small_vectors(draw: st.DrawFn, *, max_T: int = 6) -> np.ndarray:
    """Short vectors, with repeated values and zeros so that ties are exercised."""
    return np.array(draw(st.lists(entries, min_size=1, max_size=max_T)))


@st.composite
def hspace_params(draw: st.DrawFn, T: int) -> tuple[int, int, float]:
    """(s, K, B) for a vector of length T."""
    return draw(st.integers(0, T)), draw(st.integers(1, 3)), draw(st.floats(0.5, 5.0))


@st.composite
def grid_points(draw: st.DrawFn) -> GridPoint:
    """A configuration (n, L, N, s, p) with s <= T and s < n."""
    L, N, p = draw(st.integers(1, 8)), draw(st.integers(2, 256)), draw(st.integers(1, 200))
    n = float(10 ** draw(st.floats(2.0, 12.0)))
    s = draw(st.integers(1, max(1, min(n_params(L, N, p), int(n) - 1, 10_000))))
    return GridPoint(n=n, L=L, N=N, s=s, p=p)


# --- the convergence study (synthetic teacher, recovery, projection) --------------------------------
teacher_seeds = st.integers(min_value=0, max_value=10_000)
unit_scales = st.lists(st.floats(min_value=0.4, max_value=2.5, allow_nan=False), min_size=6, max_size=6)


@st.composite
def unit_permutations(draw: st.DrawFn, width: int = 6) -> list[int]:
    """A permutation of the hidden units."""
    return draw(st.permutations(list(range(width))))
