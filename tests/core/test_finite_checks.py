"""_checks.all_finite and has_nan (one aminmax pass) against torch.isfinite / torch.isnan."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sqs_core._checks import all_finite, has_nan

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@settings(max_examples=80)
@given(
    size=st.integers(0, 300),
    dtype=st.sampled_from(DTYPES),
    specials=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from([math.nan, math.inf, -math.inf]))),
    transposed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_they_agree_with_isfinite_and_isnan(size, dtype, specials, transposed, seed):
    values = torch.randn(size, generator=torch.Generator().manual_seed(seed)).to(dtype)
    for at, value in specials if size else []:
        values[int(at * size)] = value
    if transposed and size % 3 == 0 and size:  # a non-contiguous view
        values = values.reshape(3, -1).t()
    assert all_finite(values) == bool(torch.isfinite(values).all())
    assert has_nan(values) == bool(torch.isnan(values).any())


@pytest.mark.parametrize("size", [1 << 20, (1 << 20) + 13])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_one_special_value_in_a_long_tensor_is_found_wherever_it_sits(size, value):
    values = torch.randn(size)
    for at in (0, 17, size // 2, size - 1):  # vectorised reductions: the head, a lane, the middle, the tail
        probe = values.clone()
        probe[at] = value
        assert not all_finite(probe)
        assert has_nan(probe) == math.isnan(value)
    assert all_finite(values) and not has_nan(values)


def test_integer_bool_and_empty_tensors_are_finite():
    for tensor in (torch.arange(5), torch.ones(3, dtype=torch.bool), torch.empty(0), torch.empty(0, 4)):
        assert all_finite(tensor) and not has_nan(tensor)
