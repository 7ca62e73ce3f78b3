"""The blocks of uncovered weights (sqs_core.onehot) of a posterior, as a training forward makes them, and a
float64 reference of log(π_k N_k(θ)): helpers of test_fused, test_onehot and test_posterior; and a posterior whose
weights fill blocks of every width (test_fused, test_autocast)."""

from collections import Counter

import sqs_core as sqs
import torch
import torch.nn.functional as F
from sqs_core import chunked
from sqs_core.onehot import bin_components, bin_table, classify, columns_of, uncovered_blocks
from sqs_core.posterior import SpikeGMMPosterior


def _blocks(p, settled_inline=False):
    """(flat θ, BinTable, [(indices, width)]) at the posterior ``p``'s current parameters (``settled_inline``: without
    the weights of settled all-lumped bins, as both training steps find them)."""
    theta, wid = p.weight.detach().reshape(-1), p.window_ids.reshape(-1)
    log_mix = F.log_softmax(p.mixing_logits.detach(), -1)
    args = (p.means.detach(), p.log_stds.detach(), log_mix, p.config.responsibility, p.config.temperature)
    table = bin_table(theta, wid, *args)
    classes = classify(theta, wid, table)[2]
    blocks = uncovered_blocks(classes, table, p.num_components, chunked.CHUNK_ELEMENTS, settled_inline=settled_inline)
    return theta, table, list(blocks)


def uncovered_counts(p) -> Counter:
    """Weights per block width (0: all K, onehot.ALL_LUMPED: every component lumped) among the blocks of weights
    the certificate does not cover."""
    counts: Counter = Counter()
    for u, width in _blocks(p)[2]:
        counts[width] += int(u.numel())
    return counts


def uncovered_mask(p, settled_inline=False) -> torch.Tensor:
    """(T,) bool: the weights the certificate does not cover, pruned or not (``settled_inline``: nor a settled bin)."""
    theta, _, blocks = _blocks(p, settled_inline)
    out = torch.zeros(theta.numel(), dtype=torch.bool)
    for u, _ in blocks:
        out[u] = True
    return out


def settled_count(p) -> int:
    """How many weights lie in settled all-lumped bins (onehot.LUMPED_SETTLED), which both training steps evaluate
    with the certified weights (no block of their own)."""
    return int((uncovered_mask(p) & ~uncovered_mask(p, settled_inline=True)).sum())


def evaluated_components(p) -> torch.Tensor:
    """(T, K) bool: the components of its window each weight is evaluated on, all K but for the weights of the
    nearby path (sqs_core._nearby), which take their bin's ``width`` largest-bound ones (all-lumped weights:
    the onehot.LUMPED_SCAN their k* is chosen from)."""
    theta, table, blocks = _blocks(p)
    k = p.num_components
    evaluated = torch.ones(theta.numel(), k, dtype=torch.bool)
    for u, width in blocks:
        if width:
            columns = bin_components(table, theta[u], columns_of(width)) % k  # flat w·K + k → k
            evaluated[u] = False
            evaluated[u[None, :].expand_as(columns), columns] = True
    return evaluated


def log_densities64(p) -> torch.Tensor:
    """log(π_k N_k(θ)) (T, K) of every weight of the posterior ``p`` with its window's components, in float64."""
    th, wid = p.weight.detach().reshape(-1).double(), p.window_ids.reshape(-1).long()
    sd = p.log_stds.detach().double()
    q = F.log_softmax(p.mixing_logits.detach().double(), -1)[wid] - sd[wid]
    return q - 0.5 * ((th[:, None] - p.means.detach().double()[wid]) * torch.exp(-sd[wid])) ** 2


def spread_posterior(k: int, log_std_shift: float, compiled: bool, dtype: torch.dtype = torch.float64):
    """A posterior in ``dtype`` of one 60×50 layer (K = ``k``, outlier windows, the paper's formula at τ = 5e-4):
    log σ shifted by ``log_std_shift`` (components about as wide as the gaps between them from ~0.8: most weights
    uncovered, in bins of many widths), random mixing weights, every 7th gate masked."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(60, 50, generator=g, dtype=dtype) * 0.1
    config = sqs.SQSConfig(num_components=k, windows="outlier", temperature=5e-4, compile_kernels=compiled)
    p = SpikeGMMPosterior(w, config, generator=torch.Generator().manual_seed(0)).to(dtype)
    with torch.no_grad():
        p.log_stds.add_(log_std_shift)
        p.mixing_logits.add_(torch.randn(p.mixing_logits.shape, generator=g, dtype=dtype))
        p.mask.view(-1)[::7] = False
    return p
