"""A small float64 eager posterior and its φ, m = Σ φ μ and s = Σ φ (μ² + σ²) written out from the paper's formulas,
for tests that check sqs-core's moments against an independent reference (test_posterior.py,
test_posterior_reference.py)."""

import math

import sqs_core as sqs
import torch
import torch.nn.functional as F
from sqs_core.mixture import log_responsibilities
from sqs_core.posterior import SpikeGMMPosterior


def posterior(shape=(24, 17), k=4, windows="outlier", seed=0, **kw):
    """A float64 posterior of a (24, 17) weight with three outliers (so the tail windows exist), its gates and
    parameters spread away from their init and every fifth weight pruned."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(*shape, generator=g) * 0.1
    w.view(-1)[:3] = torch.tensor([2.0, -1.5, 1.2])
    config = sqs.SQSConfig(num_components=k, windows=windows, **kw)
    p = SpikeGMMPosterior(w, config, generator=torch.Generator().manual_seed(seed)).double()
    with torch.no_grad():
        p.gate_logits.add_(torch.randn(p.gate_logits.shape, generator=g, dtype=torch.float64) * 0.02)
        p.log_stds.add_(0.5)
        p.mask.view(-1)[::5] = False
    return p


def phi_m_s(p):
    """φ (T, K), m = Σ φ μ and s = Σ φ (μ² + σ²) written out in float64 with autograd."""
    th = p.weight.reshape(-1)
    wid = p.window_ids.reshape(-1).long()
    log_mix = F.log_softmax(p.mixing_logits, -1)
    q = log_mix[wid] - p.log_stds[wid] - 0.5 * math.log(2 * math.pi)
    q = q - 0.5 * ((th[:, None] - p.means[wid]) * torch.exp(-p.log_stds[wid])) ** 2
    phi = log_responsibilities(q, p.config.responsibility, p.config.temperature).exp()
    m = (phi * p.means[wid]).sum(-1)
    s = (phi * (p.means[wid] ** 2 + torch.exp(2 * p.log_stds[wid]))).sum(-1)
    return phi, m, s
