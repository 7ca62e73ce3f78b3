"""Part 1 of Appendix A: the plug-in likelihood ``-log p(D | theta_avg)`` vs ``-E_q log p(D | theta~)``.

The variational posterior is the paper's spike-and-GMM (eq. ``marginal_vb``) with shared levels
``mu_k, sigma_k^2`` and per-weight ``phi_ik`` and ``lambda~_i``.  The expectation is computed exactly by
enumerating the ``(K + 1)^T`` atoms when every ``sigma_k = 0`` (q itself, with its random Bernoulli gates: not
eq. ``infer-theta``, which prunes deterministically by quantile), and otherwise by enumerating the discrete
choices exactly with Monte Carlo over the Gaussian components only (stratified), or by plain Monte Carlo.

For a linear model ``f(x; theta) = x^T theta`` with Gaussian likelihood the gap is exactly a variance
term: ``E_q NLL = NLL(theta_avg) + sum_n sum_i x_ni^2 Var_q(theta_i) / (2 sigma_eps^2) >= NLL(theta_avg)``.
For a ReLU network the loss is not convex in ``theta`` and the plug-in can fall on either side.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import _validate as check
from .kl import SUM_TOLERANCE

__all__ = [
    "ReluNet",
    "SpikeGMMPosterior",
    "expected_nll_exact",
    "expected_nll_mc",
    "expected_nll_stratified",
    "gaussian_nll",
    "linear_expected_nll",
    "linear_predict",
    "plugin_nll",
]

Predict = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (M, T), (n, d) -> (M, n)
_MAX_ATOMS = 200_000


@dataclass(frozen=True, kw_only=True)
class SpikeGMMPosterior:
    """``q(theta~_i) = lt_i sum_k phi_ik N(mu_k, var_k) + (1 - lt_i) delta_0`` (eq. ``marginal_vb``)."""

    lam_tilde: np.ndarray = field(repr=False)  # (T,)
    phi: np.ndarray = field(repr=False)  # (T, K)
    mu: np.ndarray = field(repr=False)  # (K,)
    var: np.ndarray = field(repr=False)  # (K,); zero allowed (point masses)

    def __post_init__(self) -> None:
        lt, phi = check.finite_array("lam_tilde", self.lam_tilde), np.atleast_2d(check.finite_array("phi", self.phi))
        mu, var = np.atleast_1d(check.finite_array("mu", self.mu)), np.atleast_1d(check.finite_array("var", self.var))
        if lt.ndim != 1 or phi.shape != (lt.size, mu.size) or var.shape != mu.shape:
            raise ValueError(f"shapes must be (T,), (T,K), (K,), (K,); got {lt.shape, phi.shape, mu.shape}")
        if np.any((lt < 0) | (lt > 1)) or np.any(phi < 0) or np.any(var < 0):
            raise ValueError("need 0 <= lam_tilde <= 1, phi >= 0, var >= 0")
        if not np.allclose(phi.sum(axis=1), 1.0, rtol=0, atol=SUM_TOLERANCE):
            raise ValueError(f"each row of phi must sum to 1, got {phi.sum(axis=1)}")
        phi = phi / phi.sum(axis=1, keepdims=True)  # float32 rows (sqs-core's responsibilities) miss 1 by ~1e-7
        for name, val in (("lam_tilde", lt), ("phi", phi), ("mu", mu), ("var", var)):
            object.__setattr__(self, name, val)

    @property
    def size(self) -> int:
        return int(self.lam_tilde.size)

    def mean(self) -> np.ndarray:
        """``theta_avg_i = lt_i sum_k mu_k phi_ik`` (Step 1 of Appendix A)."""
        return self.lam_tilde * (self.phi @ self.mu)

    def variance(self) -> np.ndarray:
        """``Var_q(theta~_i) = lt_i sum_k phi_ik (mu_k^2 + var_k) - theta_avg_i^2``, computed as the sum of its
        non-negative parts ``lt_i sum_k phi_ik (var_k + (mu_k - m_i)^2) + lt_i (1 - lt_i) m_i^2`` with
        ``m_i = sum_k phi_ik mu_k``: the difference as written cancels below 0 for levels close together far
        from 0 (10^6 apart by 10^-3: -0.002)."""
        slab_mean = self.phi @ self.mu  # (T,)
        spread = (self.phi * (self.var + (self.mu[None, :] - slab_mean[:, None]) ** 2)).sum(axis=1)
        return self.lam_tilde * spread + self.lam_tilde * (1 - self.lam_tilde) * slab_mean**2

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` draws of ``theta~`` (shape ``(n, T)``)."""
        keep = rng.random((n, self.size)) < self.lam_tilde
        cdf = np.cumsum(self.phi, axis=1)  # (T, K)
        u = rng.random((n, self.size, 1))
        k = np.minimum((u > cdf).sum(axis=-1), self.mu.size - 1)  # (n, T)
        vals = self.mu[k] + np.sqrt(self.var[k]) * rng.standard_normal((n, self.size))
        return np.where(keep, vals, 0.0)

    def atom_index(self) -> tuple[np.ndarray, np.ndarray]:
        """Every choice per weight (0 = spike, k + 1 = component k) and its probability.

        Returns ``(idx, probs)`` with ``idx`` of shape ``((K + 1)^T, T)``.
        """
        n_atoms = (self.mu.size + 1) ** self.size
        if n_atoms > _MAX_ATOMS:
            raise ValueError(f"{n_atoms} atoms exceed the enumeration limit {_MAX_ATOMS}")
        probs = np.concatenate([(1 - self.lam_tilde)[:, None], self.lam_tilde[:, None] * self.phi], axis=1)
        idx = np.array(list(itertools.product(range(self.mu.size + 1), repeat=self.size)))  # (A, T)
        return idx, np.prod(probs[np.arange(self.size), idx], axis=1)

    def atoms(self) -> tuple[np.ndarray, np.ndarray]:
        """All ``(K + 1)^T`` atoms and their probabilities; requires every ``var_k = 0``."""
        if np.any(self.var > 0):
            raise ValueError("exact enumeration needs var == 0 (point-mass levels)")
        idx, p = self.atom_index()
        return np.concatenate([[0.0], self.mu])[idx], p


def gaussian_nll(y: np.ndarray, pred: np.ndarray, noise_var: float) -> np.ndarray:
    """``-log p(D | theta) = sum_n (y_n - f_n)^2 / (2 sigma_eps^2) + n/2 log(2 pi sigma_eps^2)``; ``noise_var`` > 0
    and ``y`` finite (every NLL of this module comes through here: a NaN before session 63)."""
    check.real("noise_var", noise_var, low=0.0, strict=True)
    y = np.asarray(y)
    if not np.isfinite(y).all():
        raise ValueError("y must be finite (it holds NaN or inf)")
    resid = y[None, :] - np.atleast_2d(pred)
    return (resid**2).sum(axis=-1) / (2 * noise_var) + 0.5 * y.size * np.log(2 * np.pi * noise_var)


def linear_predict(theta: np.ndarray, X: np.ndarray) -> np.ndarray:
    """``f(x; theta) = x^T theta`` for a batch of parameter vectors ``(M, T)``."""
    return np.atleast_2d(theta) @ X.T


@dataclass(frozen=True, kw_only=True)
class ReluNet:
    """One hidden ReLU layer: ``f(x) = v^T relu(W x + b) + c``; ``theta = (W, b, v, c)`` flattened."""

    d_in: int
    width: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "d_in", check.count("d_in", self.d_in, low=1))  # 2.5 gave n_params 5.5
        object.__setattr__(self, "width", check.count("width", self.width, low=1))

    @property
    def n_params(self) -> int:
        return self.width * self.d_in + 2 * self.width + 1

    def __call__(self, theta: np.ndarray, X: np.ndarray) -> np.ndarray:
        theta = np.atleast_2d(theta)  # (M, T)
        M, H, d = theta.shape[0], self.width, self.d_in
        W = theta[:, : H * d].reshape(M, H, d)
        b = theta[:, H * d : H * d + H]
        v = theta[:, H * d + H : H * d + 2 * H]
        c = theta[:, -1:]
        hidden = np.maximum(np.einsum("mhd,nd->mnh", W, X) + b[:, None, :], 0.0)  # (M, n, H)
        return np.einsum("mnh,mh->mn", hidden, v) + c


def plugin_nll(post: SpikeGMMPosterior, predict: Predict, X: np.ndarray, y: np.ndarray, noise_var: float) -> float:
    """``-log p(D | theta_avg)`` (the first term of eq. ``approx_elbo``)."""
    return float(gaussian_nll(y, predict(post.mean()[None, :], X), noise_var)[0])


def expected_nll_exact(
    post: SpikeGMMPosterior, predict: Predict, X: np.ndarray, y: np.ndarray, noise_var: float
) -> float:
    """``-E_q log p(D | theta~)`` by exact enumeration of the atoms (point-mass levels only)."""
    values, probs = post.atoms()
    return float(probs @ gaussian_nll(y, predict(values, X), noise_var))


def expected_nll_mc(
    post: SpikeGMMPosterior,
    predict: Predict,
    X: np.ndarray,
    y: np.ndarray,
    noise_var: float,
    *,
    n_samples: int = 20_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Monte Carlo ``-E_q log p(D | theta~)``: (estimate, standard error); ``n_samples`` >= 2 (one has no error)."""
    n_samples = check.count("n_samples", n_samples, low=2)
    nll = gaussian_nll(y, predict(post.sample(n_samples, np.random.default_rng(seed)), X), noise_var)
    return float(nll.mean()), float(nll.std(ddof=1) / np.sqrt(n_samples))


def expected_nll_stratified(
    post: SpikeGMMPosterior,
    predict: Predict,
    X: np.ndarray,
    y: np.ndarray,
    noise_var: float,
    *,
    n_per_atom: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """``-E_q log p(D | theta~)``: exact sum over the discrete choices, Monte Carlo over the Gaussians.

    Every choice is visited whatever its probability, so rare atoms are never missed.
    Returns (estimate, standard error).
    """
    idx, probs = post.atom_index()  # (A, T), (A,)
    levels = np.concatenate([[0.0], post.mu])[idx]
    sds = np.concatenate([[0.0], np.sqrt(post.var)])[idx]
    z = np.random.default_rng(seed).standard_normal((idx.shape[0], n_per_atom, post.size))
    theta = levels[:, None, :] + sds[:, None, :] * z  # (A, m, T)
    nll = gaussian_nll(y, predict(theta.reshape(-1, post.size), X), noise_var).reshape(idx.shape[0], n_per_atom)
    se = np.sqrt(np.sum(probs**2 * nll.var(axis=1, ddof=1) / n_per_atom))
    return float(probs @ nll.mean(axis=1)), float(se)


def linear_expected_nll(post: SpikeGMMPosterior, X: np.ndarray, y: np.ndarray, noise_var: float) -> float:
    """Closed form for the linear model: plug-in NLL plus ``sum_n sum_i x_ni^2 Var_i / (2 sigma_eps^2)``."""
    gap = float((X**2 @ post.variance()).sum() / (2 * noise_var))
    return plugin_nll(post, linear_predict, X, y, noise_var) + gap
