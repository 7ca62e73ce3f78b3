"""The functional forms of the layer types sqs-core supports out of the box (sqs_core.layers registers them):
each runs a module with a given weight, ``forward(base, x, weight, ...)``, as :class:`sqs_core.layers.LayerAdapter`
describes; and the parameter names of the types with several compressed weights. (sqs_core.layers re-exports them
under their old names, so that a model prepared and pickled before they moved here still loads.)"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _linear(base: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight, base.bias)


def _linear_no_bias(base: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)


def _conv(base: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return base._conv_forward(x, weight, base.bias)


def _conv_no_bias(base: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return base._conv_forward(x, weight, None)


_CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _conv_transpose(base: Any, x: torch.Tensor, weight: torch.Tensor, output_size=None, *, bias=None) -> torch.Tensor:
    """nn.ConvTranspose1d/2d/3d's forward with ``weight`` (and its ``output_size`` argument)."""
    if base.padding_mode != "zeros":
        raise ValueError(f"Only `zeros` padding mode is supported for {type(base).__name__}")
    dims = weight.dim() - 2
    stride, padding, dilation = base.stride, base.padding, base.dilation
    output_padding = base._output_padding(x, output_size, stride, padding, base.kernel_size, dims, dilation)
    return _CONV_TRANSPOSE[dims](x, weight, bias, stride, padding, output_padding, base.groups, dilation)


def _conv_transpose_with_bias(base: Any, x: torch.Tensor, weight: torch.Tensor, output_size=None) -> torch.Tensor:
    return _conv_transpose(base, x, weight, output_size, bias=base.bias)


def _conv1d_hf(base: Any, x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """transformers' Conv1D: y = x W + b with W of shape (in, out)."""
    out_shape = (*x.shape[:-1], weight.shape[1])
    flat = x.reshape(-1, x.shape[-1])
    y = flat @ weight if bias is None else torch.addmm(bias, flat, weight)
    return y.reshape(out_shape)


def _conv1d_hf_with_bias(base: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return _conv1d_hf(base, x, weight, base.bias)


def _embedding(base: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.embedding(x, weight, base.padding_idx, base.max_norm, base.norm_type, base.scale_grad_by_freq, base.sparse)


def renormalises_rows(module: nn.Module) -> bool:
    """Whether ``module`` is an nn.Embedding with ``max_norm``: its lookup rescales each row it reads to at most
    max_norm, which is not linear in the weight, so the moment-matched likelihood draws the weight for it (the
    variance path, the same lookup of Var_q, rescaled the variance instead: outputs far beyond max_norm)."""
    return isinstance(module, nn.Embedding) and module.max_norm is not None


def _attention_weights(module: nn.Module) -> tuple[str, ...]:
    """nn.MultiheadAttention's projection weights: one (3E, E) ``in_proj_weight``, or three when kdim/vdim ≠ E."""
    if module._qkv_same_embed_dim:
        return ("in_proj_weight",)
    return ("q_proj_weight", "k_proj_weight", "v_proj_weight")


def _recurrent_weights(module: nn.Module) -> tuple[str, ...]:
    """nn.RNN/LSTM/GRU's weight matrices (``weight_ih_l0``, ``weight_hh_l0``, an LSTM's ``weight_hr_l0``, the
    ``_reverse`` ones), not the biases."""
    names: list[str] = module._flat_weights_names  # type: ignore[assignment]  # RNNBase's list of names
    return tuple(name for name in names if name.startswith("weight_"))


# module-level functions, not lambdas, so that a prepared model pickles (torch.save(model))
