"""Configuration of an SQS compression: frozen, keyword-only dataclasses validated on construction.

Paper symbols: K (``num_components``), τ (``temperature``, eq. compute-phi-k), τ' (``gate_temperature``,
eq. lambda-prime), λ and σ_0 (the spike-and-slab prior, eq. marginal_prior).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

__all__ = ["CONFIG_VERSION", "GaussianPrior", "SQSConfig", "SpikeSlabPrior"]

CONFIG_VERSION = 1

WINDOW_KINDS = ("none", "equal", "outlier")
RESPONSIBILITY_KINDS = ("paper", "standard")
LIKELIHOODS = ("plugin", "moment_matched")
GATE_INITS = ("constant", "magnitude")
# Keys a per-layer override may set (everything that can differ between layers).
OVERRIDABLE = ("num_components", "windows", "temperature", "responsibility", "compile_kernels", "skip")
# How training runs, not what it produces: to_dict writes these only when they differ from the default,
# so configs (and artifact headers) written without them stay byte-identical.
EXECUTION_DEFAULTS = {"compile_kernels": False}


def _check_positive(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _check_open_unit(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must lie in the open interval (0, 1), got {value!r}")


@dataclass(frozen=True, kw_only=True)
class SpikeSlabPrior:
    """π(θ̃) = λ·N(0, σ_0²) + (1 − λ)·δ_0 (eq. marginal_prior): ``keep_prob`` = λ, ``slab_std`` = σ_0."""

    keep_prob: float = 0.5
    slab_std: float = 1.0

    def __post_init__(self) -> None:
        _check_open_unit("SpikeSlabPrior.keep_prob", self.keep_prob)
        _check_positive("SpikeSlabPrior.slab_std", self.slab_std)

    @property
    def kind(self) -> str:
        return "spike_slab"


@dataclass(frozen=True, kw_only=True)
class GaussianPrior:
    """The ablation prior of Appendix "Impact of different priors": π = N(0, σ_0²), with a Gaussian
    "spike" N(0, σ_0²) in place of δ_0 in the variational family (eq. Gaussian prior)."""

    slab_std: float = 1.0

    def __post_init__(self) -> None:
        _check_positive("GaussianPrior.slab_std", self.slab_std)

    @property
    def kind(self) -> str:
        return "gaussian"


Prior = SpikeSlabPrior | GaussianPrior


@dataclass(frozen=True, kw_only=True)
class SQSConfig:
    """Everything that defines how a model is compressed.

    ``include`` / ``exclude`` are regular expressions matched (``re.search``) against qualified module
    names; ``overrides`` maps a regex to a dict of per-layer settings (keys: ``num_components``,
    ``windows``, ``temperature``, ``responsibility``, ``compile_kernels``, or ``skip=True`` to leave the
    layer dense).

    ``kl_weight`` (β) tempers the KL sum of Ω_apx: loss = NLL + β·KL/num_data. β = 1 is the paper's
    objective taken literally; see docs/method.md for why the default is smaller.
    ``gate_init`` chooses the initial retention logits s̃: ``constant`` puts every λ̃ at
    ``initial_keep_prob``; ``magnitude`` spreads the logits by the within-layer rank of |θ| over
    ``gate_init_spread`` logit units below logit(``initial_keep_prob``), so the first weights the
    pruning schedule removes are the smallest ones.
    ``compile_kernels`` runs the per-weight elementwise work of a training step (gates, the one-hot
    certificate, θ^avg = λ̃ μ_k*, their gradients and the gate KL) as kernels fused by ``torch.compile``
    (sqs_core._fused): faster steps on large layers after compiling once (tens of seconds on a new machine,
    seconds per process once inductor has cached the kernels); needs what inductor needs (a C++ compiler
    on CPU). Values and gradients agree with the default eager path to float rounding.
    """

    num_components: int = 4
    windows: str = "outlier"
    prior: Prior = field(default_factory=SpikeSlabPrior)
    temperature: float = 5e-4
    gate_temperature: float = 0.0125
    responsibility: str = "paper"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    train_weight: bool = False
    likelihood: str = "plugin"
    kl_weight: float = 1e-3
    gate_init: str = "magnitude"
    initial_keep_prob: float = 0.9933071490757153  # sigmoid(5): s̃ = 5τ' as in the authors' code
    gate_init_spread: float = 2.0
    kmeans_iterations: int = 30
    seed: int = 0
    compile_kernels: bool = False
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        self._validate_shape_settings()
        _check_positive("temperature", self.temperature)
        _check_positive("gate_temperature", self.gate_temperature)
        if not isinstance(self.kl_weight, (int, float)) or not (math.isfinite(self.kl_weight) and self.kl_weight >= 0):
            raise ValueError(f"kl_weight must be a finite number >= 0, got {self.kl_weight!r}")
        _check_open_unit("initial_keep_prob", self.initial_keep_prob)
        if not math.isfinite(self.gate_init_spread) or self.gate_init_spread < 0:
            raise ValueError(f"gate_init_spread must be finite and >= 0, got {self.gate_init_spread!r}")
        _check_choice("likelihood", self.likelihood, LIKELIHOODS)
        _check_choice("gate_init", self.gate_init, GATE_INITS)
        if not isinstance(self.prior, (SpikeSlabPrior, GaussianPrior)):
            raise ValueError(f"prior must be a SpikeSlabPrior or GaussianPrior, got {self.prior!r}")
        if not isinstance(self.kmeans_iterations, int) or self.kmeans_iterations < 1:
            raise ValueError(f"kmeans_iterations must be an int >= 1, got {self.kmeans_iterations!r}")
        _check_bool("compile_kernels", self.compile_kernels)
        if self.version != CONFIG_VERSION:
            raise ValueError(f"unsupported config version {self.version!r} (this library: {CONFIG_VERSION})")
        object.__setattr__(self, "include", _compile_patterns("include", self.include))
        object.__setattr__(self, "exclude", _compile_patterns("exclude", self.exclude))
        object.__setattr__(self, "overrides", _validate_overrides(self.overrides))

    def _validate_shape_settings(self) -> None:
        _check_components(self.num_components)
        _check_choice("windows", self.windows, WINDOW_KINDS)
        _check_choice("responsibility", self.responsibility, RESPONSIBILITY_KINDS)

    def for_layer(self, name: str) -> SQSConfig | None:
        """The effective config of the layer ``name`` after overrides, or None if it is skipped."""
        settings: dict[str, Any] = {}
        for pattern, override in self.overrides.items():
            if re.search(pattern, name):
                settings.update(override)
        if settings.pop("skip", False):
            return None
        return replace(self, **settings) if settings else self

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict; ``SQSConfig.from_dict`` inverts it."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "prior"}
        for name, default in EXECUTION_DEFAULTS.items():
            if out[name] == default:
                del out[name]
        out["include"] = list(self.include)
        out["exclude"] = list(self.exclude)
        out["overrides"] = {k: dict(v) for k, v in self.overrides.items()}
        out["prior"] = {"kind": self.prior.kind, **asdict(self.prior)}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SQSConfig:
        data = dict(data)
        prior = dict(data.pop("prior", {"kind": "spike_slab"}))
        kind = prior.pop("kind", "spike_slab")
        if kind == "spike_slab":
            data["prior"] = SpikeSlabPrior(**prior)
        elif kind == "gaussian":
            data["prior"] = GaussianPrior(**prior)
        else:
            raise ValueError(f"unknown prior kind {kind!r}; expected 'spike_slab' or 'gaussian'")
        data["include"] = tuple(data.get("include", ()))
        data["exclude"] = tuple(data.get("exclude", ()))
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown SQSConfig fields: {sorted(unknown)}")
        return cls(**data)


def _check_components(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= 256:
        raise ValueError(f"num_components (K) must be an int in [2, 256], got {value!r}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {choices}")


def _compile_patterns(name: str, patterns: Any) -> tuple[str, ...]:
    if isinstance(patterns, str):
        patterns = (patterns,)
    out = tuple(patterns)
    for pattern in out:
        try:
            re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise ValueError(f"{name} pattern {pattern!r} is not a valid regular expression: {exc}") from None
    return out


def _validate_overrides(overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    if not isinstance(overrides, Mapping):
        raise ValueError(f"overrides must be a mapping {{regex: {{setting: value}}}}, got {overrides!r}")
    out: dict[str, dict[str, Any]] = {}
    for pattern, settings in overrides.items():
        _compile_patterns("overrides", (pattern,))
        if not isinstance(settings, Mapping):
            raise ValueError(f"override for {pattern!r} must be a mapping, got {settings!r}")
        bad = set(settings) - set(OVERRIDABLE)
        if bad:
            raise ValueError(f"override for {pattern!r} sets {sorted(bad)}; allowed keys: {OVERRIDABLE}")
        if "num_components" in settings:
            _check_components(settings["num_components"])
        if "windows" in settings:
            _check_choice("windows", settings["windows"], WINDOW_KINDS)
        if "responsibility" in settings:
            _check_choice("responsibility", settings["responsibility"], RESPONSIBILITY_KINDS)
        if "temperature" in settings:
            _check_positive("temperature", settings["temperature"])
        if "compile_kernels" in settings:
            _check_bool("compile_kernels", settings["compile_kernels"])
        out[pattern] = dict(settings)
    return out
