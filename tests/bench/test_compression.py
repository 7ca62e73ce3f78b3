"""Global magnitude masks, 1-D k-means, uniform round-to-nearest and the paper's compression rate."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from sqs_bench.compression import (
    LayerStats,
    global_magnitude_masks,
    kmeans_1d,
    layer_stats,
    paper_compression_rate,
    uniform_quantize,
)
from strategies import nonzero_rates, weight_vectors


@given(weight_vectors(min_size=2), nonzero_rates)
def test_global_mask_keeps_exactly_the_target_count_of_largest_weights(values, nonzero):
    flat = torch.tensor(values)
    half = len(values) // 2
    weights = {"a": flat[:half], "b": flat[half:].reshape(-1, 1)}
    masks = global_magnitude_masks(weights, nonzero)
    kept = torch.cat([weights[n][masks[n]].abs().flatten() for n in weights])
    dropped = torch.cat([weights[n][~masks[n]].abs().flatten() for n in weights])
    assert kept.numel() == round(nonzero * flat.numel())
    assert masks["b"].shape == weights["b"].shape
    if kept.numel() and dropped.numel():
        assert kept.min() >= dropped.max()


@given(weight_vectors(min_size=4), st.integers(1, 6))
def test_kmeans_uses_every_center_and_assigns_to_the_nearest(values, k):
    x = torch.tensor(values)
    assume(torch.unique(x).numel() >= k)
    centers, assign = kmeans_1d(x, k)
    assert centers.shape == (k,) and torch.bincount(assign, minlength=k).min() > 0
    distance = (x[:, None] - centers[None, :].double()).abs()
    chosen = distance.gather(1, assign[:, None]).squeeze(1)
    assert torch.all(chosen <= distance.min(1).values + 1e-5 * (1 + x.abs()))


def test_kmeans_pins_zero_and_finds_separated_clusters():
    x = torch.cat([torch.full((50,), -1.0), torch.zeros(50) + 0.01, torch.full((50,), 2.0)])
    centers, _ = kmeans_1d(x, 3)
    assert sorted(centers.tolist()) == pytest.approx([-1.0, 0.01, 2.0])
    pinned, _ = kmeans_1d(x, 3, pin_zero=True)
    assert pinned[0] == 0.0 and sorted(pinned[1:].tolist()) == pytest.approx([-1.0, 2.0])
    with pytest.raises(ValueError, match="k-means"):
        kmeans_1d(torch.zeros(2), 3)


@given(weight_vectors(min_size=2), st.integers(1, 4), nonzero_rates)
def test_uniform_grid_levels_and_error(values, bits, nonzero):
    w = torch.tensor(values)
    mask = global_magnitude_masks({"w": w}, nonzero)["w"]
    q = uniform_quantize(w, mask, bits)
    assert torch.all(q[~mask] == 0)
    if mask.any():
        m = w[mask].abs().max()
        step = 2 * m / (2**bits - 1)
        grid = torch.linspace(-m, m, 2**bits)
        assert torch.unique(q[mask]).numel() <= 2**bits
        assert torch.all((q[mask][:, None] - grid[None, :]).abs().min(1).values <= 1e-5 * (1 + m))
        assert torch.all((q[mask] - w[mask]).abs() <= step / 2 + 1e-5 * (1 + m))


def test_paper_rate_matches_the_formula_by_hand():
    # one layer: T = 1000, 500 non-zeros, K = 4  ->  32·1000 / (2·500 + 32·4)
    stats = layer_stats({"w": torch.tensor([0.0, 1.0] * 500)}, 4)
    assert stats == [LayerStats("w", 1000, 500, 4, 1)]
    assert paper_compression_rate(stats) == pytest.approx(32000 / 1128)
    two = [LayerStats("a", 100, 100, 2, 2), LayerStats("b", 300, 30, 16, 16)]
    expected = 32 * 400 / (math.log2(2) * 100 + math.log2(16) * 30 + 32 * 18)
    assert paper_compression_rate(two) == pytest.approx(expected)
