"""GMMQuantizer.logits = log π_k + log N(w | μ_k, σ_k²) against torch.distributions (independent density).

Gap: dropping −log σ_k from the component log-density (unequal σ_k) passed the suite."""

import torch
from sqs_bench.dgms import GMMQuantizer


def test_logits_are_log_weight_plus_normal_log_density():
    torch.manual_seed(0)
    w = torch.cat([torch.randn(200) * 0.01, torch.randn(100) * 0.2 + 0.5, torch.randn(100) * 0.05 - 0.4])
    q = GMMQuantizer(w, 3, temperature=0.1)
    with torch.no_grad():
        q.log_stds.copy_(torch.tensor([-4.0, -1.5, -3.0]))  # clearly unequal σ_k
        q.mixing_logits.copy_(torch.tensor([0.3, -0.2, 1.0]))
        got = q.logits(w)
    normal = torch.distributions.Normal(q.means().detach(), q.log_stds.detach().exp())
    ref = torch.log_softmax(q.mixing_logits.detach(), 0) + normal.log_prob(w[:, None])
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)


def test_initial_mixing_weights_are_the_cluster_shares():
    from sqs_bench.compression import kmeans_1d

    torch.manual_seed(1)
    w = torch.cat([torch.randn(300) * 0.01, torch.randn(60) * 0.05 + 0.5, torch.randn(40) * 0.05 - 0.4])
    q = GMMQuantizer(w, 3, temperature=0.1)
    _, assign = kmeans_1d(w, 3, pin_zero=True)
    shares = torch.bincount(assign, minlength=3).float() / w.numel()
    torch.testing.assert_close(torch.softmax(q.mixing_logits.detach(), 0), shares, rtol=1e-5, atol=1e-6)
