"""Every check of Appendix A, Appendix B and H(T, s, K), run on fixed instances and seeded sweeps.

Bounds are checked on ``n_random`` seeded random instances each and reported as one aggregated
verdict (``holds`` iff every instance holds; ``worst`` is the smallest slack / largest error).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from . import _validate as check
from . import appendix_a as A
from . import appendix_b as B
from . import appendix_b_rates as R
from .hspace import in_h, index_space_size, index_space_size_brute, project_brute, project_exact
from .likelihood import SpikeGMMPosterior
from .verdict import Verdict

__all__ = [
    "all_verdicts",
    "appendix_a_verdicts",
    "appendix_b_verdicts",
    "hspace_verdicts",
    "random_posterior",
]


def _aggregate(verdicts: Sequence[Verdict], key: str, *, worst: Callable[[Sequence[float]], float] = min) -> Verdict:
    first = verdicts[0]
    values = [float(v.details[key]) for v in verdicts]
    return Verdict(
        name=first.name,
        location=first.location,
        kind=first.kind,
        claim=first.claim,
        holds=all(v.holds for v in verdicts),
        details={
            "instances": len(verdicts),
            f"worst_{key}": worst(values),
            "failures": sum(not v.holds for v in verdicts),
        },
    )


@check.arguments(rng="rng", T="count", K="count", level_var="nonnegative")
def random_posterior(rng: np.random.Generator, T: int, K: int, *, level_var: float) -> SpikeGMMPosterior:
    """A random spike-and-GMM posterior (shared levels, per-weight phi and lambda~): ``rng`` a
    numpy Generator, T and K >= 1 integers, level_var finite and >= 0."""
    return SpikeGMMPosterior(
        lam_tilde=rng.uniform(0, 1, T),
        phi=rng.dirichlet(np.ones(K), size=T),
        mu=rng.uniform(-2, 2, K),
        var=np.full(K, level_var),
    )


def appendix_a_verdicts(*, n_random: int = 20, seed: int = 0) -> list[Verdict]:
    """Lemma mix, Step 2, Part 2, the dominant component and the plug-in likelihood (``n_random >= 1``)."""
    n_random = check.count("n_random", n_random, low=1)
    rng = np.random.default_rng(check.seed("seed", seed))
    mix = [A.check_lemma_mix(A.random_mixture(rng, 3), A.random_mixture(rng, 3)) for _ in range(n_random)]
    chain = [A.check_part2_chain(A.random_mixture(rng, 4), float(rng.uniform(0.1, 4))) for _ in range(n_random)]
    ident = [
        A.check_spike_slab_identity(
            float(rng.uniform(0.05, 0.95)), A.random_mixture(rng, 3), float(rng.uniform(0.05, 0.95)), 1.0
        )
        for _ in range(max(1, n_random // 4))
    ]
    gvar = [
        A.check_gaussian_prior_variant(float(rng.uniform(0, 1)), A.random_mixture(rng, 3), float(rng.uniform(0.1, 4)))
        for _ in range(n_random)
    ]
    repl = [A.check_replacement_bound(A.random_mixture(rng, 4), float(rng.uniform(0.1, 4))) for _ in range(n_random)]
    linear = []
    for i in range(max(1, n_random // 4)):
        post = random_posterior(rng, 4, 2, level_var=0.0 if i % 2 == 0 else 0.05)
        X, y = rng.normal(size=(5, 4)), rng.normal(size=5)
        linear.append(A.check_plugin_linear(post, X, y, 0.5))
    return [
        _aggregate(mix, "slack"),
        _aggregate(ident, "abs_error", worst=max),
        _aggregate(chain, "slack"),
        A.check_dominant_approximation(),
        _aggregate(repl, "part2_error", worst=max),
        _aggregate(gvar, "slack"),
        _aggregate(linear, "gap"),
        A.check_plugin_relu(),
        A.check_plugin_relu(level_var=0.01),
    ]


def appendix_b_verdicts() -> list[Verdict]:
    """Moment steps, sup bounds, tau conditions, sigma_n, rates, lambda, Lemma bound."""
    return [
        B.check_gaussian_abs_mgf(),
        B.check_shifted_abs_mgf(),
        B.check_mu_separation(),
        B.check_tau_condition(phi_o=0.5),
        B.check_tau_condition(phi_o=1e-120),
        B.check_log_slip(),
        B.check_sup_bound_mc(phi_o=0.5),
        B.check_sup_bound_mc(phi_o=0.0),
        B.check_squared_mgf(),
        B.check_tau_condition_squared(),
        R.check_sigma_n_algebra(),
        R.check_bound_elbo_algebra(),
        R.check_r_n_lower(),
        R.check_footnote_sigma_n(),
        R.check_prior_variance_typo(),
        R.check_lambda_condition(1.5),
        R.check_lambda_condition(0.5),
        R.check_lambda_condition(0.25),
        R.check_lambda_condition(0.25, delta_s=1.5),
        R.check_chernoff_tail(),
        R.check_lower_tail_typo(),
        R.check_condition_implies_lemma_bound(1.5),
    ]


def hspace_verdicts(*, seed: int = 0) -> list[Verdict]:
    """The definition of H(T, s, K): distinct values, sparsity, index-space size, projection."""
    theta = np.array([0.0, 1.0, 2.0])  # = I E with K = 2 levels (1, 2) and one pruned row
    count_ok = all(
        index_space_size(T, s, K) == index_space_size_brute(T, s, K)
        for T in range(1, 6)
        for s in range(T + 1)
        for K in range(1, 4)
    )
    rng = np.random.default_rng(check.seed("seed", seed))
    gaps = []
    for _ in range(10):
        x = rng.normal(0, 2, 6)
        gaps.append(project_exact(x, s=3, K=2, B=3.0).cost - project_brute(x, s=3, K=2, B=3.0).cost)
    return [
        Verdict(
            name="H-distinct-values",
            location="App. B, definition of H(T,s,K)",
            kind="identity",
            claim="any theta in H(T,s,K) has only K distinct entry values",
            holds=np.unique(theta).size <= 2,
            details={
                "theta": str(theta.tolist()),
                "K": 2,
                "in_H": in_h(theta, s=2, K=2, B=3.0),
                "distinct": int(np.unique(theta).size),
            },
        ),
        Verdict(
            name="index-space-size",
            location="App. B, I(T,s,K)",
            kind="identity",
            claim="|I(T,s,K)| = sum_{j<=s} C(T,j) K^j (ours; brute force for T<=5)",
            holds=count_ok,
            details={"I(5,2,3)": index_space_size(5, 2, 3)},
        ),
        Verdict(
            name="projection-exact-dp",
            location="H(T,s,K) projection (ours)",
            kind="identity",
            claim="exact DP cost = brute-force cost over I(T,s,K)",
            holds=max(abs(g) for g in gaps) <= 1e-9,
            details={"instances": len(gaps), "max_abs_gap": max(abs(g) for g in gaps)},
        ),
    ]


def all_verdicts(*, n_random: int = 20, seed: int = 0) -> list[Verdict]:
    """Every verdict, Appendix A first (``n_random >= 1`` random instances per bound, ``seed >= 0``)."""
    n_random, seed = check.count("n_random", n_random, low=1), check.seed("seed", seed)
    return appendix_a_verdicts(n_random=n_random, seed=seed) + hspace_verdicts(seed=seed) + appendix_b_verdicts()
