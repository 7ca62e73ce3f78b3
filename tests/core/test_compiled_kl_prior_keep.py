"""The compiled gate KL (sqs_core._fused._kl_sum) against the eager one under a spike-and-slab prior whose keep
probability is not ½. test_fused's matrix uses the default SpikeSlabPrior(keep_prob=0.5), where log λ = log(1 − λ),
so a pruned gate's term −log(1 − λ) and a mistaken −log λ agree. Float64, every fifth weight pruned; the KL as the
forward sums it and as the stand-alone kernel sums it again, and its gradient w.r.t. the gate logits."""

import pytest
import sqs_core as sqs
import torch
from reference_moments import posterior

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _posterior(compiled, keep_prob):
    prior = sqs.SpikeSlabPrior(keep_prob=keep_prob)
    return posterior(windows="none", temperature=5e-3, prior=prior, compile_kernels=compiled)


@pytest.mark.parametrize("keep_prob", [0.2, 0.9])
def test_compiled_gate_kl_matches_eager_for_any_keep_prob(keep_prob):
    results = []
    for compiled in (False, True):
        p = _posterior(compiled, keep_prob)
        p.moments(second=False)
        first, second = p.kl(), p.kl()  # the forward's KL, then the KL summed on its own
        (grad,) = torch.autograd.grad(second, [p.gate_logits])
        results.append((first.detach(), second.detach(), grad))
    (e1, e2, eg), (c1, c2, cg) = results
    torch.testing.assert_close(c1, e1, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(c2, e2, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(cg, eg, rtol=1e-9, atol=1e-12)
