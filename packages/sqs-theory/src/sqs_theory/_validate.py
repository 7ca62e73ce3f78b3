"""Argument checks shared by the public functions: each raises ``ValueError`` naming the parameter and value
(and, through :func:`arguments` or :func:`within`, the function: ``"... (in fit_student)"``).

The checks never alter a valid value (a float stays the same float), except that an integral count given
as a float (``2.0``) is returned as the exact ``int``.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "arguments",
    "at_least_one",
    "count",
    "distinct_counts",
    "finite_array",
    "fraction",
    "probability_array",
    "real",
    "rng",
    "seed",
    "weight_pair",
    "within",
]


def real(name: str, value: Any, *, low: float = -math.inf, high: float = math.inf, strict: bool = False) -> Any:
    """A finite real scalar in ``[low, high]`` (``(low, high)`` when ``strict``); returned unchanged."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value!r}")
    outside = number <= low or number >= high if strict else number < low or number > high
    if outside:
        if high == math.inf:
            where = f"{'>' if strict else '>='} {low:g}"
        else:
            where = f"in {'(' if strict else '['}{low:g}, {high:g}{')' if strict else ']'}"
        raise ValueError(f"{name} must be {where}, got {value!r}")
    return value


def count(name: str, value: Any, *, low: int = 0, high: int | None = None) -> int:
    """An integer ``>= low`` (and ``<= high`` if given; an integral float such as ``2.0`` is accepted and
    returned as ``2``)."""
    if high is not None:
        whole = count(name, value, low=low)
        if whole > high:
            raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
        return whole
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if isinstance(value, numbers.Integral):
        whole = int(value)
    else:
        number = float(value)
        if not (math.isfinite(number) and number.is_integer()):
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        whole = int(number)
    if whole < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return whole


def distinct_counts(name: str, values: Any, *, low: int = 0) -> tuple[int, ...]:
    """A sequence of distinct integers >= low, as a tuple of ints (each checked by :func:`count`)."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a sequence of integers, got {values!r:.80}")
    out = tuple(count(f"{name}[{i}]", v, low=low) for i, v in enumerate(values))
    if len(set(out)) != len(out):
        raise ValueError(f"{name} must be distinct, got {out}")
    return out


def seed(name: str, value: Any) -> int:
    """A seed for ``numpy.random.default_rng``: a non-negative integer."""
    return count(name, value, low=0)


def finite_array(name: str, value: Any, *, positive: bool = False) -> np.ndarray:
    """``value`` as a float array (same conversion as ``np.asarray(value, dtype=float)``), all entries finite
    (and ``> 0`` when ``positive``); complex and non-numeric input is refused, not silently converted."""
    raw = np.asarray(value)
    if np.iscomplexobj(raw):
        raise ValueError(f"{name} must be real, got complex {_first(raw, np.ones(raw.shape, bool))}")
    if raw.dtype.kind not in "biuf":
        try:
            raw = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be real numbers, got {value!r:.80}") from None
    arr = np.asarray(raw, dtype=float)
    bad = ~np.isfinite(arr) | ((arr <= 0) if positive else False)
    if np.any(bad):
        raise ValueError(f"{name} must be {'finite and > 0' if positive else 'finite'}, got {_first(arr, bad)}")
    return arr


def probability_array(name: str, value: Any) -> np.ndarray:
    """``value`` as a float array of probabilities in ``[0, 1]``."""
    arr = finite_array(name, value)
    bad = (arr < 0) | (arr > 1)
    if np.any(bad):
        raise ValueError(f"{name} must be a probability in [0, 1], got {_first(arr, bad)}")
    return arr


def _first(arr: np.ndarray, bad: np.ndarray) -> str:
    """The first flagged entry, with its index when ``arr`` is not a scalar."""
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    value = arr[index].item()
    return f"{value!r} at index {index[0] if len(index) == 1 else index}" if index else repr(value)


def rng(name: str, value: Any) -> np.random.Generator:
    """A ``numpy.random.Generator`` (a seed or the legacy RandomState has other methods: an AttributeError)."""
    if not isinstance(value, np.random.Generator):
        raise ValueError(f"{name} must be a numpy.random.Generator (np.random.default_rng(seed)), got {value!r:.80}")
    return value


def weight_pair(w1: Any, w2: Any, names: tuple[str, str] = ("w1", "w2")) -> tuple[np.ndarray, np.ndarray]:
    """A ``p -> width -> 1`` network's weights as float arrays: finite, w1 a non-empty (width, p) matrix and w2
    (1, width)."""
    w1, w2 = finite_array(names[0], w1), finite_array(names[1], w2)
    if w1.ndim != 2 or w1.size == 0:
        raise ValueError(f"{names[0]} must be a non-empty (width, p) matrix, got shape {w1.shape}")
    if w2.shape != (1, w1.shape[0]):
        raise ValueError(f"{names[1]} must have shape (1, width) = {(1, w1.shape[0])}, got {w2.shape}")
    return w1, w2


def fraction(name: str, value: Any) -> Any:
    """A fraction in (0, 1] (a density of kept weights: 0 keeps nothing); returned unchanged."""
    real(name, value)
    if not 0 < value <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return value


def at_least_one(name: str, value: Any) -> Any:
    """A finite real >= 1 (a sample size n, which need not be an integer); returned unchanged."""
    return real(name, value, low=1.0)


def _short(value: Any, width: int = 80) -> str:
    """``repr(value)``, cut to ``width`` characters (an array or a model can print pages)."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _positives(name: str, values: Iterable[Any]) -> None:
    for value in values:
        real(name, value, low=0.0, strict=True)


@contextmanager
def within(where: str) -> Iterator[None]:
    """Add ``(in where)`` to the message of a ``ValueError`` raised inside the block: the function it came from."""
    try:
        yield
    except ValueError as err:
        raise ValueError(f"{err} (in {where})") from None


_KINDS: dict[str, Callable[[str, Any], Any]] = {
    "real": real,  # a finite real
    "positive": functools.partial(real, low=0.0, strict=True),  # finite, > 0
    "nonnegative": functools.partial(real, low=0.0),  # finite, >= 0
    "probability": functools.partial(real, low=0.0, high=1.0),  # in [0, 1]
    "fraction": fraction,  # in (0, 1]
    "at_least_one": at_least_one,  # a finite real >= 1
    "count": functools.partial(count, low=1),  # an integer >= 1
    "size": count,  # an integer >= 0
    "seed": seed,  # an integer >= 0
    "rng": rng,  # a numpy.random.Generator
    "positives": _positives,  # an iterable of finite reals > 0
    "finite_array": finite_array,  # a float array, every entry finite (returned as the array)
    "positive_array": functools.partial(finite_array, positive=True),  # ... and > 0
}

_F = TypeVar("_F", bound=Callable[..., Any])


def arguments(**kinds: str | Callable[[str, Any], Any]) -> Callable[[_F], _F]:
    """A decorator checking the named arguments (passed or defaulted) before the function runs, each by its kind:
    ``real``, ``positive``, ``nonnegative``, ``probability``, ``fraction`` (in (0, 1]), ``at_least_one`` (a real
    >= 1), ``count`` (an integer >= 1; an integral float is passed on as the int), ``size`` (an integer >= 0,
    likewise), ``seed``, ``rng``, ``positives``, ``finite_array`` and ``positive_array`` (passed on as the float array),
    or a callable ``check(name, value)`` returning the value to pass on (or None to keep it). A failed check's
    message ends with ``(in function)``; a call whose terms leave float64's range is a ValueError naming it."""
    unknown = sorted(kind for kind in kinds.values() if isinstance(kind, str) and kind not in _KINDS)
    if unknown:
        raise ValueError(f"unknown argument kinds {unknown}; known: {sorted(_KINDS)}")
    checks = {name: _KINDS[kind] if isinstance(kind, str) else kind for name, kind in kinds.items()}

    def wrap(fn: _F) -> _F:
        signature = inspect.signature(fn)
        missing = sorted(set(kinds) - set(signature.parameters))
        if missing:
            raise ValueError(f"{fn.__qualname__} has no parameters {missing}")

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            with within(fn.__name__):
                for name, check in checks.items():
                    checked_value = check(name, bound.arguments[name])
                    if checked_value is not None:  # a count given as 2.0 goes on as the int 2
                        bound.arguments[name] = checked_value
            try:
                return fn(*bound.args, **bound.kwargs)
            except (OverflowError, ZeroDivisionError) as err:  # valid arguments whose terms leave float64
                given = ", ".join(f"{k}={_short(v)}" for k, v in bound.arguments.items())
                raise ValueError(f"{fn.__name__}({given}) leaves float64's range ({err})") from err

        return checked  # type: ignore[return-value]

    return wrap
