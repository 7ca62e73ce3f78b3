"""The moment-matched likelihood's noise (sqs_core.layers), safe in float16.

In moment-matched training a layer linear in its weight returns out + sqrt(Var[out])·ε, Var[out] =
forward_no_bias(x², Var_q) (local reparameterisation; docs/method.md), and a layer that is not draws its weight,
θ^avg + sqrt(Var_q)·ε. Both ran in the layer's dtype, or in autocast's. In float16 (a float16 layer, or any layer
under float16 autocast) that went wrong twice:

* the floor of sqrt(max(v, 1e-12)) rounds to 0 in float16, so where v = 0 (a weight the pruning schedule has
  removed, or a row whose inputs are all 0) sqrt's gradient was inf and 0·inf a NaN in every posterior gradient
  of the layer: a finite loss, NaN parameters after the step (under a GradScaler, a step skipped every time);
* x² overflows float16 once |x| > 256, so an activation of moderate size made Var[out] inf; and ∂/∂Var_q,
  which is x²/(2 sqrt(Var[out])) per unit of the output's gradient, overflows float16 where Var[out] is small.

So in float16 the variance map and its square root run in float32 (autocast off for them) from the posterior's
float32 Var_q, and only the standard deviation is rounded to the output's dtype. Float32, float64 and bfloat16
(whose range is float32's) compute as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._autocast import _autocast_on, without_autocast

__all__: list[str] = []  # used by sqs_core.layers

VARIANCE_FLOOR = 1e-12
"""The smallest variance whose square root is taken: sqrt's gradient stays finite (at most 5·10^5)."""


def noise_std(var: torch.Tensor) -> torch.Tensor:
    """sqrt(max(var, 10^-12)) in ``var``'s dtype, computed in float32 or wider."""
    wide = var if var.dtype in (torch.float32, torch.float64) else var.float()
    return wide.clamp_min(VARIANCE_FLOOR).sqrt().to(var.dtype)


def weight_noise_std(var: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The drawn weight's standard deviation sqrt(Var_q) in ``dtype`` from the posterior's ``var``: 0 where the
    variance is 0 (a pruned weight stays 0), its gradient finite there."""
    return torch.where(var > 0, noise_std(var), 0.0).to(dtype)


def _in_float16(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether a layer of ``dtype`` maps ``x`` in float16: either is float16, or float16 autocast is on."""
    if torch.float16 in (x.dtype, dtype):
        return True
    device_type = x.device.type
    return _autocast_on(device_type) and torch.get_autocast_dtype(device_type) == torch.float16


@without_autocast
def _float32_variance(
    forward_no_bias: Callable[..., torch.Tensor],
    module: torch.nn.Module,
    x: torch.Tensor,
    var: torch.Tensor,
    square_input: bool,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """Var[out] in the posterior's dtype (float32, or float64), autocast off."""
    if square_input:
        x = x.to(var.dtype)
        x = x * x
    return forward_no_bias(module, x, var, *args, **kwargs)


def output_std(
    forward_no_bias: Callable[..., torch.Tensor],
    module: torch.nn.Module,
    x: torch.Tensor,
    var: torch.Tensor,
    dtype: torch.dtype,
    square_input: bool,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """sqrt(Var[out]) = sqrt(forward_no_bias(x², Var_q)) (``x`` itself for a lookup, ``square_input`` False) of a
    layer of ``dtype`` from the posterior's ``var``: in ``dtype`` (or autocast's), or in float32 where the layer maps in
    float16 (module docstring; the caller rounds it to the output's dtype)."""
    if not _in_float16(x, dtype):
        var_input = x * x if square_input else x
        return noise_std(forward_no_bias(module, var_input, var.to(dtype), *args, **kwargs))
    return noise_std(_float32_variance(forward_no_bias, module, x, var, square_input, *args, **kwargs))
