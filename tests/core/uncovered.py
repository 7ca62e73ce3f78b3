"""The blocks of uncovered weights (sqs_core.onehot) of a posterior, counted: a helper of test_fused and test_onehot."""

from collections import Counter

import torch.nn.functional as F
from sqs_core import chunked
from sqs_core.onehot import bin_table, classify, uncovered_blocks


def uncovered_counts(p) -> Counter:
    """Weights per block width (0: all K) among the blocks of weights the certificate does not cover, at the
    posterior ``p``'s current parameters, in the blocks a training forward makes."""
    theta, wid = p.weight.detach().reshape(-1), p.window_ids.reshape(-1)
    log_mix = F.log_softmax(p.mixing_logits.detach(), -1)
    args = (p.means.detach(), p.log_stds.detach(), log_mix, p.config.responsibility, p.config.temperature)
    table = bin_table(theta, wid, *args)
    counts: Counter = Counter()
    for u, width in uncovered_blocks(classify(theta, wid, table)[2], table, p.num_components, chunked.CHUNK_ELEMENTS):
        counts[width] += int(u.numel())
    return counts
