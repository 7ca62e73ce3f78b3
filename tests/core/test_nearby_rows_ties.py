"""k* of the unrolled nearby rows (sqs_core._fused_nearby, the compiled path's) where two nearby components are
identical (q ties exactly): the first of the ties, as torch.argmax and the eager nearby_moments take it."""

import torch
import torch.nn.functional as F
from sqs_core import _nearby
from sqs_core._fused_nearby import lumped_rows, nearby_rows


def test_tied_components_give_the_first_of_the_ties_on_both_paths():
    g = torch.Generator().manual_seed(0)
    w, k, n, width = 2, 12, 64, 4
    means = torch.randn(w, k, generator=g, dtype=torch.float64) * 0.1
    log_stds = torch.log(torch.rand(w, k, generator=g, dtype=torch.float64) * 0.02 + 1e-2)
    logits = torch.randn(w, k, generator=g, dtype=torch.float64)
    for t in (means, log_stds, logits):
        t[:, 5] = t[:, 3]  # component 5 duplicates component 3 in every window: identical q
    log_mix = F.log_softmax(logits, -1)
    wid = torch.randint(0, w, (n,), generator=g)
    levels = torch.tensor([7, 5, 3, 0])[:, None].expand(width, n)  # the later duplicate listed first
    flat = wid * k + levels
    th = means[wid, 3] + torch.randn(n, generator=g, dtype=torch.float64) * 1e-3  # nearest to the tied pair
    tables = _nearby.NearbyTables.build(means, log_stds, log_mix, True)
    rows = [tuple(c[f] for f in flat.unbind(0)) for c in tables.columns]
    q = torch.stack([c - 0.5 * ((th - m) * i) ** 2 for m, i, c in zip(*rows, strict=True)])
    assert torch.equal(q[1], q[2])  # an exact tie, the maximum
    want = q.argmax(0)
    assert torch.equal(want, torch.ones_like(want))  # the first of the tied pair: position 1 (component 5)
    _, _, best = nearby_rows(th, *rows, tables.total_mu[wid], tables.total_sq[wid], float(k - width), 5e-4)
    assert torch.equal(best.long(), want)
    _, _, best_lumped = lumped_rows(th, *rows, tables.total_mu[wid], tables.total_sq[wid], k)
    assert torch.equal(best_lumped.long(), want)
    _, _, kstar = _nearby.nearby_moments(th, wid, flat, tables, 5e-4)
    assert torch.equal(kstar.long(), levels[1])
