"""Synthetic sparse-quantized ReLU regression (Section "Theoretical Justification", eq. regression).

``Y = f0(X) + eps``, ``X ~ U[0,1]^p``, ``eps ~ N(0, sigma^2)``, with a teacher f0 in H(T, s, K): a bias-free
ReLU MLP ``p -> width -> 1`` whose ``s`` non-zero weights take the K = 4 values of :data:`LEVELS`. The
full-precision fit of this module is the pretrained θ that SQS compresses (the paper's θ_i, "fixed and
provided as input to the compression procedure").

Identifiability matters for support recovery: on [0,1]^p a bias-free unit whose input weights are all
positive is always active, hence linear, and a sum of linear units is identifiable only as a sum. Each
teacher unit therefore reads one input with a positive and another with a negative weight (its kink crosses
the cube), and no two units read the same ordered pair.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

__all__ = [
    "LEVELS",
    "FullPrecisionFit",
    "fit_full_precision",
    "gaussian_nll",
    "layers",
    "make_teacher",
    "mlp_from_weights",
    "sample_data",
    "teacher_theta",
    "training_nll",
]

log = logging.getLogger(__name__)

LEVELS = (-1.5, -0.5, 0.5, 1.5)


def layers(model: nn.Module) -> tuple[nn.Linear, nn.Linear]:
    """(first, last) linear layer of a plain ``p -> width -> 1`` MLP built by this module."""
    if not isinstance(model, nn.Sequential) or len(model) != 3:
        raise ValueError(f"expected nn.Sequential(Linear, ReLU, Linear), got {type(model).__name__}")
    first, last = model[0], model[2]
    if not isinstance(first, nn.Linear) or not isinstance(last, nn.Linear):
        raise ValueError("expected nn.Sequential(Linear, ReLU, Linear)")
    return first, last


def _mlp(p: int, width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(p, width, bias=False), nn.ReLU(), nn.Linear(width, 1, bias=False))


def mlp_from_weights(w1, w2) -> nn.Sequential:
    """The bias-free ReLU MLP ``p -> width -> 1`` with W1 = ``w1`` (width, p) and W2 = ``w2`` (1, width), float32."""
    w1, w2 = np.asarray(w1), np.asarray(w2)
    model = _mlp(w1.shape[1], w1.shape[0])
    first, last = layers(model)
    with torch.no_grad():
        first.weight.copy_(torch.tensor(w1, dtype=torch.float32))
        last.weight.copy_(torch.tensor(w2, dtype=torch.float32))
    return model


def make_teacher(p: int = 4, width: int = 6, seed: int = 0) -> nn.Sequential:
    """f0 in H(T, s = 3·width, K = 4): unit j has weight +|l| on input a_j, -|l'| on b_j and output level v_j."""
    if p < 2 or width < 1 or width > p * (p - 1):
        raise ValueError(f"need p >= 2 and 1 <= width <= p(p-1) (distinct ordered input pairs), got {p=}, {width=}")
    rng = np.random.default_rng(seed)
    pairs = list(itertools.permutations(range(p), 2))
    chosen = rng.choice(len(pairs), size=width, replace=False)
    positive = [v for v in LEVELS if v > 0]
    w1, w2 = np.zeros((width, p)), np.zeros((1, width))
    for j, index in enumerate(chosen):
        a, b = pairs[index]
        w1[j, a], w1[j, b] = rng.choice(positive), -rng.choice(positive)
        w2[0, j] = rng.choice(LEVELS)
    return mlp_from_weights(w1, w2).requires_grad_(False)


def teacher_theta(model: nn.Module) -> np.ndarray:
    """θ = (vec W1, vec W2) of a plain ``p -> width -> 1`` MLP (T = width·(p + 1) entries)."""
    first, last = layers(model)
    return np.concatenate([first.weight.detach().numpy().ravel(), last.weight.detach().numpy().ravel()])


def sample_data(teacher: nn.Module, n: int, sigma: float, generator: torch.Generator):
    """n pairs (X, Y) of eq. regression: X ~ U[0,1]^p, Y = f0(X) + N(0, sigma^2); shapes (n, p), (n, 1)."""
    if n < 1 or not sigma > 0:
        raise ValueError(f"need n >= 1 and sigma > 0, got {n=}, {sigma=}")
    x = torch.rand(n, layers(teacher)[0].in_features, generator=generator)
    with torch.no_grad():
        y = teacher(x) + sigma * torch.randn(n, 1, generator=generator)
    return x, y


def gaussian_nll(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sigma: float) -> torch.Tensor:
    """Batch-mean −log p(y|x, θ) up to a constant: mean (y − f_θ(x))² / (2σ²), σ known (Section 3.2)."""
    return ((y - model(x)) ** 2).mean() / (2.0 * sigma**2)


@torch.no_grad()
def training_nll(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sigma: float) -> float:
    """:func:`gaussian_nll` as a float, without gradients (the NLL reported for a fitted network)."""
    return float(gaussian_nll(model, x, y, sigma))


@dataclass(frozen=True)
class FullPrecisionFit:
    model: nn.Sequential
    nll: float  # training NLL of the chosen restart
    restart_nlls: tuple[float, ...]


def _lbfgs(model: nn.Module, x, y, sigma: float, max_iter: int) -> float:
    opt = torch.optim.LBFGS(
        model.parameters(),
        lr=1.0,
        max_iter=max_iter,
        history_size=50,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        loss = gaussian_nll(model, x, y, sigma)
        loss.backward()
        return loss

    opt.step(closure)
    return training_nll(model, x, y, sigma)


def fit_full_precision(
    teacher: nn.Module, x, y, *, sigma: float, init_noise: float, restarts: int, max_iter: int, generator
) -> FullPrecisionFit:
    """Least squares (= Gaussian MLE) by full-batch L-BFGS from ``restarts`` dense starts θ0 + init_noise·N(0, I).

    The loss is non-convex (ReLU units can die or swap kinks): about a third of single starts stop at a
    worse stationary point, so the restart with the smallest *training* NLL is kept (no teacher peeking).
    """
    if restarts < 1 or max_iter < 1:
        raise ValueError(f"restarts and max_iter must be >= 1, got {restarts=}, {max_iter=}")
    models, nlls = [], []
    t_first, _ = layers(teacher)
    for _ in range(restarts):
        model = _mlp(t_first.in_features, t_first.out_features)
        with torch.no_grad():
            for source, target in zip(layers(teacher), layers(model), strict=True):
                w = source.weight
                target.weight.copy_(w + init_noise * torch.randn(w.shape, generator=generator))
        nlls.append(_lbfgs(model, x, y, sigma, max_iter))
        models.append(model)
    best = int(np.argmin(nlls))
    log.debug("full-precision restarts: %s (kept %d)", nlls, best)
    return FullPrecisionFit(model=models[best].requires_grad_(False), nll=nlls[best], restart_nlls=tuple(nlls))
