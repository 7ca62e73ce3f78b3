"""DGMS, re-implemented from the paper (Dong et al. 2022, "Finding the Task-Optimal Low-Bit Sub-Distribution
in Deep Neural Networks"): a per-layer K-component Gaussian mixture over the weights, trained end to end.

Per layer: means μ_0 = 0 (pinned: the pruning component), μ_1..μ_{K-1}; stds σ_k; mixing weights π_k; all but
μ_0 learnable and initialised by k-means (μ_k = cluster mean, σ_k = cluster std, π_k = cluster share). The
training forward uses the soft-quantized weight

    ŵ_i = Σ_k r_ik μ_k,   r_ik = softmax_k( (log π_k + log N(w_i | μ_k, σ_k²)) / τ ),

computed in log space, and the weights w are trained too. Inference is the hard (argmax) assignment
ŵ_i = μ_{argmax_k r_ik}; a weight is pruned exactly when it lands in component 0. There is no spike prior and
no sparsity target: the resulting sparsity is whatever the mixture gives, and is reported.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils import parametrize

from sqs_bench.compression import Layer, kmeans_1d, weight_parametrizations

__all__ = ["GMMQuantizer", "attach_gmm", "gmm_parameters", "harden"]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class GMMQuantizer(nn.Module):
    """Weight parametrization: the soft (training) or hard (inference) GMM-quantized weight."""

    def __init__(self, weight: torch.Tensor, num_components: int, temperature: float) -> None:
        super().__init__()
        if num_components < 2:
            raise ValueError(f"DGMS needs K >= 2 (a zero component and a level), got {num_components}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        values = weight.detach().flatten()
        centers, assign = kmeans_1d(values, num_components, pin_zero=True)
        counts = torch.bincount(assign, minlength=num_components).float()
        sq = torch.zeros(num_components).index_add_(0, assign, (values - centers[assign]) ** 2)
        floor = 1e-3 * values.std().clamp(min=1e-12)
        stds = (sq / (counts - 1).clamp(min=1)).sqrt().clamp(min=floor)
        self.means_rest = nn.Parameter(centers[1:].clone())  # μ_1..μ_{K-1}; μ_0 = 0 is pinned
        self.log_stds = nn.Parameter(stds.log())
        self.mixing_logits = nn.Parameter((counts / counts.sum()).clamp(min=1e-8).log())
        self.temperature = temperature
        self.hard = False

    def means(self) -> torch.Tensor:
        """All K means, μ_0 = 0 first."""
        return torch.cat([self.means_rest.new_zeros(1), self.means_rest])

    def logits(self, w: torch.Tensor) -> torch.Tensor:
        """(log π_k + log N(w | μ_k, σ_k²)) for every weight: shape (numel, K)."""
        z = (w.reshape(-1, 1) - self.means()) / self.log_stds.exp()  # (T, K)
        log_normal = -0.5 * z**2 - self.log_stds - _LOG_SQRT_2PI
        return torch.log_softmax(self.mixing_logits, 0) + log_normal

    def assignments(self, w: torch.Tensor) -> torch.Tensor:
        """Hard component index of each weight, shape (numel,)."""
        return self.logits(w).argmax(1)

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        if self.hard:
            return self.means()[self.assignments(w)].view_as(w)
        responsibilities = torch.softmax(self.logits(w) / self.temperature, dim=1)  # (T, K)
        return (responsibilities @ self.means()).view_as(w)


def attach_gmm(layers: dict[str, Layer], num_components: int, temperature: float) -> None:
    """Register a :class:`GMMQuantizer` on the weight of each layer (in place)."""
    for module in layers.values():
        quantizer = GMMQuantizer(module.weight, num_components, temperature)
        parametrize.register_parametrization(module, "weight", quantizer)


def gmm_parameters(layers: dict[str, Layer]) -> list[nn.Parameter]:
    """The learnable mixture parameters (means, stds, mixing weights) of every attached quantizer."""
    params: list[nn.Parameter] = []
    for module in layers.values():
        params += list(weight_parametrizations(module)[0].parameters())
    return params


@torch.no_grad()
def harden(layers: dict[str, Layer]) -> dict[str, torch.Tensor]:
    """Replace each soft GMM weight by its argmax quantization, remove the parametrization, and return the
    hard component indices (component 0 = pruned) of every layer."""
    indices = {}
    for name, module in layers.items():
        parametrizations = weight_parametrizations(module)
        quantizer = parametrizations[0]
        indices[name] = quantizer.assignments(parametrizations.original).view_as(module.weight)
        quantizer.hard = True
        parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
    return indices
