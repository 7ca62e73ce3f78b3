"""Hypothesis strategies shared by the test packages."""

from __future__ import annotations

from hypothesis import strategies as st

finite_floats = st.floats(min_value=-3.0, max_value=3.0, allow_nan=False, allow_infinity=False)
stds = st.floats(min_value=0.05, max_value=3.0)
log_stds = st.floats(min_value=-3.0, max_value=1.0)
probabilities = st.floats(min_value=1e-4, max_value=1 - 1e-4)
components = st.integers(min_value=2, max_value=8)
window_kinds = st.sampled_from(["none", "equal", "outlier"])
responsibility_kinds = st.sampled_from(["paper", "standard"])
nonzero_rates = st.floats(min_value=0.01, max_value=1.0)


@st.composite
def weight_vectors(draw, min_size: int = 1, max_size: int = 300):
    """Float lists that look like layer weights, sometimes with outliers and repeated values."""
    n = draw(st.integers(min_size, max_size))
    base = draw(st.lists(st.floats(-1, 1, allow_nan=False), min_size=n, max_size=n))
    if draw(st.booleans()) and n > 2:
        base[0] = draw(st.floats(5, 50)) * draw(st.sampled_from([-1, 1]))
    if draw(st.booleans()) and n > 3:
        base[1] = base[2] = base[3]
    return base
