"""jsonable: what the studies write is valid strict JSON and keeps every finite number."""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from sqs_theory._json import jsonable

scalars = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(allow_nan=True, allow_infinity=True, width=32).map(np.float32),
    st.integers(-(2**62), 2**62).map(np.int64),
    st.integers(),
    st.booleans().map(np.bool_),
    st.none(),
    st.text(max_size=5),
)
trees = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers()), inner, max_size=4),
    ),
    max_leaves=20,
)


def _same(original, written, non_finite) -> bool:
    if isinstance(original, dict):
        return list(written) == [str(k) for k in original] and all(
            _same(v, written[str(k)], non_finite) for k, v in original.items()
        )
    if isinstance(original, list | tuple):
        if len(written) != len(original):
            return False
        return all(_same(a, b, non_finite) for a, b in zip(original, written, strict=True))
    if isinstance(original, float | np.floating) and not math.isfinite(original):
        return written == non_finite(float(original))
    return written == original and type(written) in (bool, int, float, str, type(None))


@given(trees)
def test_strict_json_keeps_finite_values(tree):
    for non_finite in (lambda _: None, str):
        written = json.loads(json.dumps(jsonable(tree, non_finite), allow_nan=False))
        assert _same(tree, written, non_finite)
