"""The compiled path's unrolled nearby evaluation (sqs_core._fused_nearby), run eagerly here, against the eager
path's hand-derived one (sqs_core._nearby, itself checked against autograd on the full formula in
test_onehot): the same values and gradients in float64, and in float32 (φ, the moments and the gradient
products in float64 there) about as near a float64 evaluation as the eager path."""

import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from sqs_core import _nearby
from sqs_core._fused_nearby import nearby_rows, nearby_rows_vjp
from sqs_core._fused_uncovered import UNROLLED_MAX
from sqs_core.onehot import NEARBY_WIDTHS

UNROLLED_WIDTHS = [w for w in NEARBY_WIDTHS if w <= UNROLLED_MAX]  # wider blocks run sqs_core._nearby's, compiled


def _case(seed, width, second, temperature, far, dtype):
    """(eager arguments of _nearby, rows of _fused_nearby, cotangents) for 257 weights in 3 windows of K = 24.
    ``far``: weights up to 40σ from their components, where π N and φ of most columns fall below 1e-30."""
    g = torch.Generator().manual_seed(seed)
    w, k, n = 3, 24, 257
    means = torch.randn(w, k, generator=g, dtype=torch.float64) * 0.1
    log_stds = torch.log(torch.rand(w, k, generator=g, dtype=torch.float64) * 0.02 + 1e-3)
    log_mix = F.log_softmax(torch.randn(w, k, generator=g, dtype=torch.float64), -1)
    wid = torch.randint(0, w, (n,), generator=g)
    levels = torch.stack([torch.randperm(k, generator=g)[:width] for _ in range(n)], 1)  # (width, n), distinct
    flat = wid * k + levels
    sigma = torch.exp(log_stds.reshape(-1)[flat[0]])
    th = means.reshape(-1)[flat[0]] + torch.randn(n, generator=g, dtype=torch.float64) * sigma * (40.0 if far else 2.0)
    cotangents = [torch.randn(n, generator=g, dtype=torch.float64) * 1e-3 for _ in range(2)]
    lam = torch.rand(n, generator=g, dtype=torch.float64)
    params = [t.to(dtype) for t in (means, log_stds, log_mix)]
    tables = _nearby.NearbyTables.build(*params, second)
    rows = [tuple(c[f] for f in flat.unbind(0)) for c in tables.columns]
    totals = (tables.total_mu[wid], tables.total_sq[wid] if second else None)
    grads = (cotangents[0].to(dtype), cotangents[1].to(dtype) if second else None, lam.to(dtype))
    eager = (th.to(dtype), wid, flat, tables, temperature, *grads)
    return eager, (th.to(dtype), *rows, totals, float(k - width), temperature), grads


def _fused(rows, grads):
    m, s, g_th, g_mu, g_inv, g_const, total_grads = nearby_rows_vjp(*rows, grads)
    return [m, s, g_th, *(torch.stack(c) for c in (g_mu, g_inv, g_const)), *total_grads]


def _eager(eager_args):
    m, s, g_th, columns, totals = _nearby.nearby_vjp(*eager_args)
    return [m, s, g_th, *columns, *totals]


_cases = dict(
    seed=st.integers(0, 10**6),
    width=st.sampled_from(UNROLLED_WIDTHS),
    second=st.booleans(),
    temperature=st.sampled_from([5e-4, 1e-2, 1.0]),
    far=st.booleans(),
)


@given(**_cases)
def test_values_and_gradients_match_the_eager_nearby_path_in_float64(seed, width, second, temperature, far):
    eager_args, rows, grads = _case(seed, width, second, temperature, far, torch.float64)
    want, got = _eager(eager_args), _fused(rows, grads)
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        if b is None:
            assert a is None, index
            continue
        scale = max(float(b.abs().max()), 1e-300)
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11 * scale, msg=f"output {index}")
    m, s, best = nearby_rows(rows[0], *rows[1:4], rows[4][0], rows[4][1], rows[5], rows[6])
    want_m, want_s, want_best = _nearby.nearby_moments(*eager_args[:5])
    torch.testing.assert_close(m, want_m, rtol=1e-12, atol=0.0)
    assert (s is None) == (want_s is None)
    if s is not None:
        torch.testing.assert_close(s, want_s, rtol=1e-12, atol=0.0)
    assert torch.equal(eager_args[2].gather(0, best.long()[None]).squeeze(0) % 24, want_best.long())


@given(**_cases)
def test_float32_is_about_as_near_float64_as_the_eager_path(seed, width, second, temperature, far):
    reference = _eager(_case(seed, width, second, temperature, far, torch.float64)[0])
    eager_args, rows, grads = _case(seed, width, second, temperature, far, torch.float32)
    eager, fused = _eager(eager_args), _fused(rows, grads)
    assert fused[0].dtype == torch.float64 and fused[3].dtype == torch.float64  # m and the column gradients
    for index, (ref, e, f) in enumerate(zip(reference, eager, fused, strict=True)):
        if ref is None:
            continue
        scale = max(float(ref.abs().max()), 1e-300)
        error_fused = float((f.double() - ref).abs().max()) / scale
        error_eager = float((e.double() - ref).abs().max()) / scale
        # both round the same float32 exps; which one lands nearer differs from case to case (up to ~3×)
        assert error_fused <= 4.0 * error_eager + 1e-5, (index, error_fused, error_eager)
