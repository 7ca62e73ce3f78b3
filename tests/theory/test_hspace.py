"""H(T, s, K): membership, the index-space size, and projection (exact DP vs brute force)."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqs_theory.hspace import (
    in_h,
    index_decomposition,
    index_space_size,
    index_space_size_brute,
    index_space_size_sympy,
    log_index_space_size,
    project_brute,
    project_exact,
    project_heuristic,
    quantize_exact,
)

from .strategies import hspace_params, small_vectors


@st.composite
def members(draw: st.DrawFn):
    """theta = I E with I drawn from I(T, s, K) and E from [-B, B]^K."""
    T, K, B = draw(st.integers(1, 8)), draw(st.integers(1, 3)), draw(st.floats(0.5, 5.0))
    s = draw(st.integers(0, T))
    rows = draw(st.lists(st.integers(0, K), min_size=T, max_size=T))  # 0 = zero row, k = e_k
    rows = [r if i < s else 0 for i, r in enumerate(sorted(rows, key=lambda r: r == 0))]
    perm = draw(st.permutations(range(T)))
    E = np.array(draw(st.lists(st.floats(-B, B), min_size=K, max_size=K)))
    index = np.zeros((T, K))
    for i, r in zip(perm, rows, strict=True):
        if r:
            index[i, r - 1] = 1.0
    return index @ E, s, K, B


@given(member=members())
def test_every_index_times_levels_is_in_h_and_decomposes_back(member):
    theta, s, K, B = member
    assert in_h(theta, s=s, K=K, B=B)
    index, E = index_decomposition(theta, s=s, K=K, B=B)
    np.testing.assert_array_equal(index @ E, theta)
    assert np.all(index.sum(axis=1) <= 1) and int(index.sum()) <= s
    assert np.all(np.abs(E) <= B)


@settings(max_examples=30)
@given(x=small_vectors(max_T=5), data=st.data())
def test_membership_iff_zero_distance(x, data):
    s, K, B = data.draw(hspace_params(x.size))
    assert in_h(x, s=s, K=K, B=B) == (project_brute(x, s=s, K=K, B=B).cost <= 1e-24)


def test_membership_counts_nonzero_levels_only():
    theta = np.array([0.0, 1.0, 2.0])  # three distinct values, two non-zero levels
    assert in_h(theta, s=2, K=2, B=3.0)
    assert not in_h(theta, s=1, K=2, B=3.0)
    assert not in_h(theta, s=2, K=1, B=3.0)
    assert not in_h(theta, s=2, K=2, B=1.5)
    with pytest.raises(ValueError, match="not in H"):
        index_decomposition(theta, s=1, K=2, B=3.0)


@settings(max_examples=60)
@given(x=small_vectors(max_T=6), data=st.data())
def test_exact_dp_matches_brute_force(x, data):
    s, K, B = data.draw(hspace_params(x.size))
    exact, brute = project_exact(x, s=s, K=K, B=B), project_brute(x, s=s, K=K, B=B)
    assert exact.cost == pytest.approx(brute.cost, abs=1e-9)
    assert in_h(exact.theta, s=s, K=K, B=B)
    assert exact.cost == pytest.approx(float(((exact.theta - x) ** 2).sum()), abs=1e-12)


@st.composite
def far_from_zero(draw: st.DrawFn):
    """Entries spread by ~1 around a common offset of up to 10^12 (or around ±offset, two clusters): the run
    costs as differences of prefix sums of squares lose every digit there (session 54)."""
    offset = 10.0 ** draw(st.integers(0, 12))
    T = draw(st.integers(2, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))  # values with every digit used, unlike
    spread = rng.normal(size=T) * draw(st.sampled_from([0.1, 1.0, 3.0]))  # hypothesis' short floats
    signs = rng.choice([-1.0, 1.0], size=T)
    two_clusters = draw(st.booleans())
    return offset * (signs if two_clusters else 1.0) + spread, offset


@settings(max_examples=300)
@given(case=far_from_zero(), data=st.data())
def test_exact_dp_and_quantizer_are_exact_far_from_zero(case, data):
    x, offset = case
    s, K = data.draw(st.integers(1, x.size)), data.draw(st.integers(1, 3))
    B = 2 * offset
    exact, brute = project_exact(x, s=s, K=K, B=B), project_brute(x, s=s, K=K, B=B)
    assert exact.cost <= brute.cost * (1 + 1e-6) + 1e-9 * offset
    quantized = quantize_exact(x, K=K, B=B)
    assert quantized.cost <= _best_quantization_cost(x, K, B) * (1 + 1e-6) + 1e-9 * offset


@given(x=small_vectors(max_T=10), data=st.data())
def test_heuristic_lands_in_h_and_never_beats_the_exact_dp(x, data):
    s, K, B = data.draw(hspace_params(x.size))
    heur, exact = project_heuristic(x, s=s, K=K, B=B), project_exact(x, s=s, K=K, B=B)
    assert in_h(heur.theta, s=s, K=K, B=B)
    assert heur.cost >= exact.cost - 1e-9


def test_the_optimal_support_is_not_the_top_s_magnitudes():
    x = np.array([-5.0, 3.0, 3.0, 3.0])
    best = project_exact(x, s=3, K=1, B=10.0)
    np.testing.assert_array_equal(best.theta, [0.0, 3.0, 3.0, 3.0])
    top = np.array([-5.0, 3.0, 3.0, 0.0])  # top-3 magnitudes with its best single level
    top_cost = float(((np.where(top != 0, top[top != 0].mean(), 0.0) - x) ** 2).sum())
    assert best.cost < top_cost - 20


def _best_quantization_cost(v, K, B):
    """The least squared error of K levels in [-B, B] for the entries of ``v``, over every labelling."""
    best = np.inf
    for labels in itertools.product(range(K), repeat=v.size):
        lab = np.array(labels)
        cost = 0.0
        for k in range(K):
            if np.any(lab == k):
                c = float(np.clip(v[lab == k].mean(), -B, B))
                cost += float(((v[lab == k] - c) ** 2).sum())
        best = min(best, cost)
    return best


@given(v=small_vectors(max_T=6), K=st.integers(1, 3), B=st.floats(0.5, 5.0))
def test_quantize_exact_matches_brute_force_over_labellings(v, K, B):
    q = quantize_exact(v, K=K, B=B)
    assert q.cost == pytest.approx(_best_quantization_cost(v, K, B), abs=1e-9)
    assert np.unique(q.theta).size <= K


@given(T=st.integers(1, 7), s=st.integers(0, 8), K=st.integers(1, 3))
def test_index_space_size_matches_enumeration_and_sympy(T, s, K):
    n = index_space_size(T, s, K)
    assert n == index_space_size_brute(T, s, K) == index_space_size_sympy(T, s, K)
    if s >= T:
        assert n == (K + 1) ** T


def test_index_space_size_is_exact_for_large_arguments():
    big = index_space_size(10_000, 50, 16)
    assert isinstance(big, int) and big > 2**64
    assert big == index_space_size_sympy(10_000, 50, 16)


@settings(max_examples=60)
@given(T=st.integers(0, 400), s=st.integers(0, 420), K=st.integers(1, 64))
def test_index_space_size_is_the_literal_sum_and_its_log_the_log(T, s, K):
    """The term recurrence against the paper's sum as written; the log-gamma log-sum-exp against log of the int."""
    exact = index_space_size(T, s, K)
    assert exact == sum(math.comb(T, j) * K**j for j in range(min(s, T) + 1))
    assert log_index_space_size(T, s, K) == pytest.approx(math.log(exact), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize(
    ("T", "s", "K"), [(2**53, 2, 1), (10**15, 3, 2), (10**12, 5, 3), (1_200_000_000, 10, 64), (10**9, 1000, 2)]
)
def test_log_index_space_size_keeps_its_precision_at_large_t(T, s, K):
    """Against the log of the exact integer, at T of a large model and beyond: the log-gamma form cancelled two
    terms of size T log T (8.8 nats off at T = 2^53, 4.3e-4 at 10^12, s = 5; session 63)."""
    assert log_index_space_size(T, s, K) == pytest.approx(math.log(index_space_size(T, s, K)), rel=1e-9)


def test_log_index_space_size_of_a_network_takes_milliseconds():
    """ResNet-20's T at 50% non-zero and K = 4: the exact integer has ~170,000 digits; its log is cheap."""
    T, s = 270_000, 135_000
    start = time.perf_counter()
    logs = [log_index_space_size(T, s + d, 4) for d in (-1, 0, 1)]
    assert time.perf_counter() - start < 5  # generous: ~15 ms here; the exact sum took minutes
    assert logs[0] < logs[1] < logs[2] < T * math.log(5)  # grows with s, below (K + 1)^T
    # the largest term alone bounds it from below, the (s + 1)-fold of it from above
    top = math.lgamma(T + 1) - math.lgamma(s + 1) - math.lgamma(T - s + 1) + s * math.log(4)
    assert top <= logs[1] <= top + math.log(s + 1)
    exact = index_space_size(20_000, 10_000, 4)  # still exact at this size
    assert log_index_space_size(20_000, 10_000, 4) == pytest.approx(math.log(exact), rel=1e-13)


def test_heuristic_is_fast_for_large_t():
    x = np.random.default_rng(0).normal(size=50_000)
    start = time.perf_counter()
    proj = project_heuristic(x, s=10_000, K=4, B=3.0)
    assert time.perf_counter() - start < 20
    assert in_h(proj.theta, s=10_000, K=4, B=3.0)
    assert proj.cost < float((x**2).sum())


@pytest.mark.parametrize("bad", [{"s": -1, "K": 1, "B": 1.0}, {"s": 1, "K": 0, "B": 1.0}, {"s": 1, "K": 1, "B": 0.0}])
def test_invalid_arguments_raise(bad):
    with pytest.raises(ValueError):
        in_h(np.zeros(3), **bad)


def test_heuristic_is_only_a_heuristic():
    """A fixed instance where alternating minimisation stalls far from the exact optimum."""
    x = np.array([1.35, -2.9, 0.01, -1.53, -2.09, 6.21, -2.31, -0.86])
    exact, heur = project_exact(x, s=6, K=1, B=10.0), project_heuristic(x, s=6, K=1, B=10.0)
    assert heur.cost > exact.cost + 10
