"""Configuration of an SQS compression: frozen, keyword-only dataclasses validated on construction.

Paper symbols: K (``num_components``), τ (``temperature``, eq. compute-phi-k), τ' (``gate_temperature``,
eq. lambda-prime), λ and σ_0 (the spike-and-slab prior, eq. marginal_prior).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch

from ._checks import (
    F32_STD_MAX,
    F32_STD_MIN,
    check_flag,
    check_int,
    check_non_negative,
    check_open_unit,
    check_positive,
)

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
EXECUTION_DEFAULTS = {"compile_kernels": "auto"}


# The posterior computes in float32 (posterior.py): a temperature it divides by must be a normal float32,
# or 1/τ overflows (τ < 2^-126) or τ itself does (τ > FLT_MAX).
_F32 = torch.finfo(torch.float32)
_SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes a uint64


@dataclass(frozen=True, kw_only=True)
class SpikeSlabPrior:
    """π(θ̃) = λ·N(0, σ_0²) + (1 − λ)·δ_0 (eq. marginal_prior): ``keep_prob`` = λ, ``slab_std`` = σ_0."""

    keep_prob: float = 0.5
    slab_std: float = 1.0

    def __post_init__(self) -> None:
        keep = check_open_unit("SpikeSlabPrior.keep_prob", self.keep_prob)
        object.__setattr__(self, "keep_prob", _plain(self.keep_prob, keep))
        object.__setattr__(self, "slab_std", _check_slab_std("SpikeSlabPrior.slab_std", self.slab_std))

    @property
    def kind(self) -> str:
        return "spike_slab"


@dataclass(frozen=True, kw_only=True)
class GaussianPrior:
    """The ablation prior of Appendix "Impact of different priors": π = N(0, σ_0²), with a Gaussian
    "spike" N(0, σ_0²) in place of δ_0 in the variational family (eq. Gaussian prior)."""

    slab_std: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "slab_std", _check_slab_std("GaussianPrior.slab_std", self.slab_std))

    @property
    def kind(self) -> str:
        return "gaussian"


Prior = SpikeSlabPrior | GaussianPrior
_PRIORS: dict[str, type[SpikeSlabPrior] | type[GaussianPrior]] = {
    "spike_slab": SpikeSlabPrior,
    "gaussian": GaussianPrior,
}


@dataclass(frozen=True, kw_only=True)
class SQSConfig:
    """Everything that defines how a model is compressed.

    ``include`` / ``exclude`` are regular expressions matched (``re.search``) against qualified module
    names; ``overrides`` maps a regex to a dict of per-layer settings (keys: ``num_components``,
    ``windows``, ``temperature``, ``responsibility``, ``compile_kernels``, or ``skip=True`` to leave the
    layer dense), kept as a read-only :class:`FrozenMapping` so that a config cannot change after its checks;
    a config hashes and compares by value.

    ``kl_weight`` (β) tempers the KL sum of Ω_apx: loss = NLL + β·KL/num_data. β = 1 is the paper's
    objective taken literally; see docs/method.md for why the default is smaller.
    ``gate_init`` chooses the initial retention logits s̃: ``constant`` puts every λ̃ at
    ``initial_keep_prob``; ``magnitude`` spreads the logits by the within-layer rank of |θ| over
    ``gate_init_spread`` logit units below logit(``initial_keep_prob``), so the first weights the
    pruning schedule removes are the smallest ones.
    ``compile_kernels`` runs the per-weight elementwise work of a training step (gates, the one-hot
    certificate, θ^avg = λ̃ μ_k*, their gradients and the gate KL) as kernels fused by ``torch.compile``
    (sqs_core._fused): faster steps on large layers after compiling once per process (20–35 s with a warm
    inductor cache, minutes on a new machine); needs what inductor needs (a C++ compiler on CPU). Values and
    gradients agree with the eager path to float rounding. ``"auto"`` (the default) compiles the kernels of a
    layer on the CPU with at least ``sqs_core._compiled.AUTO_MIN_WEIGHTS`` (2^20) weights once a probe kernel
    has compiled and run in this process, and runs every other layer eagerly (sqs_core._compiled.use_compiled);
    ``True`` / ``False`` force it on / off for every layer.
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
    compile_kernels: bool | str = "auto"
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        self._validate_shape_settings()
        self._validate_numbers()
        _check_choice("likelihood", self.likelihood, LIKELIHOODS)
        _check_choice("gate_init", self.gate_init, GATE_INITS)
        if not isinstance(self.prior, (SpikeSlabPrior, GaussianPrior)):
            raise ValueError(f"prior must be a SpikeSlabPrior or GaussianPrior, got {self.prior!r}")
        check_flag("train_weight", self.train_weight)
        _check_compile_kernels("compile_kernels", self.compile_kernels)
        if check_int("version", self.version, 0) != CONFIG_VERSION:
            raise ValueError(f"unsupported config version {self.version!r} (this library: {CONFIG_VERSION})")
        object.__setattr__(self, "version", CONFIG_VERSION)
        _check_initial_gate_logits(self.gate_temperature, self.initial_keep_prob, self._spread_used())
        object.__setattr__(self, "include", _compile_patterns("include", self.include))
        object.__setattr__(self, "exclude", _compile_patterns("exclude", self.exclude))
        object.__setattr__(self, "overrides", _validate_overrides(self.overrides))

    def _validate_shape_settings(self) -> None:
        object.__setattr__(self, "num_components", _check_components(self.num_components))
        _check_choice("windows", self.windows, WINDOW_KINDS)
        _check_choice("responsibility", self.responsibility, RESPONSIBILITY_KINDS)

    def _validate_numbers(self) -> None:
        """Checks every numeric field and stores it as a plain Python number (an int stays an int, so
        ``to_dict`` writes what it was given)."""
        values: dict[str, Any] = {
            "temperature": _check_temperature("temperature", self.temperature),
            "gate_temperature": _check_temperature("gate_temperature", self.gate_temperature),
            "kl_weight": _check_non_negative("kl_weight", self.kl_weight),
            "initial_keep_prob": _plain(
                self.initial_keep_prob, check_open_unit("initial_keep_prob", self.initial_keep_prob)
            ),
            "gate_init_spread": _check_non_negative("gate_init_spread", self.gate_init_spread),
            "kmeans_iterations": check_int("kmeans_iterations", self.kmeans_iterations, 1),
            "seed": check_int("seed", self.seed, 0),
        }
        if values["seed"] > _SEED_MAX:
            raise ValueError(f"seed must be an int in [0, 2**64 - 1] (torch.Generator.manual_seed), got {self.seed!r}")
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def _spread_used(self) -> float:
        """How far below logit(initial_keep_prob) the initial gate logits reach (see initial_gate_logits)."""
        return self.gate_init_spread if self.gate_init == "magnitude" else 0.0

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
        """The config ``to_dict`` wrote; a ValueError naming any key it could not have written."""
        if not isinstance(data, Mapping):
            raise ValueError(f"SQSConfig.from_dict needs a mapping, got {data!r} ({type(data).__name__})")
        data = dict(data)
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown SQSConfig fields: {sorted(unknown, key=str)}")
        if "prior" in data:
            data["prior"] = _prior_from_dict(data["prior"])
        return cls(**data)


def _prior_from_dict(data: Any) -> Prior:
    """The prior ``SQSConfig.to_dict`` wrote as ``{"kind": ..., **fields}``."""
    if not isinstance(data, Mapping):
        raise ValueError(f"prior must be a mapping {{'kind': 'spike_slab' | 'gaussian', ...}}, got {data!r}")
    settings = dict(data)
    kind = settings.pop("kind", "spike_slab")
    if kind not in tuple(_PRIORS):
        raise ValueError(f"unknown prior kind {kind!r}; expected 'spike_slab' or 'gaussian'")
    prior_cls = _PRIORS[kind]
    allowed = [f.name for f in fields(prior_cls)]
    unknown = set(settings) - set(allowed)
    if unknown:
        raise ValueError(f"unknown {kind} prior fields: {sorted(unknown, key=str)}; allowed: {allowed}")
    return prior_cls(**settings)


def _plain(value: Any, checked: float) -> float:
    """A checked number as a plain Python number: an integer stays an int (a NumPy float becomes a float)."""
    return int(value) if isinstance(value, numbers.Integral) else checked


def _check_non_negative(name: str, value: Any) -> float:
    return _plain(value, check_non_negative(name, value))


def _check_temperature(name: str, value: Any) -> float:
    """τ or τ' as a plain number. The float32 posterior divides by it (φ = softmax(φ'/τ) with φ' in [0, 1],
    λ̃ = sigmoid(s̃/τ') and ∂λ̃/∂s̃ ∝ 1/τ'), so it must be a normal float32: below 2^-126 1/τ overflows and
    the forward or the gradients turn inf/NaN."""
    out = check_positive(name, value)
    if not _F32.tiny <= out <= _F32.max:
        raise ValueError(
            f"{name} must be a normal float32 number in [{_F32.tiny:.4g}, {_F32.max:.4g}] (the float32 posterior "
            f"divides by it; below that 1/{name} overflows and the forward turns NaN), got {value!r}"
        )
    return _plain(value, out)


def _check_slab_std(name: str, value: Any) -> float:
    """σ_0 as a plain number. The float32 component KL divides by σ_0² (KL(N(μ, σ²)‖N(0, σ_0²)) = log(σ_0/σ) +
    (σ² + μ²)/(2σ_0²) − ½), so σ_0² must be a normal float32: below ~1.1e-19 it rounds to 0 or a subnormal and
    the KL of every weight is inf; above ~1.8e19 it overflows."""
    out = check_positive(name, value)
    if not F32_STD_MIN <= out <= F32_STD_MAX:
        raise ValueError(
            f"{name} must be in [{F32_STD_MIN:.4g}, {F32_STD_MAX:.4g}] so that σ_0² is a normal float32 number "
            f"(the float32 KL divides by it; outside that range every weight's KL is inf), got {value!r}"
        )
    return _plain(value, out)


def _check_initial_gate_logits(gate_temperature: float, initial_keep_prob: float, spread: float) -> None:
    """The initial ℓ = s̃/τ' lie in [logit λ̃_0 − spread, logit λ̃_0] and are computed in float32, then stored as
    s̃ = ℓ·τ' (_posterior_init.initial_gate_logits): both must be finite, or λ̃ and the gate KL turn NaN."""
    top = math.log(initial_keep_prob) - math.log1p(-initial_keep_prob)
    reach = max(abs(top), abs(top - spread))
    if reach * max(1.0, gate_temperature) > _F32.max * (1 - 2.0**-20):  # slack for float32 rounding
        raise ValueError(
            f"gate_temperature={gate_temperature!r} with gate_init_spread={spread!r} overflows float32: the initial "
            f"gate logits ℓ = s̃/τ' span [logit(initial_keep_prob) - gate_init_spread, logit(initial_keep_prob)] "
            f"and s̃ = ℓ·τ' is float32, so max|ℓ|·max(1, τ') must stay <= {_F32.max:.4g}; got max|ℓ| = {reach:.4g}"
        )


def _check_components(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 2 <= int(value) <= 256:
        raise ValueError(f"num_components (K) must be an int in [2, 256], got {value!r}")
    return int(value)


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {choices}")


def _compile_patterns(name: str, patterns: Any) -> tuple[str, ...]:
    """``patterns`` (a regular expression or an iterable of them) as a tuple, each checked to compile."""
    if isinstance(patterns, str):
        patterns = (patterns,)
    if not isinstance(patterns, Iterable) or isinstance(patterns, (bytes, Mapping)):
        raise ValueError(f"{name} must be a regular expression (str) or an iterable of them, got {patterns!r}")
    out = tuple(patterns)
    for pattern in out:
        if not isinstance(pattern, str):
            raise ValueError(f"{name} patterns must be str (regular expressions), got {pattern!r}")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{name} pattern {pattern!r} is not a valid regular expression: {exc}") from None
    return out


class FrozenMapping(Mapping[str, Any]):
    """A read-only, hashable mapping: ``SQSConfig.overrides`` and each of its settings, so that a config stays
    what ``__post_init__`` validated (no override can be added or changed afterwards) and can be hashed like
    the rest of the frozen config. Compares equal to a dict with the same items; picklable and deep-copyable."""

    __slots__ = ("_items",)
    _items: dict[str, Any]

    def __init__(self, items: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_items", dict(items))

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __reduce__(self) -> tuple:
        return (type(self), (self._items,))

    def __repr__(self) -> str:
        return repr(self._items)


def _validate_overrides(overrides: Mapping[str, Mapping[str, Any]]) -> FrozenMapping:
    """The overrides checked, as a :class:`FrozenMapping` of :class:`FrozenMapping` settings."""
    if not isinstance(overrides, Mapping):
        raise ValueError(f"overrides must be a mapping {{regex: {{setting: value}}}}, got {overrides!r}")
    out: dict[str, FrozenMapping] = {}
    for pattern, settings in overrides.items():
        _compile_patterns("overrides", (pattern,))
        if not isinstance(settings, Mapping):
            raise ValueError(f"override for {pattern!r} must be a mapping, got {settings!r}")
        out[pattern] = FrozenMapping(_validate_override(pattern, settings))
    return FrozenMapping(out)


def _validate_override(pattern: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    bad = set(settings) - set(OVERRIDABLE)
    if bad:
        raise ValueError(f"override for {pattern!r} sets {sorted(bad, key=str)}; allowed keys: {OVERRIDABLE}")
    out = dict(settings)
    if "num_components" in out:
        out["num_components"] = _check_components(out["num_components"])
    if "windows" in out:
        _check_choice("windows", out["windows"], WINDOW_KINDS)
    if "responsibility" in out:
        _check_choice("responsibility", out["responsibility"], RESPONSIBILITY_KINDS)
    if "temperature" in out:
        out["temperature"] = _check_temperature("temperature", out["temperature"])
    if "compile_kernels" in out:
        _check_compile_kernels(f"overrides[{pattern!r}]['compile_kernels']", out["compile_kernels"])
    if "skip" in out:
        check_flag(f"overrides[{pattern!r}]['skip']", out["skip"])
    return out


def _check_compile_kernels(name: str, value: Any) -> bool | str:
    """``value`` if it is True, False or ``"auto"`` (not 0/1, not another string), else a ValueError naming ``name``."""
    if isinstance(value, bool) or (isinstance(value, str) and value == "auto"):
        return value
    raise ValueError(f"{name} must be True, False or 'auto', got {value!r}")
