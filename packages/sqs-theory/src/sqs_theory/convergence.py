"""Hellinger convergence study on synthetic sparse-quantized ReLU regression (issue 4, item 5).

A teacher f0 in H(T, s, K) (bias-free ReLU MLP, ``s`` non-zero weights taking ``K`` levels) generates
``Y = f0(X) + eps``, ``X ~ U[0,1]^p``, ``eps ~ N(0, sigma^2)``. A student of the same architecture is
started at a dense perturbation of the teacher, fitted in full precision by Adam, then compressed with
sqs-core (Gaussian NLL, AdamW, cubic pruning to the teacher's density). For Gaussian regression with equal
known sigma the squared Hellinger distance is closed form:
``d^2(P_theta, P_0) = 1 - E_x exp(-(f_theta(x) - f0(x))^2 / (8 sigma^2))``.
The log-log slope of d^2 against n is compared with the theory's rate eps_n^2 ~ (s/n) * log terms.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import sqs_core as sqs
import torch
from scipy import stats
from scipy.optimize import linear_sum_assignment
from torch import nn

from .hspace import in_h

__all__ = [
    "TIERS",
    "Tier",
    "fit_one",
    "fit_slope",
    "hellinger_sq",
    "hellinger_sq_gaussian",
    "make_teacher",
    "run_study",
    "teacher_theta",
]

THEORY_SLOPE = -1.0  # eps_n^2 ∝ r_n log^{2δ} n with r_n ~ s/n: slope -1 up to log factors
LEVELS = (-1.5, -0.5, 0.5, 1.5)


@dataclass(frozen=True)
class Tier:
    name: str
    ns: tuple[int, ...]
    seeds: tuple[int, ...]
    fp_steps: int
    sqs_steps: int
    draws: int = 8  # M posterior draws for the sampled Hellinger
    n_test: int = 4096
    gaussian_ns: tuple[int, ...] = ()  # n values also fitted with the Gaussian prior
    p: int = 4
    width: int = 6
    sigma: float = 0.1
    init_noise: float = 0.3


TIERS = {
    "tiny": Tier("tiny", ns=(64, 256), seeds=(0,), fp_steps=20, sqs_steps=20, draws=2, n_test=512, gaussian_ns=(64,)),
    "quick": Tier("quick", ns=(64, 128, 256, 512, 1024, 2048), seeds=(0, 1), fp_steps=300, sqs_steps=300,
                  gaussian_ns=(512,)),
    "full": Tier("full", ns=(64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384), seeds=(0, 1, 2, 3, 4),
                 fp_steps=1500, sqs_steps=1500, draws=16, n_test=16384, gaussian_ns=(256, 1024, 4096)),
}  # fmt: skip


# ----------------------------------------------------------------------------- closed forms and fits
def hellinger_sq_gaussian(f: np.ndarray, f0: np.ndarray, sigma: float) -> np.ndarray:
    """Pointwise d^2(N(f, sigma^2), N(f0, sigma^2)) = 1 - exp(-(f - f0)^2 / (8 sigma^2))."""
    diff = np.asarray(f, dtype=float) - np.asarray(f0, dtype=float)
    return -np.expm1(-(diff**2) / (8.0 * sigma**2))


def hellinger_sq(f: np.ndarray, f0: np.ndarray, sigma: float) -> float:
    """d^2(P_f, P_0) for Y | x ~ N(f(x), sigma^2), averaged over the x at which f, f0 are evaluated."""
    return float(np.mean(hellinger_sq_gaussian(f, f0, sigma)))


def fit_slope(ns, values, level: float = 0.95) -> dict:
    """OLS of log(values) on log(ns): slope, intercept, and a t-interval for the slope."""
    x, y = np.log(np.asarray(ns, dtype=float)), np.log(np.asarray(values, dtype=float))
    if x.size < 3 or np.ptp(x) == 0:
        raise ValueError("need at least 3 points with at least two distinct n")
    res = stats.linregress(x, y)
    half = stats.t.ppf(0.5 + level / 2, x.size - 2) * res.stderr
    return {
        "slope": float(res.slope),
        "slope_ci": [float(res.slope - half), float(res.slope + half)],
        "intercept": float(res.intercept),
        "stderr": float(res.stderr),
        "r2": float(res.rvalue**2),
        "num_points": int(x.size),
    }


# ----------------------------------------------------------------------------- teacher and data
def make_teacher(p: int = 4, width: int = 6, seed: int = 0) -> nn.Sequential:
    """Bias-free ReLU MLP p -> width -> 1; each hidden unit has 2 inputs (>= one positive) and 1 output."""
    rng = np.random.default_rng(seed)
    w1, w2 = np.zeros((width, p)), np.zeros((1, width))
    for j in range(width):
        cols = rng.choice(p, size=2, replace=False)
        w1[j, cols] = rng.choice(LEVELS, size=2)
        w1[j, cols[0]] = abs(w1[j, cols[0]])  # the unit is active on part of [0,1]^p
        w2[0, j] = rng.choice(LEVELS)
    model = nn.Sequential(nn.Linear(p, width, bias=False), nn.ReLU(), nn.Linear(width, 1, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor(w1, dtype=torch.float32))
        model[2].weight.copy_(torch.tensor(w2, dtype=torch.float32))
    return model.requires_grad_(False)


def teacher_theta(teacher: nn.Module) -> np.ndarray:
    return np.concatenate([teacher[0].weight.numpy().ravel(), teacher[2].weight.numpy().ravel()])


def _data(teacher: nn.Module, n: int, sigma: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand(n, teacher[0].in_features, generator=gen)
    with torch.no_grad():
        y = teacher(x) + sigma * torch.randn(n, 1, generator=gen)
    return x, y


# ----------------------------------------------------------------------------- student fit
def _student(teacher: nn.Module, noise: float, gen: torch.Generator) -> nn.Sequential:
    model = nn.Sequential(nn.Linear(teacher[0].in_features, teacher[0].out_features, bias=False), nn.ReLU(),
                          nn.Linear(teacher[0].out_features, 1, bias=False))  # fmt: skip
    with torch.no_grad():
        for i in (0, 2):
            w = teacher[i].weight
            model[i].weight.copy_(w + noise * torch.randn(w.shape, generator=gen))
    return model


def _nll(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sigma: float) -> torch.Tensor:
    return ((y - model(x)) ** 2).mean() / (2.0 * sigma**2)


def _fit_fp(model: nn.Module, x, y, sigma: float, steps: int) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        _nll(model, x, y, sigma).backward()
        opt.step()


def _compress(model: nn.Module, x, y, tier: Tier, prior: str, density: float) -> None:
    spec = (
        sqs.SpikeSlabPrior(keep_prob=density, slab_std=1.0)
        if prior == "spike_slab"
        else sqs.GaussianPrior(slab_std=1.0)
    )
    sqs.prepare_(model, sqs.SQSConfig(num_components=len(LEVELS), windows="none", prior=spec, train_weight=True))
    objective = sqs.Objective(model, num_data=x.shape[0])
    opt = torch.optim.AdamW(sqs.param_groups(model, quant_lr=1e-2, gate_lr=0.012, weight_lr=1e-2), weight_decay=0.0)
    pruning = sqs.PruningSchedule(model, target_nonzero=density, total_steps=tier.sqs_steps)
    model.train()
    for step in range(tier.sqs_steps):
        pruning.step(step)
        opt.zero_grad()
        objective(_nll(model, x, y, tier.sigma)).backward()
        opt.step()
    model.eval()


def _predict(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(x).numpy().ravel()


def _fixed_theta(model: nn.Module) -> tuple[np.ndarray, np.ndarray]:
    layers = sqs.sqs_layers(model)
    return layers["0"].fixed_weight.numpy().copy(), layers["2"].fixed_weight.numpy().copy()


# ----------------------------------------------------------------------------- recovery
def _match_units(t1, t2, s1, s2) -> np.ndarray:
    """Permutation of student hidden units best matching the teacher's (cosine of [in, out] vectors)."""
    t = np.concatenate([t1, t2.T], axis=1)
    s = np.concatenate([s1, s2.T], axis=1)
    tn = t / np.maximum(np.linalg.norm(t, axis=1, keepdims=True), 1e-12)
    sn = s / np.maximum(np.linalg.norm(s, axis=1, keepdims=True), 1e-12)
    _, perm = linear_sum_assignment(-(tn @ sn.T))
    return perm


def recovery(teacher: nn.Module, w1: np.ndarray, w2: np.ndarray) -> dict:
    """Support (after matching hidden units) and level recovery of greedy weights ``w1``, ``w2``."""
    t1, t2 = teacher[0].weight.numpy(), teacher[2].weight.numpy()
    perm = _match_units(t1, t2, w1, w2)
    s = np.concatenate([w1[perm].ravel(), w2[:, perm].ravel()])
    t = np.concatenate([t1.ravel(), t2.ravel()])
    kept, true = s != 0, t != 0
    levels = np.unique(s[kept])
    teacher_levels = np.unique(t[true])
    err = [float(np.min(np.abs(teacher_levels - v))) for v in levels]
    return {
        "true_positive": int(np.sum(kept & true)),
        "false_positive": int(np.sum(kept & ~true)),
        "false_negative": int(np.sum(~kept & true)),
        "sign_agreement": float(np.mean(np.sign(s[kept & true]) == np.sign(t[kept & true]))) if (kept & true).any()
        else float("nan"),
        "greedy_levels": [float(v) for v in levels],
        "max_level_error": max(err) if err else float("nan"),
    }  # fmt: skip


# ----------------------------------------------------------------------------- one fit and the study
def fit_one(tier: Tier, n: int, seed: int, prior: str = "spike_slab") -> dict:
    """Fit one student at sample size n; Hellinger at θ^avg, greedy and over M posterior draws."""
    teacher = make_teacher(tier.p, tier.width, seed=1234)
    theta0 = teacher_theta(teacher)
    density = float(np.count_nonzero(theta0)) / theta0.size
    gen = torch.Generator().manual_seed(10_000 * seed + n)
    x, y = _data(teacher, n, tier.sigma, gen)
    x_test = torch.rand(tier.n_test, tier.p, generator=torch.Generator().manual_seed(99))
    f0 = _predict(teacher, x_test)
    model = _student(teacher, tier.init_noise, gen)
    _fit_fp(model, x, y, tier.sigma, tier.fp_steps)
    h_fp = hellinger_sq(_predict(model, x_test), f0, tier.sigma)
    _compress(model, x, y, tier, prior, density)
    h_avg = hellinger_sq(_predict(model, x_test), f0, tier.sigma)
    draws = []
    for _ in range(tier.draws):
        sqs.sample_(model, nonzero=density, generator=gen)
        draws.append(hellinger_sq(_predict(model, x_test), f0, tier.sigma))
    sqs.greedy_(model, nonzero=density)
    h_greedy = hellinger_sq(_predict(model, x_test), f0, tier.sigma)
    rec = recovery(teacher, *_fixed_theta(model))
    sqs.variational_(model)
    return {"n": n, "seed": seed, "prior": prior, "hellinger_sq": h_avg, "hellinger_sq_sampled": float(np.mean(draws)),
            "hellinger_sq_sampled_std": float(np.std(draws)), "hellinger_sq_greedy": h_greedy,
            "hellinger_sq_fp": h_fp, **rec}  # fmt: skip


def _slopes(points: list[dict]) -> dict:
    ss = [q for q in points if q["prior"] == "spike_slab"]
    ns = [q["n"] for q in ss]
    out = {}
    for key in ("hellinger_sq", "hellinger_sq_sampled", "hellinger_sq_greedy", "hellinger_sq_fp"):
        vals = [max(q[key], 1e-12) for q in ss]
        out[key] = fit_slope(ns, vals) if len(set(ns)) >= 2 and len(ns) >= 3 else None
    return out


def run_study(tier: Tier | str) -> dict:
    """Every fit of ``tier``; the slope of d^2 at θ^avg vs n (spike-and-slab prior) with its 95% CI."""
    tier = TIERS[tier] if isinstance(tier, str) else tier
    points = [fit_one(tier, n, seed) for n in tier.ns for seed in tier.seeds]
    points += [fit_one(tier, n, seed, prior="gaussian") for n in tier.gaussian_ns for seed in tier.seeds]
    teacher = make_teacher(tier.p, tier.width, seed=1234)
    theta0 = teacher_theta(teacher)
    s = int(np.count_nonzero(theta0))
    slopes = _slopes(points)
    main = slopes["hellinger_sq"]
    return {
        "tier": tier.name,
        "config": asdict(tier),
        "teacher": {
            "T": int(theta0.size),
            "s": s,
            "K": len(LEVELS),
            "levels": list(LEVELS),
            "in_h": in_h(theta0, s=s, K=len(LEVELS), B=max(abs(v) for v in LEVELS)),
        },
        "points": points,
        "slope": main["slope"] if main else None,
        "slope_ci": main["slope_ci"] if main else None,
        "slopes": slopes,
        "theory_slope": THEORY_SLOPE,
        "theory_rate": "eps_n^2 ∝ r_n log^{2δ} n, r_n ~ (s/n)·log terms: slope -1 up to logs",
    }


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    ss = [q for q in result["points"] if q["prior"] == "spike_slab"]
    gs = [q for q in result["points"] if q["prior"] == "gaussian"]
    ax.loglog([q["n"] for q in ss], [q["hellinger_sq"] for q in ss], "o", label=r"$\theta^{avg}$ (spike-slab)")
    ax.loglog([q["n"] for q in ss], [q["hellinger_sq_sampled"] for q in ss], "x", label="sampled (mean of M)")
    if gs:
        ax.loglog([q["n"] for q in gs], [q["hellinger_sq"] for q in gs], "s", label=r"$\theta^{avg}$ (Gaussian)")
    fit = result["slopes"]["hellinger_sq"]
    if fit:
        grid = np.geomspace(min(q["n"] for q in ss), max(q["n"] for q in ss), 50)
        lo, hi = fit["slope_ci"]
        label = f"fit: slope {fit['slope']:.2f} [{lo:.2f}, {hi:.2f}]"
        ax.loglog(grid, np.exp(fit["intercept"]) * grid ** fit["slope"], "-", label=label)
    ax.set(xlabel="n", ylabel=r"$d_H^2(P_\theta, P_0)$", title=f"Hellinger convergence ({result['tier']} tier)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_study(tier: Tier | str, out_dir: Path) -> tuple[Path, Path]:
    """Run ``tier``; write ``convergence.json`` and ``convergence.png`` under ``out_dir``."""
    torch.manual_seed(0)
    torch.set_num_threads(1)  # tiny models: threading overhead dominates
    result = run_study(tier)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "convergence.json"
    json_path.write_text(json.dumps(result, indent=2, default=_json_default) + "\n")
    return json_path, plot(result, out_dir / "convergence.png")


def _json_default(obj):
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, float) and math.isnan(obj):
        return None
    raise TypeError(f"not JSON serialisable: {type(obj)}")
