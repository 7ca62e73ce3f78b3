"""sqs-core: Bayesian DNN compression through sparse quantized sub-distributions (SQS).

A model is compressed in place with :func:`prepare_`, trained with the user's own loop and
:class:`Objective`, and turned into sparse quantized weights with :func:`greedy_`, :func:`sample_` or
:class:`BayesianAverage`. See README.md and docs/ for the method and the paper's equations.
"""

from ._experts import expert_weights
from .artifact import load, load_bayesian_average, save, upgrade
from .config import CONFIG_VERSION, GaussianPrior, SpikeSlabPrior, SQSConfig
from .discrete import DiscretePosterior
from .inference import BayesianAverage, discrete_posteriors, greedy_, sample_, variational_
from .layers import LayerAdapter, SQSLayer, register_layer_type
from .objective import Objective
from .optim import param_groups
from .plain_weights import plain_weights_
from .posterior import SpikeGMMPosterior
from .prepare import is_prepared, posteriors, prepare_, sqs_layers
from .report import CompressionReport, compression_report
from .schedules import GateTemperatureSchedule, PruningSchedule
from .selection import keep_top_fraction

__all__ = [
    "CONFIG_VERSION",
    "BayesianAverage",
    "CompressionReport",
    "DiscretePosterior",
    "GateTemperatureSchedule",
    "GaussianPrior",
    "LayerAdapter",
    "Objective",
    "PruningSchedule",
    "SQSConfig",
    "SQSLayer",
    "SpikeGMMPosterior",
    "SpikeSlabPrior",
    "compression_report",
    "discrete_posteriors",
    "expert_weights",
    "greedy_",
    "is_prepared",
    "keep_top_fraction",
    "load",
    "load_bayesian_average",
    "param_groups",
    "plain_weights_",
    "posteriors",
    "prepare_",
    "register_layer_type",
    "sample_",
    "save",
    "sqs_layers",
    "upgrade",
    "variational_",
]

__version__ = "0.1.0"
