import logging

import pytest
import sqs_core as sqs
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from sqs_core.kmeans import EMPTY_MIX, STD_FLOOR_FRACTION, STD_MIN, kmeans_1d, kmeans_1d_sorted, sorted_values
from sqs_core.posterior import SpikeGMMPosterior
from sqs_core.windows import OUTLIER_IQR_FACTOR, assign_windows
from strategies import components, weight_vectors
from torch import nn


def _quantile(flat, q):
    k = max(1, round(q * (flat.numel() - 1)) + 1)
    return flat.kthvalue(k).values


@given(values=weight_vectors(min_size=4))
def test_outlier_windows_follow_the_iqr_rule(values):
    theta = torch.tensor(values)
    ids, edges = assign_windows(theta, "outlier")
    q1, med, q3 = _quantile(theta, 0.25), _quantile(theta, 0.5), _quantile(theta, 0.75)
    low, high = q1 - OUTLIER_IQR_FACTOR * (q3 - q1), q3 + OUTLIER_IQR_FACTOR * (q3 - q1)
    # rank of each weight's window among the four intervals, before compaction
    expected = torch.where(theta <= low, 0, torch.where(theta < med, 1, torch.where(theta < high, 2, 3)))
    # compaction keeps the order: equal expected interval <=> equal id, and ids increase with it
    for a in range(4):
        for b in range(4):
            same = (expected == a)[:, None] & (expected == b)[None, :]
            if same.any():
                pair = ids[:, None].long() - ids[None, :].long()
                assert ((pair[same] == 0) == (a == b)).all()
                assert ((pair[same] < 0) == (a < b)).all()
    assert int(ids.max()) + 1 == len(torch.unique(expected))
    assert edges.numel() == int(ids.max())


@given(values=weight_vectors(min_size=2))
def test_equal_windows_have_equal_width(values):
    theta = torch.tensor(values)
    ids, _ = assign_windows(theta, "equal")
    lo, hi = theta.min(), theta.max()
    width = (hi - lo) / 4
    raw = torch.clamp(torch.floor((theta - lo) / width), max=3) if width > 0 else torch.zeros_like(theta)
    order = torch.argsort(theta)
    assert torch.all(torch.diff(ids[order].long()) >= 0)
    assert int(ids.max()) + 1 == len(torch.unique(raw))


@given(values=weight_vectors(min_size=1), kind=st.sampled_from(["none", "equal", "outlier"]))
def test_windows_from_sorted_values_are_the_same(values, kind):
    """prepare_ sorts θ once and reads the outlier quantiles off it: the same windows and edges as kthvalue."""
    theta = torch.tensor(values, dtype=torch.float64)  # a float64 layer: windows are found in float32
    ids, edges = assign_windows(theta, kind)
    ids_sorted, edges_sorted = assign_windows(theta, kind, ordered=sorted_values(theta))
    assert torch.equal(ids, ids_sorted) and torch.equal(edges, edges_sorted)


special_floats = st.one_of(
    st.floats(allow_nan=False, width=32),
    st.sampled_from([0.0, -0.0, 1e-45, -1e-45, float("inf"), -float("inf")]),
)


@given(values=st.lists(special_floats, min_size=0, max_size=200), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_sorted_values_sorts_as_torch_sort(values, dtype):
    """The integer-key sort: signed zeros, subnormals, infinities, ties; float32 and float64."""
    x = torch.tensor(values, dtype=dtype)
    expected = torch.sort(x).values
    got = sorted_values(x)
    assert got.dtype == dtype and torch.equal(got, expected)  # -0.0 == 0.0 for torch.equal
    assert torch.equal(torch.signbit(got[got == 0]).sort(descending=True).values, torch.signbit(got[got == 0]))


@given(values=weight_vectors(min_size=1), k=components, seed=st.integers(0, 100))
def test_kmeans_on_sorted_values_is_kmeans(values, k, seed):
    flat = torch.tensor(values, dtype=torch.float64)
    a = kmeans_1d(flat, k, generator=torch.Generator().manual_seed(seed))
    b = kmeans_1d_sorted(torch.sort(flat).values, k, generator=torch.Generator().manual_seed(seed))
    assert all(torch.equal(x, y) for x, y in ((a.means, b.means), (a.stds, b.stds), (a.mixing, b.mixing)))


def test_constant_tensor_is_one_window():
    ids, edges = assign_windows(torch.full((10,), 0.3), "outlier")
    assert ids.max() == 0 and edges.numel() == 0


@given(values=weight_vectors(min_size=1), k=components, seed=st.integers(0, 100))
@example(values=[0.0, 2.2250738585072014e-308], k=2, seed=0)  # σ was 0 in float32
@example(values=[0.0, 1.0, 2.2250738585072014e-308], k=3, seed=0)  # two centres equal in float32
@example(values=[-35.0] + [0.0] * 48 + [1.0, 0.25], k=3, seed=0)  # a group's std below the floor (0.036)
@example(values=[0.0, 0.0, 1.0, 0.5, 1.175494351e-38, 3.8851140159209315e-230, -1.0], k=5, seed=0)  # μ was NaN
@example(values=[0.0, 1.0, 1.175494351e-38, 3.8851140159209315e-230, -1.0], k=4, seed=0)  # two centres at 0
def test_kmeans_statistics_follow_the_appendix(values, k, seed):
    flat = torch.tensor(values, dtype=torch.float64)
    init = kmeans_1d(flat, k, generator=torch.Generator().manual_seed(seed))
    assert init.means.shape == init.stds.shape == init.mixing.shape == (k,)
    assert torch.isfinite(init.means).all() and (init.stds >= STD_MIN).all()
    assert abs(float(init.mixing.sum()) - 1) < 1e-5
    spread = float(flat.max() - flat.min())
    floor = max(STD_FLOOR_FRACTION * (spread if spread > 0 else max(float(flat.abs().max()), 1.0)), STD_MIN)
    real = init.mixing > 10 * EMPTY_MIX
    centres = torch.unique(init.means[real].double())
    # groups = nearest centre; μ = group mean, σ = unbiased group std (floored), π = group share. The results
    # are float32: groups whose means round to one float32 centre are one group here, their shares summed
    labels = torch.argmin((flat[:, None] - centres[None, :]).abs(), dim=1)
    for j, c in enumerate(centres):
        group = flat[labels == j]
        same = real & (init.means.double() == c)
        assert abs(float(group.mean()) - float(c)) < 1e-5 * max(1.0, abs(float(c)))
        assert abs(len(group) / len(flat) - float(init.mixing[same].double().sum())) < 1e-5
        if int(same.sum()) == 1 and len(group) > 1 and group.std() > 1e-2:  # the group's std, or the floor
            assert abs(max(float(group.std()), floor) - float(init.stds[same])) < 1e-4


def test_kmeans_is_deterministic_and_handles_few_distinct_values():
    flat = torch.tensor([0.5, 0.5, -0.5, 0.5])
    a = kmeans_1d(flat, 4, generator=torch.Generator().manual_seed(1))
    b = kmeans_1d(flat, 4, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a.means, b.means)
    assert set(a.means.tolist()) == {0.5, -0.5}
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(kmeans_1d(x, 8).means, kmeans_1d(x, 8).means)


def test_kmeans_rejects_bad_input():
    import pytest

    with pytest.raises(ValueError, match="NaN"):
        kmeans_1d(torch.tensor([0.0, float("nan")]), 2)
    with pytest.raises(ValueError, match="k must be"):
        kmeans_1d(torch.tensor([0.0, 1.0]), 1)
    with pytest.raises(ValueError, match="NaN"):
        kmeans_1d_sorted(torch.tensor([0.0, float("inf")], dtype=torch.float64), 2)
    with pytest.raises(ValueError, match="at least one"):
        kmeans_1d_sorted(torch.zeros(0, dtype=torch.float64), 2)


@pytest.mark.parametrize(("dtype", "tiny"), [(torch.float32, 1e-45), (torch.float64, 1e-300)])
def test_a_layer_of_zeros_and_subnormal_weights_trains_finitely(dtype, tiny):
    """A window whose spread is below ~1e-16 (zeros beside the smallest subnormals) had σ = 0 in the float32
    K-means result: log σ = −inf and the first forward's NLL was NaN. σ is now at least STD_MIN."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8, bias=False).to(dtype)
    with torch.no_grad():
        layer.weight.zero_()
        layer.weight.view(-1)[::3] = tiny
    model = sqs.prepare_(torch.nn.Sequential(layer), sqs.SQSConfig(num_components=2, windows="none"))
    p = sqs.posteriors(model)["0"]
    assert torch.isfinite(p.log_stds).all()
    loss = sqs.Objective(model, num_data=10)(model(torch.randn(2, 8, dtype=dtype)).pow(2).mean())
    loss.backward()
    assert all(torch.isfinite(t.grad).all() for t in (p.means, p.log_stds, p.mixing_logits, p.gate_logits))


@pytest.mark.parametrize("scale", [1e40, 1e100])
def test_a_float64_layer_beyond_float32s_range_gets_a_finite_posterior(scale):
    """K-means returns float64, which a float64 posterior keeps: its weights beyond 3.4e38 gave infinite means when
    the start was float32 (session 63), and Objective then blamed training for the NaN."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16)).double()
    with torch.no_grad():
        model[0].weight.mul_(scale)
    theta = model[0].weight.detach().clone()
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, windows="none"))
    posterior = sqs.posteriors(model)["0"]
    assert posterior.means.dtype == torch.float64 and bool(posterior.means.isfinite().all())
    assert bool(model(torch.randn(2, 16, dtype=torch.float64)).isfinite().all())
    sqs.greedy_(model, nonzero=1.0)
    assert float((model[0].fixed_weight - theta).abs().max() / theta.abs().max()) < 0.5


def test_a_float32_start_rounds_kmeans_float64_once():
    """A float32 posterior's μ, log σ and mixing logits are K-means' float64 values rounded to float32 first."""
    w = torch.randn(32, 8, generator=torch.Generator().manual_seed(3))
    config = sqs.SQSConfig(num_components=4, windows="none")
    p = SpikeGMMPosterior(w, config, generator=torch.Generator().manual_seed(0))
    init = kmeans_1d(w, 4, generator=torch.Generator().manual_seed(0))
    assert init.means.dtype == torch.float64
    assert torch.equal(p.means.detach()[0], init.means.float())
    assert torch.equal(p.log_stds.detach()[0], init.stds.float().log())


def test_weights_finer_than_the_sigma_floor_are_warned_of(caplog):
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    with torch.no_grad():
        model[1].weight.mul_(1e-20)
    with caplog.at_level(logging.WARNING, logger="sqs_core.prepare"):
        sqs.prepare_(model, sqs.SQSConfig(num_components=4))
    warned = [r.getMessage() for r in caplog.records if "finer than the posterior" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("layer '1'")


def test_outlier_windows_use_five_iqr_and_a_closed_lower_tail():
    """Outlier windows with the paper's literal 5×IQR (not the module's constant): tails [min, q1 − 5 IQR] and
    [q3 + 5 IQR, max], closed; a value exactly on q1 − 5 IQR belongs to the lower tail."""
    # q1 = 0, median = 0.5, q3 = 1 by order statistic k = round(q (n − 1)) + 1 on n = 13: IQR 1, edges −5 and 6
    values = [-7.0, -5.0, -4.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 1.0, 1.0, 6.0, 8.0]
    ids, edges = assign_windows(torch.tensor(values), "outlier")
    assert edges.tolist() == [-5.0, 0.5, 6.0]
    assert ids.tolist() == [0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3]
