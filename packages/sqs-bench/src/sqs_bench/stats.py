"""Accuracy and a paired bootstrap interval for the accuracy drop.

The drop of a compressed model is measured on the same test images as its fp32 parent, so the two
predictions are paired: resampling images (not the two models independently) keeps their correlation, which
makes the interval much tighter than two independent binomial errors would suggest.
"""

from __future__ import annotations

import torch

__all__ = ["accuracy", "paired_bootstrap_drop_ci"]


def _check(labels: torch.Tensor, *preds: torch.Tensor) -> None:
    if labels.ndim != 1 or labels.numel() == 0:
        raise ValueError(f"labels must be a non-empty 1-D tensor, got shape {tuple(labels.shape)}")
    for p in preds:
        if p.shape != labels.shape:
            raise ValueError(f"predictions of shape {tuple(p.shape)} do not match labels {tuple(labels.shape)}")


def accuracy(preds: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy in percent."""
    _check(labels, preds)
    return (preds == labels).double().mean().item() * 100.0


def paired_bootstrap_drop_ci(
    labels: torch.Tensor,
    reference: torch.Tensor,
    compressed: torch.Tensor,
    *,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
    chunk: int = 250,
) -> tuple[float, float]:
    """Percentile bootstrap interval (points) of accuracy(reference) − accuracy(compressed).

    Images are resampled with replacement, ``resamples`` times, from a generator seeded with ``seed``; the
    same resampled images score both models. Vectorized in chunks of ``chunk`` resamples.
    """
    _check(labels, reference, compressed)
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    # per-image difference in correctness: +1 lost by compression, −1 gained, 0 unchanged
    diff = (reference == labels).double() - (compressed == labels).double()  # (n,)
    n = diff.numel()
    generator = torch.Generator().manual_seed(seed)
    drops = []
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        idx = torch.randint(0, n, (rows, n), generator=generator)  # (rows, n)
        drops.append(diff[idx].mean(1) * 100.0)
    all_drops = torch.cat(drops)
    tail = (1.0 - level) / 2
    lo, hi = torch.quantile(all_drops, torch.tensor([tail, 1.0 - tail], dtype=torch.float64))
    return lo.item(), hi.item()
