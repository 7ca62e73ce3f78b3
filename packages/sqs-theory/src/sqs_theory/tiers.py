"""The sizes of the convergence study: a ``Tier`` (a frozen, versioned config with a dict round trip) and
the three named ones, ``tiny`` (the tests), ``quick`` (``nox -s theory``) and ``full`` (the committed run)."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields

from . import _validate as check
from .synthetic import check_teacher_shape

__all__ = ["MAX_THREADS", "MIN_N", "TIERS", "TIER_VERSION", "Tier", "check_threads", "get_tier", "torch_seed_of"]

TIER_VERSION = 1
MIN_N = 8  # the smallest n of a tier
MAX_THREADS = 1024  # a fixed bound (not a multiple of this machine's cores: the CLI's answer must not vary)


def check_threads(name: str, value: object) -> int:
    """A torch thread count in [1, MAX_THREADS] (2**31 had been torch's "Overflow when unpacking long")."""
    return check.count(name, value, low=1, high=MAX_THREADS)


def torch_seed_of(n: int, seed: int) -> int:
    """The torch seed 10 000·seed + n of a fit, which must fit in int64."""
    value = 10_000 * seed + n
    if value >= 2**63:
        raise ValueError(f"seed={seed!r} with n={n!r} makes the torch seed 10000·seed + n = {value} >= 2**63")
    return value


@dataclass(frozen=True, kw_only=True)
class Tier:
    """One size of the study; ``ablation_ns`` / ``default_ns``: the n at which the ablations also run."""

    name: str
    ns: tuple[int, ...]
    seeds: tuple[int, ...]
    ablation_ns: tuple[int, ...] = ()
    default_ns: tuple[int, ...] = ()
    steps: int = 500
    fp_restarts: int = 4
    fp_max_iter: int = 500
    projection_starts: int = 10
    check_ns: tuple[int, ...] = ()  # n at which seed seeds[0] is refitted with check_factor × steps
    check_factor: int = 3
    draws: int = 16  # M posterior draws
    n_test: int = 8192
    p: int = 4
    width: int = 6
    sigma: float = 0.1
    init_noise: float = 0.3
    quant_lr: float = 2e-3
    gate_lr: float = 6e-4
    gate_logit: float = 20.0
    delta: float = 1.5
    teacher_seed: int = 1234
    test_seed: int = 99
    version: int = TIER_VERSION

    def __post_init__(self) -> None:
        with check.within("Tier"):
            if not isinstance(self.name, str) or not self.name:
                raise ValueError(f"name must be a non-empty string, got {self.name!r}")
            for key in ("ns", "seeds", "ablation_ns", "default_ns", "check_ns"):
                # int(2.5) had made an n of 2; a repeated seed counted its fits twice
                object.__setattr__(
                    self, key, check.distinct_counts(key, getattr(self, key), low=0 if key == "seeds" else MIN_N)
                )
            if not self.ns or not self.seeds:
                raise ValueError(f"need at least one n >= {MIN_N} and one seed, got ns={self.ns}, seeds={self.seeds}")
            for key in ("ablation_ns", "default_ns", "check_ns"):  # check_ns outside ns was a StopIteration
                if not set(getattr(self, key)) <= set(self.ns):
                    raise ValueError(f"{key} must be a subset of ns={self.ns}, got {getattr(self, key)}")
            torch_seed_of(max(self.ns), max(self.seeds))
            for key in ("steps", "fp_restarts", "fp_max_iter", "projection_starts", "check_factor", "n_test", "p",
                        "width"):  # fmt: skip
                object.__setattr__(self, key, check.count(key, getattr(self, key), low=1))
            # a standard error over the M draws needs two of them
            object.__setattr__(self, "draws", check.count("draws", self.draws, low=2))
            check_teacher_shape(self.p, self.width)
            for key in ("sigma", "quant_lr", "gate_lr", "gate_logit", "delta"):
                check.real(key, getattr(self, key), low=0.0, strict=True)
            check.real("init_noise", self.init_noise, low=0.0)
            for key in ("teacher_seed", "test_seed"):
                object.__setattr__(self, key, check.seed(key, getattr(self, key)))
            if self.version != TIER_VERSION:
                raise ValueError(f"unsupported tier version {self.version!r} (this library: {TIER_VERSION})")

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> Tier:
        if not isinstance(data, dict):
            raise ValueError(f"a Tier dict must be a dict, got {type(data).__name__}")
        unknown = set(data) - {f.name for f in fields(cls)}
        missing = {f.name for f in fields(cls) if f.default is MISSING} - set(data)
        if unknown or missing:
            raise ValueError(f"unknown Tier fields: {sorted(unknown)}; missing: {sorted(missing)}")
        return cls(**data)


TIERS = {
    "tiny": Tier(name="tiny", ns=(64, 256), seeds=(0,), ablation_ns=(64,), default_ns=(64,), steps=40,
                 fp_restarts=1, fp_max_iter=100, draws=2, n_test=512),
    "quick": Tier(name="quick", ns=(64, 256, 1024, 4096), seeds=(0, 1), ablation_ns=(1024,),
                  default_ns=(1024,), steps=400, fp_restarts=3, draws=8, n_test=4096),
    "full": Tier(name="full", ns=(64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384), seeds=tuple(range(10)),
                 ablation_ns=(256, 1024, 4096, 16384), default_ns=(256, 1024, 4096, 16384),
                 check_ns=(256, 4096, 16384), steps=1000, draws=32, n_test=16384),
}  # fmt: skip


def get_tier(tier: Tier | str) -> Tier:
    if isinstance(tier, Tier):
        return tier
    if isinstance(tier, str) and tier in TIERS:
        return TIERS[tier]
    raise ValueError(f"tier must be a Tier or one of {sorted(TIERS)}, got {tier!r}")
