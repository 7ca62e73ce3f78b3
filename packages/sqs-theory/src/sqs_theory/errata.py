"""The errata table: each mistake in the paper's theory with a witness computed by this package.

Every ``witness`` value below is produced by a check function at run time; nothing numeric is typed
by hand.  ``python -m sqs_theory errata`` writes the table to ``docs/results/theory/errata.json``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import appendix_a as A
from . import appendix_b as B
from . import appendix_b_rates as R
from ._io import check_output_file, write_text_atomic
from ._json import jsonable
from .hspace import in_h, index_space_size
from .kl import GaussianMixture, kl_spike_slab_smoothed
from .rates import lambda_condition_max_m, n_params, neg_log_lambda, r_n, s_n

__all__ = ["SEVERITIES", "Erratum", "build_errata", "write_errata"]

SEVERITIES = ("error", "typo", "imprecision")


@dataclass(frozen=True, kw_only=True)
class Erratum:
    """One mistake: where it is, what the paper says, what is right, and the numbers that show it."""

    id: str
    location: str
    statement: str
    correction: str
    witness: Mapping[str, Any] = field(default_factory=dict)
    severity: str = "error"
    summary: str = ""  # one line for the table in docs/theory.md

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")
        if not self.witness:
            raise ValueError(f"erratum {self.id!r} needs a computed witness")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "location": self.location,
            "severity": self.severity,
            "summary": self.summary,
            "statement": self.statement,
            "correction": self.correction,
            "witness": jsonable(dict(self.witness), non_finite=str),
        }


@dataclass(frozen=True)
class _Entry:
    """An erratum's text and the function that computes its witness (run by :func:`build_errata`)."""

    id: str
    severity: str
    summary: str
    location: str
    statement: str
    correction: str
    witness: Callable[[], Mapping[str, Any]]


def _details(check: Callable[[], Any]) -> Callable[[], dict[str, Any]]:
    """The witness is the ``details`` of a check's verdict."""
    return lambda: dict(check().details)


def _w_dominant() -> dict[str, Any]:
    under, over = (A.check_dominant_component(m, 1.0) for m in A.dominant_counterexamples().values())
    exact = kl_spike_slab_smoothed(0.5, _under(), 0.1, 1.0, spike_sd=1e-6)
    return {
        "under_phi=(0.6,0.4)_mu=(0,3)_var=(1,0.01)": {k: under[k] for k in ("kl_true", "kl_dominant")},
        "over_phi=(0.55,0.45)_mu=(2,-2)_var=(1,1)": {k: over[k] for k in ("kl_true", "kl_dominant")},
        "full_term_lt=0.5_lam=0.1": {**A.spike_slab_full_counterexample(), "kl_smoothed_spike_quadrature": exact},
    }


def _w_sparsity() -> dict[str, Any]:
    T, s, K = 4, 2, 2
    theta = np.array([1.0, 2.0, 0.0, 0.0])
    return {
        "theta": theta.tolist(),
        "in_H_with_<=s": in_h(theta, s=s, K=K, B=3.0),
        "nnz": int(np.count_nonzero(theta)),
        "|I|_<=s": index_space_size(T, s, K),
        "|I|_<s": index_space_size(T, s - 1, K),
        "|I|_=s": index_space_size(T, s, K) - index_space_size(T, s - 1, K),
    }


def _w_distinct() -> dict[str, Any]:
    theta = np.array([0.0, 1.0, 2.0])
    return {
        "theta": theta.tolist(),
        "K": 2,
        "in_H(T=3,s=2,K=2,B=3)": in_h(theta, s=2, K=2, B=3.0),
        "distinct_values": int(np.unique(theta).size),
    }


def _w_tau() -> dict[str, Any]:
    sup_paper = B.check_sup_bound_mc(phi_o=0.5).details
    return {
        **dict(B.check_tau_condition(phi_o=0.5).details),
        "mc_sup_abs": sup_paper["sup_abs"],
        "bound_abs": sup_paper["bound_abs"],
    }


_L, _N, _S, _P = 2, 8, 10, 10  # the (L, N, s*, p) at which the rate errata are witnessed


def _w_footnote() -> dict[str, Any]:
    foot = R.check_footnote_sigma_n().details
    T = n_params(_L, _N, _P)
    return {"L": _L, "N": _N, "p": _P, "T": T, "NL": _N * _L, **{k: foot[k] for k in ("points", "violated")}}


def _w_delta_range() -> dict[str, Any]:
    ns = (1e2, 1e4, 1e8, 1e16)
    one = {f"M_max_delta={d:g}": [lambda_condition_max_m(n, _L, _N, _S, _P, d) for n in ns] for d in (0.25, 0.5, 1.5)}
    apart = {
        f"M_max_delta={d:g}_s_n_delta=1.5": [lambda_condition_max_m(n, _L, _N, _S, _P, d, delta_s=1.5) for n in ns]
        for d in (0.25, 0.5)
    }
    return {"n": list(ns), **one, **apart, "(L,N,s,p)": [_L, _N, _S, _P]}


def _w_any_m() -> dict[str, Any]:
    n, delta = 1e8, 1.5
    m_n = 2 * lambda_condition_max_m(n, _L, _N, _S, _P, delta)  # a diverging sequence, twice the admissible M
    required = math.log(n_params(_L, _N, _P)) + m_n * n * r_n(n, _L, _N, _S, _P) / s_n(_S, n, delta)
    return {
        "n": n,
        "delta": delta,
        "M_n=2*M_max": m_n,
        "-log_lambda_theorem": neg_log_lambda(n, _L, _N, _P, delta),
        "-log_required_bound": required,
    }


def _under() -> GaussianMixture:
    return A.dominant_counterexamples()["under"]


_ENTRIES = (
    _Entry(
        "A1-dominant-component", "error",
        "Ω_apx's KL terms are not an upper bound: the dominant-component surrogate errs in both directions",
        "Sec. 3.1 after eq. (approx_elbo); App. A, Step 2, 'Part 2 ~ KL(N_k* || N0)'",
        "The second and third terms of Omega_apx provide an upper bound on sum_i KL(q_i || pi_i).",
        "Replacing Part 2 by the dominant component KL(N_k*||N0) is neither an upper nor a lower "
        "bound of KL(GMM||N0). A valid bound: KL(GMM||N0) <= phi_k* KL_k* + (1-phi_k*) max_{k!=k*} KL_k, "
        "and |Part 2 - KL_k*| <= (1-phi_k*) max_k |KL_k - KL_k*| -> 0 as tau -> 0.",
        _w_dominant,
    ),
    _Entry(
        "A2-spike-slab-equality", "imprecision",
        "the spike-and-slab \"upper bound\" is an equality (the atom and the densities are singular)",
        "App. A, Step 2 ('Upper Bound KL between spike-and-slab distributions')",
        "KL(q||pi) <= lt KL(GMM||N(0,s0^2)) + KL(Bern(lt)||Bern(lam)) by Lemma mix.",
        "This is an equality: the atom at 0 and the densities are mutually singular, so the "
        "log-sum inequality is tight (KL w.r.t. Lebesgue + delta_0 splits exactly).",
        _details(lambda: A.check_spike_slab_identity(0.5, _under(), 0.1, 1.0)),
    ),
    _Entry(
        "A3-plugin-likelihood", "imprecision",
        "the plug-in likelihood has no direction for ReLU nets, so Ω_apx is not a bound on Ω; for linear "
        "models it lies below",
        "Sec. 3.1 and App. A, Step 1 (plug-in likelihood)",
        "-E_q log p(D|theta~) ~ -log p(D|theta_avg); Omega_apx is presented as a surrogate for Omega.",
        "The plug-in has no direction for ReLU networks (it can be above or below the expectation), "
        "so Omega_apx is neither an upper nor a lower bound on Omega; for a linear-Gaussian model it is always "
        "below by sum_n sum_i x_ni^2 Var_q(theta_i)/(2 sigma_eps^2).",
        _details(A.check_plugin_relu),
    ),
    _Entry(
        "H1-sparsity-definition", "typo",
        "‖θ‖₀ < s vs ≤ s vs \"s many one-hot rows\": use ≤ s",
        "App. B, definition of the sparse space and of I(T,s,K)",
        "{theta: ||theta||_0 < s}; ||I||_0 <= s; 'each I consists of s many one-hot rows'.",
        "Use ||theta||_0 <= s throughout (as in I(T,s,K)); I has at most s non-zero rows.",
        _w_sparsity,
    ),
    _Entry(
        "H2-distinct-values", "typo",
        "\"K distinct values\" should be K distinct *non-zero* values",
        "App. B, after the definition of H(T,s,K)",
        "any theta in H(T,s,K) only has K many distinct entry values.",
        "K distinct non-zero values (K + 1 distinct values counting 0).",
        _w_distinct,
    ),
    _Entry(
        "B1-abs-mgf", "error",
        "E exp(t|W−μ|) = 2e^{t²σ²/2}Φ(tσ), not 2e^{t²σ²/2}",
        "App. B, proof of Lemma bound_elbo, first term of eq. (21)",
        "E_N(mu,s^2)[exp(t|W-mu|)] = 2 exp(t^2 s^2/2) (via int_0^inf 2 P(W-mu > log x / t) dx).",
        "= 2 exp(t^2 s^2/2) Phi(t s) <= 2 exp(t^2 s^2/2); the step fails for x < 1, where "
        "P(|W-mu| > log x / t) = 1 but 2 P(W-mu > log x / t) > 1.",
        _details(B.check_gaussian_abs_mgf),
    ),
    _Entry(
        "B2-shifted-abs-mgf", "error",
        "the shifted absolute moment formula is wrong (too small for d < 0)",
        "App. B, proof of Lemma bound_elbo, second term of eq. (21)",
        "E_N(mu_k,s^2)[exp(t|W-mu_(i)|)] = 2 exp(t(mu_k-mu_(i)) + s^2 t^2/2).",
        "= e^{td+t^2s^2/2} Phi(d/s+ts) + e^{-td+t^2s^2/2} Phi(ts-d/s) <= 2 exp(t|d| + t^2 s^2/2), "
        "d = mu_k - mu_(i); the stated value is too small when d < 0 and 2t|d| > log 2 + t^2 s^2/2.",
        _details(B.check_shifted_abs_mgf),
    ),
    _Entry(
        "B3-separation-vs-B", "error",
        "|μᵢ−μⱼ| ≤ 4 and μ² ≤ 4 contradict B > 2",
        "App. B, Lemma bound_elbo proof ('sup |mu_i* - mu_j*| <= 4'; '(mu_k*)^2 <= 4' before eq. 58)",
        "sup_{i,j}|mu_i* - mu_j*| <= 4 and (mu_k*)^2 <= 4, with |mu_k| <= B and B > 2.",
        "With |mu| <= B the separation is up to 2B and mu^2 up to B^2: replace 4t by 2Bt, 16t by "
        "4B^2 t and 4 by B^2 (or require B <= 2, contradicting B > 2).",
        _details(B.check_mu_separation),
    ),
    _Entry(
        "B4-tau-condition", "error",
        "φ_o ≤ ½ is insufficient; φ_o ≤ e^{−4t}/2 is needed",
        "App. B, proof of Lemma bound_elbo, choice of tau after eq. (21)",
        "Choosing tau with sum_{k!=(i)} phi_k(W*) <= 1/2 gives "
        "2N^2(e^{t^2s^2/2} + sum phi_k e^{4t+t^2s^2/2}) <= 3N^2 e^{t^2s^2/2}.",
        "The step needs sum_{k!=(i)} phi_k <= exp(-4t)/2 (exp(-2Bt)/2 for general B), with "
        "t = sqrt(2 log 3N^2)/sigma_n; with 1/2 the sup bounds fail.",
        _w_tau,
    ),
    _Entry(
        "B5-log-slip", "typo",
        "3N²/t should be log(3N²)/t",
        "App. B, proof of Lemma bound_elbo, bound on E sup|W - W*|",
        "E sup|W-W*| <= 3N^2/t + t sigma_n^2/2 = sqrt(2 sigma_n^2 log(3N^2)).",
        "log(3N^2)/t + t sigma_n^2/2 (taking logs of exp(tE) <= 3N^2 e^{t^2s^2/2}); at the chosen "
        "t this equals sqrt(2 sigma_n^2 log 3N^2) <= sqrt(8 sigma_n^2 log 3N).",
        _details(B.check_log_slip),
    ),
    _Entry(
        "B6-vacuous-tau-condition", "error",
        "φ_o ≤ exp(16t/(1−2tσ²)) is vacuous; the exponent should be negative",
        "App. B, proof of Lemma bound_elbo, after eq. (29)",
        "choose tau such that sum_{k!=(i)} phi_k(W*) <= exp(16t/(1-2t sigma_n^2)).",
        "The right side exceeds 1, so the condition is vacuous; the step needs "
        "sum_{k!=(i)} phi_k <= exp(-16t/(1-2t sigma_n^2)) (exp(-4B^2 t/(...)) for general B).",
        _details(B.check_tau_condition_squared),
    ),
    _Entry(
        "B7-sigma_n-square", "typo",
        "σ_n² must use (p+1+1/(BN−1))², as the final algebra does",
        "App. B, definition of sigma_n^2 (proof of Lemma bound_elbo)",
        "sigma_n^2 = s*/(32n) log(3N)^-1 (2BN)^-2L {(p+1+1/(BN-1)) + ...}^-1, and later "
        "16 sigma_n^2 log(3N)(2BN)^{2L}{(p+1+1/(BN-1))^2 + ...} = s*/(2n).",
        "Square the first term in the definition: {(p+1+1/(BN-1))^2 + 1/((2BN)^2-1) + 2/(2BN-1)^2}^-1.",
        lambda: {"n": 1e4, "s": 10, "L": 2, "N": 8, "p": 10, "B": 3.0, **R.check_sigma_n_algebra().details},
    ),
    _Entry(
        "B8-footnote-T", "typo",
        "T is the number of parameters, not NL (the footnote's conclusion still holds)",
        "App. B, footnote to sigma_n^2",
        "1/N^L < 1/log(T) = 1/log(NL).",
        "T is the number of parameters, (p+1)N + (L-1)(N+1)N + N + 1, not NL; the footnote's "
        "conclusion (sigma_n^2 satisfies Condition cond:bound) still holds on our grid.",
        _w_footnote,
    ),
    _Entry(
        "B9-prior-variance", "typo",
        "N(0, σ_n²) should be N(0, σ₀²) in the KL bound",
        "App. B, KL bound in the proof of Lemma bound_elbo (line after eq. 53)",
        "... + sum_i gamma_i* KL[sum_k phi_k N(mu_k*, sigma_n^2) || N(0, sigma_n^2)].",
        "The prior slab is N(0, sigma_0^2): KL[... || N(0, sigma_0^2)] (as used in the next line).",
        _details(R.check_prior_variance_typo),
    ),
    _Entry(
        "B10-delta-range", "imprecision",
        "the Theorem's λ reuses the δ that s_n and ε_n take > 1: read as one constant, \"any δ > 0\" must be δ > 1",
        "Theorem formal_convergence ('for any constant delta > 0') vs s_n and Lemma lmbound1 ('for any delta > 1')",
        "-log lambda = log T + delta[(L+1) log N + log(sqrt(n) p)] for any constant delta > 0.",
        "Name lambda's constant apart (delta' > 0): with s_n's delta > 1, M_max = delta' log^{2 delta - 1}(n) x ratio "
        "diverges for every delta' > 0, as Lemma lmbound1 needs. Read as the same delta, state delta > 1: s_n and the "
        "Lemma are defined for nothing less (with one constant, M_max diverges iff delta > 1/2).",
        _w_delta_range,
    ),
    _Entry(
        "B11-any-M", "typo",
        "\"for any diverging M\" should be \"for some diverging M\"",
        "Lemma lmbound1 ('lambda <= T^-1 exp{-M n r_n*/s_n} for any positive diverging sequence M')",
        "for any positive diverging sequence M.",
        "for some positive diverging sequence M_n (a fixed lambda cannot satisfy it for every "
        "diverging M: take M_n = 2 M_max(n)).",
        _w_any_m,
    ),
    _Entry(
        "B12-lower-tail", "typo",
        "the lower-tail density should be centred at −B",
        "App. B, proof of Lemma bound (bound on q(theta_i < -(B+1)))",
        "q(theta_i < -(B+1)) <= int_{-inf}^{-(B+1)} N(t; B, sigma_m^2) dt.",
        "Use the density centred at -B: int_{-inf}^{-(B+1)} N(t; -B, sigma_m^2) dt (= the upper "
        "tail by symmetry), after which the Chernoff step holds.",
        _details(R.check_lower_tail_typo),
    ),
)  # fmt: skip


def build_errata() -> list[Erratum]:
    """All errata, Appendix A first; every witness computed now."""
    return [
        Erratum(id=e.id, location=e.location, statement=e.statement, correction=e.correction,
                witness=dict(e.witness()), severity=e.severity, summary=e.summary)
        for e in _ENTRIES
    ]  # fmt: skip


def write_errata(path: Path | str) -> Path:
    """Write the errata as a JSON list of objects (location, statement, correction, witness, ...).

    ``path`` is checked before the witnesses are computed; the file is replaced atomically.
    """
    path = check_output_file(path, name="path")
    payload = [e.to_dict() for e in build_errata()]
    return write_text_atomic(path, json.dumps(payload, indent=2, allow_nan=False) + "\n")
