"""The discrete inference distribution of one tensor (eq. infer-theta), independent of where it came from.

Both the in-memory posterior and a loaded artifact produce a :class:`DiscretePosterior`; sampling and
weight materialisation go through this one class, so a file and the model it was saved from give the
same draws for the same ``torch.Generator`` seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DiscretePosterior", "inverse_cdf"]


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Level index per row: the first k with cumsum(probs)_k > u · Σ probs (rows need not be normalised)."""
    cdf = torch.cumsum(probs, dim=-1)
    scaled = uniforms[:, None] * cdf[:, -1:]
    return (cdf <= scaled).sum(-1).clamp_max(probs.shape[-1] - 1)


@dataclass
class DiscretePosterior:
    """Everything eq. infer-theta and the pruning rule need for one weight tensor (all flat, CPU ok).

    ``codebook`` (W, K) holds the levels μ_wk; ``window_ids`` and ``greedy`` (T,) uint8; ``keep`` (T,)
    bool is the pruning decision; ``alt_index`` (n,) / ``alt_probs`` (n, K) list the weights whose
    distribution is not one-hot (every other weight samples its greedy level with probability 1).
    """

    shape: tuple[int, ...]
    codebook: torch.Tensor
    window_ids: torch.Tensor
    greedy: torch.Tensor
    keep: torch.Tensor
    alt_index: torch.Tensor
    alt_probs: torch.Tensor

    @property
    def numel(self) -> int:
        return int(self.greedy.numel())

    def weights(self, levels: torch.Tensor | None = None) -> torch.Tensor:
        """The sparse quantized weight for ``levels`` (default: greedy), θ's shape."""
        levels = self.greedy if levels is None else levels
        k = self.codebook.shape[1]
        flat = self.window_ids.long() * k + levels.reshape(-1).long()
        values = self.codebook.reshape(-1)[flat]
        return torch.where(self.keep.reshape(-1), values, 0.0).reshape(self.shape)

    def draw(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """One draw of the levels: one uniform per weight (T of them, in flat order) from ``generator``, made on
        the generator's device (the CPU without one), so a model on any device and its file draw alike."""
        device = torch.device("cpu") if generator is None else generator.device
        uniforms = torch.rand(self.numel, generator=generator, device=device)
        levels = self.greedy.reshape(-1).clone()
        if self.alt_index.numel():
            u = uniforms[self.alt_index.to(device)].to(self.alt_probs.device)
            levels[self.alt_index] = inverse_cdf(self.alt_probs.float(), u).to(levels.dtype)
        return levels
