"""Argument checks shared by the public functions: each raises ``ValueError`` naming the parameter and value.

The checks never alter a valid value (a float stays the same float), except that an integral count given
as a float (``2.0``) is returned as the exact ``int``.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np

__all__ = ["arguments", "count", "finite_array", "probability_array", "real", "seed"]


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


def count(name: str, value: Any, *, low: int = 0) -> int:
    """An integer ``>= low`` (an integral float such as ``2.0`` is accepted and returned as ``2``)."""
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


def _positives(name: str, values: Iterable[Any]) -> None:
    for value in values:
        real(name, value, low=0.0, strict=True)


_KINDS: dict[str, Callable[[str, Any], Any]] = {
    "real": real,  # a finite real
    "positive": functools.partial(real, low=0.0, strict=True),  # finite, > 0
    "nonnegative": functools.partial(real, low=0.0),  # finite, >= 0
    "probability": functools.partial(real, low=0.0, high=1.0),  # in [0, 1]
    "count": functools.partial(count, low=1),  # an integer >= 1
    "seed": seed,  # an integer >= 0
    "positives": _positives,  # an iterable of finite reals > 0
}

_F = TypeVar("_F", bound=Callable[..., Any])


def arguments(**kinds: str) -> Callable[[_F], _F]:
    """A decorator checking the named arguments (passed or defaulted) before the function runs, each by its kind:
    ``real``, ``positive``, ``nonnegative``, ``probability``, ``count`` (an integer >= 1; an integral float is
    passed on as the int), ``seed``, ``positives``; and naming the call where its terms leave float64's range."""
    unknown = sorted(set(kinds.values()) - set(_KINDS))
    if unknown:
        raise ValueError(f"unknown argument kinds {unknown}; known: {sorted(_KINDS)}")

    def wrap(fn: _F) -> _F:
        signature = inspect.signature(fn)
        missing = sorted(set(kinds) - set(signature.parameters))
        if missing:
            raise ValueError(f"{fn.__qualname__} has no parameters {missing}")

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            for name, kind in kinds.items():
                checked_value = _KINDS[kind](name, bound.arguments[name])
                if checked_value is not None:  # a count given as 2.0 goes on as the int 2
                    bound.arguments[name] = checked_value
            try:
                return fn(*bound.args, **bound.kwargs)
            except (OverflowError, ZeroDivisionError) as err:  # valid arguments whose terms leave float64
                given = ", ".join(f"{k}={v!r}" for k, v in bound.arguments.items())
                raise ValueError(f"{fn.__name__}({given}) leaves float64's range ({err})") from err

        return checked  # type: ignore[return-value]

    return wrap
