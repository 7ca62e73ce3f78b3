"""Settled all-lumped bins (sqs_core._settled): the component they settle on is the k* every weight of the bin gets."""

import torch
from hypothesis import given
from hypothesis import strategies as st
from sqs_core._nearby import nearby_tables
from sqs_core._settled import settled_columns

COLUMNS = 4  # onehot.LUMPED_SCAN


def _tables(means, log_stds, log_mix, dtype):
    return tuple(t.reshape(-1).to(dtype) for t in nearby_tables(means, log_stds, log_mix))


def _scan_argmax(theta, flat, tables):
    """The k* (flat index) of each θ (m,) over the ``flat`` (C,) columns, as both evaluations of all-lumped weights
    take it: q = const − ½ z² in θ's dtype, the first largest (sqs_core._fused_nearby._first_argmax), and
    addcmul + max (sqs_core._nearby.lumped_moments)."""
    mu, inv_std, const = (t[flat][:, None] for t in tables)
    z = (theta[None, :] - mu) * inv_std
    first = (const - 0.5 * z * z).argmax(0)  # the first of equal maxima, as torch.argmax documents
    second = torch.addcmul(const, z, z, value=-0.5).max(0).indices
    return flat[first], flat[second]


@given(
    seed=st.integers(0, 10**6),
    k=st.integers(2, 9),
    bins=st.integers(1, 12),
    spread=st.sampled_from([1e-3, 0.05, 1.0]),
    width=st.sampled_from([1e-6, 1e-3, 0.3]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    repeats=st.booleans(),
)
def test_a_settled_bin_gives_every_weight_in_it_that_k_star(seed, k, bins, spread, width, dtype, repeats):
    """For random components (few distinct means and σ's, so that q's tie or cross inside a bin) and bins
    [lo, hi], wherever settled_columns settles a bin, every θ of the dtype in it (both ends, points near the
    crossings, random ones) has its q largest on that component in the dtype's own arithmetic."""
    g = torch.Generator().manual_seed(seed)
    choices = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0], dtype=torch.float64) * spread
    means = choices[torch.randint(0, 5, (1, k), generator=g)]
    log_stds = torch.tensor([-6.0, -5.0, -4.0], dtype=torch.float64)[torch.randint(0, 3, (1, k), generator=g)]
    log_mix = torch.log_softmax(torch.randn(1, k, generator=g, dtype=torch.float64), -1)
    tables = _tables(means, log_stds, log_mix, dtype)
    flat = torch.randint(0, k, (bins, COLUMNS), generator=g)
    if repeats:
        flat[:, 1] = flat[:, 0]  # K < LUMPED_SCAN repeats a component in the scan
    low = (torch.rand(bins, generator=g, dtype=torch.float64) * 2 - 1) * 3 * spread
    high = low + width * torch.rand(bins, generator=g, dtype=torch.float64)
    low, high = low.to(dtype).double(), high.to(dtype).double()  # bin edges are stored in the dtype
    settled = settled_columns(flat, tables, low, high, dtype)
    for b in (settled >= 0).nonzero().squeeze(1).tolist():
        inside = torch.linspace(0, 1, 257, dtype=torch.float64) * (high[b] - low[b]) + low[b]
        theta = torch.cat([inside, torch.rand(64, generator=g, dtype=torch.float64) * (high[b] - low[b]) + low[b]])
        theta = theta.to(dtype)
        theta = theta[(theta.double() >= low[b]) & (theta.double() <= high[b])]
        for got in _scan_argmax(theta, flat[b], tables):
            assert bool((got == settled[b]).all()), (b, settled[b], got.unique())


def _settle_one(means, log_stds, flat, low, high, dtype=torch.float32):
    """settled_columns of one bin [low, high] with the scan ``flat``, and the k*'s the dtype gives across it."""
    k = len(means)
    means, log_stds = torch.tensor([means], dtype=torch.float64), torch.tensor([log_stds], dtype=torch.float64)
    log_mix = torch.full((1, k), -torch.log(torch.tensor(float(k))).item(), dtype=torch.float64)
    tables, flat = _tables(means, log_stds, log_mix, dtype), torch.tensor(flat)
    settled = settled_columns(flat[None], tables, torch.tensor([low]), torch.tensor([high]), dtype)
    theta = (torch.linspace(0, 1, 1001, dtype=torch.float64) * (high - low) + low).to(dtype)
    return int(settled[0]), set(_scan_argmax(theta, flat, tables)[0].tolist())


def test_far_narrow_bins_settle_and_others_do_not():
    """A narrow bin near one component settles on it; a bin that ends where two equal components' q's tie (the
    first column, the other component, wins the tie), and a bin in which a narrow component peaks off its middle
    (its q beats the middle's winner only inside: the vertex of q_c − q_d), do not, and their weights indeed
    get two k*'s."""
    assert _settle_one([0.0, 1.0, 3.0, 7.0], [-4.0] * 4, [0, 1, 2, 3], 0.2, 0.21) == (0, {0})
    assert _settle_one([0.0, 1.0, 3.0, 7.0], [-4.0] * 4, [1, 0, 2, 3], 0.3, 0.5) == (-1, {0, 1})
    assert _settle_one([0.0, 0.45], [0.0, -4.6], [0, 1, 0, 1], 0.4, 0.6) == (-1, {0, 1})


def test_a_lead_below_the_dtypes_rounding_does_not_settle():
    """Two components with the same μ and σ whose constants differ by one float32 ulp: in exact arithmetic the second
    wins everywhere, but q ≈ −3.5 in the bin rounds both to the same float32, and the scan's first-of-equal argmax
    then picks the first column. A bin is settled only where the lead exceeds the rounding margin (SETTLE_ULPS):
    here it must not be (session 66: the margin set to 0 survived every other test)."""
    tables = (
        torch.zeros(2, dtype=torch.float32),
        torch.ones(2, dtype=torch.float32),
        torch.tensor([1.0 - 2.0**-24, 1.0], dtype=torch.float32),
    )
    flat = torch.tensor([0, 1, 0, 1])
    low, high = torch.tensor([3.0], dtype=torch.float64), torch.tensor([3.01], dtype=torch.float64)
    theta = (torch.linspace(0, 1, 1001, dtype=torch.float64) * 0.01 + 3.0).to(torch.float32)
    assert set(_scan_argmax(theta, flat, tables)[0].tolist()) == {0}  # the float32 scan: the first column
    assert int(settled_columns(flat[None], tables, low, high, torch.float32)[0]) == -1
