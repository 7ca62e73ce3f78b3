"""sqs-theory: numerical checks of the SQS paper's theory (Appendix A, Appendix B, H(T, s, K)).

The checks use numpy / scipy / sympy only. The convergence study (``synthetic``, ``projection``,
``student``, ``risk``, ``recovery``, ``convergence``, ``plots``) also needs torch and sqs-core; it is not
imported here, so ``import sqs_theory`` stays light. The library logs and never prints.
"""

from __future__ import annotations

from .checks import all_verdicts
from .errata import Erratum, build_errata, write_errata
from .hspace import (
    Projection,
    in_h,
    index_decomposition,
    index_space_size,
    log_index_space_size,
    project_exact,
    project_heuristic,
    quantize_exact,
)
from .kl import (
    GaussianMixture,
    kl_bernoulli,
    kl_gaussian,
    kl_gaussian_prior_variant,
    kl_mixture,
    kl_mixture_mp,
    kl_spike_slab,
)
from .likelihood import SpikeGMMPosterior
from .rates import eps_n, lambda_condition_max_m, n_params, neg_log_lambda, r_n, s_n
from .verdict import Verdict, format_table

__all__ = [
    "Erratum",
    "GaussianMixture",
    "Projection",
    "SpikeGMMPosterior",
    "Verdict",
    "all_verdicts",
    "build_errata",
    "eps_n",
    "format_table",
    "in_h",
    "index_decomposition",
    "index_space_size",
    "kl_bernoulli",
    "kl_gaussian",
    "kl_gaussian_prior_variant",
    "kl_mixture",
    "kl_mixture_mp",
    "kl_spike_slab",
    "lambda_condition_max_m",
    "log_index_space_size",
    "n_params",
    "neg_log_lambda",
    "project_exact",
    "project_heuristic",
    "quantize_exact",
    "r_n",
    "s_n",
    "write_errata",
]
