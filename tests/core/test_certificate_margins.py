"""The one-hot certificate (sqs_core.onehot) against φ computed in float64 over all K components, in the two cases
its per-rival tests miss: many rivals sharing the mass, and densities past the paper formula's clamp (session 66's
mutation search)."""

import math

import pytest
import torch
import torch.nn.functional as F
from sqs_core.mixture import component_log_density, log_responsibilities
from sqs_core.onehot import CERTIFY_MARGIN, bin_table, certify_one_hot


@pytest.mark.parametrize(
    ("kind", "temperature", "std", "gap"),
    [
        ("standard", 0.1, 0.1, 1.0),
        ("standard", 1e-2, 0.1, 1.0),
        ("paper", 1e-2, 0.003, 0.01),
        ("paper", 1e-3, 0.003, 0.01),
    ],
)
def test_the_rivals_mass_on_a_certified_weight_is_below_the_margin(kind, temperature, std, gap):
    """The certificate's margin includes log K (onehot, step 4: certified when the gap is >= CERTIFY_MARGIN + log K),
    so that on a certified weight the rivals' responsibilities *together* stay below e^-40: 1 - φ_{k*} <= e^-40. The
    per-rival test (φ_j <= e^-40) is met by a margin without log K too. Here 15 identical rivals share the mass, and
    weights are packed densely around the certificate's edge; φ in float64 over all K components."""
    k = 16
    means = torch.tensor([[0.0] + [gap] * (k - 1)], dtype=torch.float64)
    log_stds = torch.full((1, k), math.log(std), dtype=torch.float64)
    log_mix = F.log_softmax(torch.zeros(1, k, dtype=torch.float64), -1)
    theta = torch.linspace(-gap, 2 * gap, 1 << 16, dtype=torch.float64)
    wid = torch.zeros(theta.shape, dtype=torch.uint8)
    table = bin_table(theta, wid, means, log_stds, log_mix, kind, temperature)
    kstar, _, certified = certify_one_hot(theta, wid, table)
    assert int(certified.sum()) > 1000  # the test reaches the certificate's edge
    n = int(certified.sum())
    q = component_log_density(theta[certified], means.expand(n, k), log_stds.expand(n, k), log_mix.expand(n, k))
    log_phi = log_responsibilities(q, kind, temperature)
    winner = kstar.long()[certified]
    assert torch.equal(winner, log_phi.argmax(-1))
    log_phi[torch.arange(n), winner] = -math.inf
    rivals = torch.logsumexp(log_phi, -1)  # log(1 - phi_{k*}) = log of the rivals' total
    assert float(rivals.max()) <= -CERTIFY_MARGIN + 1e-6, float(rivals.max())


def test_weights_whose_densities_pass_the_clamp_are_not_certified():
    """The paper formula clamps π N at e^80 (mixture.PAPER_CLAMP), so components whose log π N exceeds 80 at a weight
    tie in φ whatever their densities. The certificate must not certify such a weight (onehot._certifying_slack: q_min
    above the clamp certifies nothing). Float64 parameters with σ = e^-100 put both components' log π N near 95; the
    winner by π N is one-hot by the bound on q but φ is (½, ½). φ in float64 by brute force (log_responsibilities)."""
    k, std = 2, math.exp(-100.0)
    means = torch.tensor([[0.0, 3 * std]], dtype=torch.float64)
    log_stds = torch.full((1, k), -100.0, dtype=torch.float64)
    log_mix = torch.tensor([[math.log(0.9), math.log(0.1)]], dtype=torch.float64)
    theta = torch.linspace(-5 * std, 8 * std, 4096, dtype=torch.float64)
    wid = torch.zeros(theta.shape, dtype=torch.uint8)
    n = theta.numel()
    q = component_log_density(theta, means.expand(n, k), log_stds.expand(n, k), log_mix.expand(n, k))
    assert bool((q > 80).all(-1).any())  # both components pass the clamp at some weights
    for temperature in (5e-4, 1e-2):
        table = bin_table(theta, wid, means, log_stds, log_mix, "paper", temperature)
        kstar, _, certified = certify_one_hot(theta, wid, table)
        log_phi = log_responsibilities(q, "paper", temperature)
        rivals = log_phi.clone()
        rivals[torch.arange(n), kstar.long()] = -math.inf
        bad = certified & (rivals.max(-1).values > -CERTIFY_MARGIN)
        assert not bool(bad.any()), (temperature, int(bad.sum()), int(certified.sum()))
