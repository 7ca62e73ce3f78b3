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

import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from . import _tensors
from . import _validate as check

__all__ = [
    "LEVELS",
    "MAX_T",
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


def _weight_matrices(w1, w2) -> tuple[np.ndarray, np.ndarray]:
    """w1 (width, p) and w2 (1, width), finite and within float32's range, width and p >= 1."""
    w1, w2 = check.weight_pair(w1, w2)
    for name, w in (("w1", w1), ("w2", w2)):
        if np.abs(w).max() > np.finfo(np.float32).max:
            raise ValueError(f"{name} must be within float32's range, got {float(np.abs(w).max())!r}")
    return w1, w2


def mlp_from_weights(w1, w2) -> nn.Sequential:
    """The bias-free ReLU MLP ``p -> width -> 1`` with W1 = ``w1`` (width, p) and W2 = ``w2`` (1, width), float32."""
    with check.within("mlp_from_weights"):
        w1, w2 = _weight_matrices(w1, w2)
    model = _mlp(w1.shape[1], w1.shape[0])
    first, last = layers(model)
    with torch.no_grad():
        first.weight.copy_(torch.tensor(w1, dtype=torch.float32))
        last.weight.copy_(torch.tensor(w2, dtype=torch.float32))
    return model


MAX_T = 1_000_000  # T = width·(p + 1) weights: the teacher's, every fit's and x_test (n_test, p) are dense


def check_teacher_shape(p: int, width: int) -> None:
    """A ValueError unless p >= 2 and 1 <= width <= p(p - 1) (each unit reads its own ordered pair of inputs)
    and T = width·(p + 1) <= MAX_T (the network is dense: p = 1e9 had exhausted the memory)."""
    if p < 2 or width < 1 or width > p * (p - 1):
        raise ValueError(f"need p >= 2 and 1 <= width <= p(p-1) (distinct ordered input pairs), got {p=}, {width=}")
    if width * (p + 1) > MAX_T:
        raise ValueError(f"need T = width·(p+1) <= {MAX_T:,} (a dense network), got {p=}, {width=}")


def _ordered_pair(index: int, p: int) -> tuple[int, int]:
    """The ``index``-th ordered pair (a, b), a != b, of range(p) in ``itertools.permutations(range(p), 2)``'s
    order (a-major), without listing the p(p - 1) pairs."""
    a, r = divmod(index, p - 1)
    return a, r if r < a else r + 1


@check.arguments(p="count", width="count", seed="seed")
def make_teacher(p: int = 4, width: int = 6, seed: int = 0) -> nn.Sequential:
    """f0 in H(T, s = 3·width, K = 4): unit j has weight +|l| on input a_j, -|l'| on b_j and output level v_j;
    p >= 2, 1 <= width <= p(p - 1) and T = width·(p + 1) <= MAX_T."""
    with check.within("make_teacher"):
        check_teacher_shape(p, width)
    rng = np.random.default_rng(seed)
    chosen = rng.choice(p * (p - 1), size=width, replace=False)  # the same draws as from the list of pairs
    positive = [v for v in LEVELS if v > 0]
    w1, w2 = np.zeros((width, p)), np.zeros((1, width))
    for j, index in enumerate(chosen):
        a, b = _ordered_pair(int(index), p)
        w1[j, a], w1[j, b] = rng.choice(positive), -rng.choice(positive)
        w2[0, j] = rng.choice(LEVELS)
    return mlp_from_weights(w1, w2).requires_grad_(False)


def teacher_theta(model: nn.Module) -> np.ndarray:
    """θ = (vec W1, vec W2) of a plain ``p -> width -> 1`` MLP (T = width·(p + 1) entries)."""
    first, last = layers(model)
    return np.concatenate([first.weight.detach().numpy().ravel(), last.weight.detach().numpy().ravel()])


@check.arguments(n="count", sigma="positive", generator=_tensors.generator)
def sample_data(teacher: nn.Module, n: int, sigma: float, generator: torch.Generator):
    """n pairs (X, Y) of eq. regression: X ~ U[0,1]^p, Y = f0(X) + N(0, sigma^2); shapes (n, p), (n, 1)."""
    x = torch.rand(n, layers(teacher)[0].in_features, generator=generator)
    with torch.no_grad():
        y = teacher(x) + sigma * torch.randn(n, 1, generator=generator)
    if not torch.isfinite(y).all():  # sigma (or the teacher) beyond float32's range
        raise ValueError(f"Y overflows float32 at sigma={sigma!r} (in sample_data)")
    return x, y


def _gaussian_nll(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sigma: float) -> torch.Tensor:
    """:func:`gaussian_nll` without the argument checks (the training loops check their data once)."""
    return ((y - model(x)) ** 2).mean() / (2.0 * sigma**2)


@check.arguments(sigma="positive")
def gaussian_nll(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sigma: float) -> torch.Tensor:
    """Batch-mean −log p(y|x, θ) up to a constant: mean (y − f_θ(x))² / (2σ²), σ known (Section 3.2);
    x (n, p) and y (n, 1) finite, of the model's dtype."""
    with check.within("gaussian_nll"):
        _tensors.data(model, x, y)
    return _gaussian_nll(model, x, y, sigma)


@torch.no_grad()
@check.arguments(sigma="positive")
def training_nll(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sigma: float) -> float:
    """:func:`gaussian_nll` as a float, without gradients (the NLL reported for a fitted network); a ValueError
    where it leaves float32's range (σ² underflowing, say)."""
    with check.within("training_nll"):
        _tensors.data(model, x, y)
    nll = float(_gaussian_nll(model, x, y, sigma))
    return _tensors.check_finite_result("training_nll", "the NLL", nll, sigma=sigma)


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
        loss = _gaussian_nll(model, x, y, sigma)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(_gaussian_nll(model, x, y, sigma))


@check.arguments(
    sigma="positive", init_noise="nonnegative", restarts="count", max_iter="count", generator=_tensors.generator
)
def fit_full_precision(
    teacher: nn.Module, x, y, *, sigma: float, init_noise: float, restarts: int, max_iter: int, generator
) -> FullPrecisionFit:
    """Least squares (= Gaussian MLE) by full-batch L-BFGS from ``restarts`` dense starts θ0 + init_noise·N(0, I).

    The loss is non-convex (ReLU units can die or swap kinks): about a third of single starts stop at a
    worse stationary point, so the restart with the smallest *training* NLL is kept (no teacher peeking).
    x (n, p) and y (n, 1) finite, of the teacher's dtype; a ValueError if the kept NLL is not finite.
    """
    with check.within("fit_full_precision"):
        _tensors.data(teacher, x, y)
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
    finite = [i for i, nll in enumerate(nlls) if np.isfinite(nll)]  # a restart that diverged is not the best
    best = min(finite, key=nlls.__getitem__) if finite else 0
    _tensors.check_finite_result(
        "fit_full_precision", "the training NLL", nlls[best], sigma=sigma, init_noise=init_noise
    )
    log.debug("full-precision restarts: %s (kept %d)", nlls, best)
    return FullPrecisionFit(model=models[best].requires_grad_(False), nll=nlls[best], restart_nlls=tuple(nlls))
