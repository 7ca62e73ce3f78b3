"""SQS layers: a wrapper keeps the original module (``base_layer``) and computes its weight from the posterior.

Modes:
* ``variational`` (after ``prepare_``): training forward with θ^avg (plug-in, eq. approx_elbo) or, with
  ``likelihood="moment_matched"`` in training mode, a local-reparameterisation sample of the output
  (mean from θ^avg, variance from Var_q(θ̃)), an estimate of E_q[NLL] rather than the plug-in; a module whose
  output is not linear in its weight (attention's in_proj) draws the weight instead, θ^avg + sqrt(Var_q)·ε.
  In eval mode the variational forward uses θ^avg without noise.
* ``fixed``: a concrete sparse quantized weight (greedy or a posterior draw) set by sqs_core.inference.

A registry maps module types to adapters (how to run the module with a given weight), so users can add
their own layer types with :func:`register_layer_type`.
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ._adapters import (  # also the old names, which pickles of models prepared before they moved refer to
    _attention_weights,
    _conv,
    _conv1d_hf,
    _conv1d_hf_with_bias,
    _conv_no_bias,
    _conv_transpose,
    _conv_transpose_with_bias,
    _embedding,
    _linear,
    _linear_no_bias,
    _recurrent_weights,
    renormalises_rows,
)
from ._experts import expert_weights, is_fused_experts
from ._hooks import refuse_bypassed_hooks
from ._noise import output_std, weight_noise_std
from ._subclass_forward import NOT_DEFINED, call_substituted, defined_below, defines_forward, substituting
from .posterior import SpikeGMMPosterior

log = logging.getLogger(__name__)

__all__ = [
    "LayerAdapter",
    "SQSLayer",
    "adapter_for",
    "compressed_names",
    "own_forward",
    "parameter_adapter",
    "register_layer_type",
    "substituted_forward",
]


@dataclass(frozen=True)
class LayerAdapter:
    """``forward(base, x, weight, *args, **kwargs)`` runs the module with ``weight`` (bias included; the layer's
    call passes on any arguments after ``x``); ``forward_no_bias`` the same linear map without bias (for the
    variance path of the moment-matched likelihood), or None for a module whose output is not linear in its
    weight (attention): that likelihood then draws the weight itself, θ^avg + sqrt(Var_q)·ε.
    ``square_input``: the variance path maps x² (linear maps); False for lookups (embeddings), whose
    output variance is the looked-up weight variance.
    ``weight_name``: the parameter SQS compresses; the SQS layer answers it with its current weight.
    ``weight_names``: instead, a function giving a module's compressed parameters (nn.MultiheadAttention's
    ``in_proj_weight`` or its q/k/v weights, an nn.LSTM's ``weight_ih_l0``, ...): each gets a posterior and an SQS
    layer of its own, nested around the module, and the module's own forward runs with every one substituted
    (:func:`substituted_forward`; ``forward`` and ``forward_no_bias`` are not used, the moment-matched
    likelihood draws the weights). ``passes``: private attributes or methods of the wrapped module that model
    code reads on the layer and that do not depend on the weight (nn.TransformerEncoderLayer's fast path reads
    ``self_attn._qkv_same_embed_dim`` and calls ``self_attn.merge_masks``)."""

    forward: Callable[..., Any] | None  # (base, x, weight, *args, **kwargs); base: the wrapped module
    forward_no_bias: Callable[..., torch.Tensor] | None
    square_input: bool = True
    weight_name: str = "weight"
    passes: frozenset[str] = frozenset()
    weight_names: Callable[[nn.Module], tuple[str, ...]] | None = None


def substituted_forward(name: str, base: Any, x: Any, weight: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """The wrapped module's own forward (nn.MultiheadAttention's masks, ``batch_first`` and fast path; an LSTM's
    flat weights) with ``weight`` as its parameter ``name`` and, through the SQS layers nested inside ``base`` (one
    per further compressed parameter of the module), each one's :meth:`SQSLayer.forward_weight`.
    ``torch.func.functional_call`` substitutes the tensors for this call. (A submodule compressed as a layer of its
    own, such as the attention's ``out_proj``, is read through it: SQSLayer.weight.)"""
    base, weights = _substitutes(name, base, weight)
    if isinstance(base, nn.RNNBase) or torch.jit.is_tracing():  # an RNN's flat weights, a trace: call_substituted
        return call_substituted(base, "forward", False, weights, (x, *args), kwargs)
    return torch.func.functional_call(base, weights, (x, *args), kwargs)


def _substitutes(name: str, base: Any, weight: torch.Tensor) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """(the innermost wrapped module, {its parameter name: the weight to compute with}) for an SQS layer that
    compresses ``base``'s parameter ``name`` and computes with ``weight``, and for every SQS layer inside it."""
    nested, innermost = _nested_layers(base)
    weights = {name: weight, **{layer.adapter.weight_name: layer.forward_weight() for layer in nested}}
    return innermost, weights


def _nested_layers(base: nn.Module) -> tuple[list[SQSLayer], nn.Module]:
    """(the SQS layers nested from ``base`` inwards, the module innermost): ``base`` itself where it is none."""
    nested: list[SQSLayer] = []
    while isinstance(base, SQSLayer):
        nested.append(base)
        base = base.base_layer
    return nested, base


def _call_substituted(layer: SQSLayer, method: str, read: bool, *args: Any, **kwargs: Any) -> Any:
    """The wrapped module's own ``method`` called (or property read) with the layer's weights substituted."""
    base, weights = _substitutes(layer.adapter.weight_name, layer.base_layer, layer.forward_weight())
    return call_substituted(base, method, read, weights, args, kwargs)


def _subclass_attribute(layer: SQSLayer, name: str) -> Any:
    """``layer.name`` for an attribute a subclass of the registered type defines (sqs_core._subclass_forward): a
    method runs, a property is read, with the compressed weights substituted; a static or class method or a
    constant is the subclass's own. ``NOT_DEFINED`` for any other name."""
    base = _nested_layers(layer.base_layer)[1]
    found = defined_below(base, _registered_type(base), name)
    if found is NOT_DEFINED or name == "forward":
        return NOT_DEFINED
    if isinstance(found, property):
        return _call_substituted(layer, name, True)
    if isinstance(found, types.FunctionType):
        return functools.partial(_call_substituted, layer, name, False)
    return getattr(base, name)


# module-level functions (sqs_core._adapters), not lambdas, so that a prepared model pickles (torch.save(model))
_REGISTRY: dict[type, LayerAdapter] = {
    nn.Linear: LayerAdapter(forward=_linear, forward_no_bias=_linear_no_bias),
    nn.Embedding: LayerAdapter(forward=_embedding, forward_no_bias=_embedding, square_input=False),
}
for _conv_type in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
    _REGISTRY[_conv_type] = LayerAdapter(forward=_conv, forward_no_bias=_conv_no_bias)
for _transposed_type in (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d):
    _REGISTRY[_transposed_type] = LayerAdapter(forward=_conv_transpose_with_bias, forward_no_bias=_conv_transpose)
_REGISTRY[nn.MultiheadAttention] = LayerAdapter(
    forward=None,
    forward_no_bias=None,
    weight_names=_attention_weights,
    passes=frozenset({"_qkv_same_embed_dim", "merge_masks"}),
)
_REGISTRY[nn.RNNBase] = LayerAdapter(  # nn.RNN, nn.LSTM, nn.GRU
    forward=None, forward_no_bias=None, weight_names=_recurrent_weights, passes=frozenset({"flatten_parameters"})
)
_HF_CONV1D = LayerAdapter(forward=_conv1d_hf_with_bias, forward_no_bias=_conv1d_hf)
_HF_EXPERTS = LayerAdapter(forward=None, forward_no_bias=None, weight_names=expert_weights)  # sqs_core._experts


def register_layer_type(layer_type: type, adapter: LayerAdapter) -> None:
    """Make modules of ``layer_type`` (holding the parameter named ``adapter.weight_name``) eligible for prepare_."""
    if not isinstance(layer_type, type) or not issubclass(layer_type, nn.Module):
        raise ValueError(f"layer_type must be an nn.Module subclass, got {layer_type!r}")
    if not isinstance(adapter, LayerAdapter) or not (callable(adapter.forward) or callable(adapter.weight_names)):
        raise ValueError(f"adapter must be a LayerAdapter with a callable forward (or weight_names), got {adapter!r}")
    if adapter.weight_names is not None and not callable(adapter.weight_names):
        raise ValueError(f"adapter.weight_names must be callable (module -> names) or None: {adapter.weight_names!r}")
    if adapter.forward_no_bias is not None and not callable(adapter.forward_no_bias):
        raise ValueError(f"adapter.forward_no_bias must be callable or None, got {adapter.forward_no_bias!r}")
    if not isinstance(adapter.weight_name, str) or not adapter.weight_name.isidentifier():
        raise ValueError(f"adapter.weight_name must name a parameter (an identifier), got {adapter.weight_name!r}")
    if not isinstance(adapter.passes, frozenset) or not all(isinstance(n, str) for n in adapter.passes):
        raise ValueError(f"adapter.passes must be a frozenset of attribute names, got {adapter.passes!r}")
    _REGISTRY[layer_type] = adapter


def parameter_adapter(adapter: LayerAdapter, name: str) -> LayerAdapter:
    """The adapter of the SQS layer that compresses the parameter ``name`` of a module whose type has ``adapter``."""
    if adapter.weight_names is None:
        return adapter
    forward = functools.partial(substituted_forward, name)  # a partial of a module-level function: it pickles
    return LayerAdapter(forward=forward, forward_no_bias=None, weight_name=name, passes=adapter.passes)


def compressed_names(module: nn.Module) -> tuple[str, ...]:
    """The parameters of an eligible ``module`` that SQS compresses (the adapter's weight_names or weight_name)."""
    adapter = adapter_for(module)
    if adapter is None:
        return ()
    if adapter.weight_names is None:
        return (adapter.weight_name,)
    names = tuple(adapter.weight_names(module))
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise ValueError(
            f"the weight_names of {type(module).__name__}'s adapter gave {names!r}: distinct parameter names expected"
        )
    return names


def adapter_for(module: nn.Module) -> LayerAdapter | None:
    """The adapter for ``module``'s type, or None if SQS does not know how to compress it."""
    if isinstance(module, SQSLayer):
        return None
    found = _registered_type(module)
    if found is None:
        return _HF_EXPERTS if is_fused_experts(module) else None
    adapter = _REGISTRY.get(found, _HF_CONV1D)
    if adapter.weight_names is None and defines_forward(module, found):
        return substituting(adapter)  # a subclass's own forward runs, with the weight substituted
    return adapter


def _registered_type(module: nn.Module) -> type | None:
    """The class in ``module``'s MRO whose adapter it gets: the first registered one, else transformers'
    Conv1D (exactly that class, recognised without importing transformers), else None (adapter_for then
    recognises transformers' fused MoE experts, sqs_core._experts)."""
    for cls in type(module).__mro__:
        if cls in _REGISTRY:
            return cls
    cls = type(module)
    if cls.__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "weight"):
        return cls
    return None


def own_forward(module: nn.Module) -> str | None:
    """A forward set on ``module`` itself (a patched module, as accelerate's hooks patch one), described, or None.
    A subclass's own forward (timm's StdConv2d, a scaled embedding) runs with the weight substituted
    (sqs_core._subclass_forward), as do the types with several compressed parameters."""
    if "forward" in vars(module):
        return "a forward set on the instance (a patched module)"
    return None


def _variational_before_load(layer: SQSLayer, state_dict: dict, prefix: str, *_: Any) -> None:
    """load_state_dict's pre-hook: a fixed weight (greedy_, sample_) was drawn from the posterior about to be
    replaced, and ``state_dict`` does not hold it (a non-persistent buffer), so the layer goes back to the
    variational mode instead of computing with a stale weight; call greedy_ or sample_ again."""
    if layer.mode == "fixed" and any(key.startswith(f"{prefix}posterior.") for key in state_dict):
        log.warning("SQS layer %r: load_state_dict replaced its posterior; back to the variational mode", prefix[:-1])
        layer.set_variational()


_OWN = frozenset({"base_layer", "posterior", "adapter", "mode", "fixed_weight", "training", "sqs_name"})


def _compressed_name(layer: nn.Module) -> str | None:
    """The name of the wrapped module's parameter that the posterior replaced (``weight``, ``in_proj_weight``)."""
    adapter = layer.__dict__.get("adapter")
    return adapter.weight_name if adapter is not None else None


def _passes_to(layer: nn.Module, name: str) -> nn.Module | None:
    """The wrapped module if ``layer.name`` means its data attribute ``name``: one of its instance attributes or
    its parameters, buffers or submodules (not the weight, which the posterior replaced), never a private name,
    unless the adapter lists ``name`` in its ``passes``."""
    base = layer.__dict__.get("_modules", {}).get("base_layer")
    if base is None or name in _OWN or name in ("weight", _compressed_name(layer)):
        return None
    if isinstance(base, SQSLayer):  # a module with several compressed parameters: one SQS layer inside another
        return base if name == _compressed_name(base) or _passes_to(base, name) is not None else None
    adapter = layer.__dict__.get("adapter")
    if adapter is not None and name in adapter.passes:
        return base
    if name.startswith("_"):
        return None
    if name in base.__dict__ or name in base._parameters or name in base._buffers or name in base._modules:
        return base
    return None


class SQSLayer(nn.Module):
    """Wraps ``base_layer``; its weight comes from ``posterior`` (shared between tied layers)."""

    fixed_weight: torch.Tensor | None  # the concrete weight of the "fixed" mode (greedy or one draw)
    sqs_name: str = ""  # its name in the prepared model (the module's), for messages: set by prepare_ (not
    # layer_name: a wrapped module's own attribute of that name reads through the layer)

    def __init__(self, base_layer: nn.Module, posterior: SpikeGMMPosterior, adapter: LayerAdapter) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.posterior = posterior
        self.adapter = adapter
        self.mode = "variational"
        self.register_buffer("fixed_weight", None, persistent=False)
        self.register_load_state_dict_pre_hook(_variational_before_load)

    def set_fixed_weight(self, weight: torch.Tensor) -> None:
        """Switch to the ``fixed`` mode with a concrete (sparse, quantized) weight, in the layer's dtype."""
        self.fixed_weight = weight.detach().to(self.posterior.weight_dtype)
        self.mode = "fixed"

    def set_variational(self) -> None:
        self.fixed_weight = None
        self.mode = "variational"

    @property
    def weight(self) -> torch.Tensor:
        """The weight the layer computes with, for code that reads ``layer.weight`` instead of calling the layer
        (nn.MultiheadAttention reads ``out_proj.weight``): the fixed weight, or θ^avg, through which gradients
        reach the posterior (the plug-in forward, whatever ``likelihood`` says)."""
        return self._weight_and_variance(second=False)[0]

    @property
    def bias(self) -> torch.Tensor | None:
        """The wrapped module's bias (None if it has none), beside :attr:`weight`. Assigning ``layer.bias``
        (a Parameter, a tensor or None) sets the wrapped module's, which the forward uses."""
        return getattr(self.base_layer, "bias", None)

    def __getattr__(self, name: str) -> Any:
        """nn.Module's lookup (parameters, buffers, submodules), then the wrapped module's data attributes
        (``in_features``, ``out_channels``, ``padding_idx``, ``nf``, a registered type's own parameters), so that
        model code reading them runs after ``prepare_``; not its methods, which act on the weight it no longer has,
        except those a subclass of the registered type defines, which run with the compressed weight substituted."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == _compressed_name(self) and name != "weight":  # layer.in_proj_weight: what it computes with
                return self.weight
            found = _subclass_attribute(self, name)
            if found is not NOT_DEFINED:
                return found
            base = _passes_to(self, name)
            if base is None:
                raise
            return getattr(base, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "bias":  # nn.Module would register a second 'bias' or find no setter on the property
            self.base_layer.bias = value
        elif name in ("weight", _compressed_name(self)):
            raise AttributeError(
                f"SQSLayer.{name} is computed from the posterior (θ^avg) or the fixed weight and cannot be assigned: "
                "set a concrete weight with set_fixed_weight(weight), or prepare a plain module again to start from "
                "another pretrained weight"
            )
        elif name not in self.__dict__ and (base := _passes_to(self, name)) is not None:
            setattr(base, name, value)  # layer.padding = 2 sets what the adapter reads, not a copy beside it
        else:
            super().__setattr__(name, value)

    def _weight_and_variance(self, *, second: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, Var_q or None): the fixed weight, or the posterior's moments, θ^avg cast to the layer's dtype and
        Var_q in the posterior's (float32 for a half-precision layer; sqs_core._noise rounds what it derives)."""
        if self.mode == "fixed":
            if self.fixed_weight is None:
                raise RuntimeError("SQSLayer in fixed mode without a weight; call set_fixed_weight first")
            return self.fixed_weight, None
        mean, var = self.posterior.moments(second=second)
        dtype = self.posterior.weight_dtype
        return mean.to(dtype), var

    def _forward_moments(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, Var_q or None) for a forward: Var_q only in moment-matched training (a fixed layer has none)."""
        moment_matched = self.training and self.posterior.config.likelihood == "moment_matched"
        return self._weight_and_variance(second=moment_matched)

    def forward_weight(self) -> torch.Tensor:
        """The weight a forward without a variance path computes with: the fixed weight, θ^avg, or in moment-matched
        training a draw θ^avg + sqrt(Var_q)·ε (one ε per weight; a pruned weight, of variance 0, stays 0)."""
        weight, var = self._forward_moments()
        if var is None:
            return weight
        return weight + weight_noise_std(var, weight.dtype) * torch.randn_like(weight)

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's forward with the posterior's weight; arguments after ``x`` go to the adapter
        (a transposed convolution's ``output_size``, attention's key and value)."""
        refuse_bypassed_hooks(self.sqs_name, self._bypassed_modules())
        forward, forward_no_bias = self.adapter.forward, self.adapter.forward_no_bias
        if forward is None:
            raise RuntimeError(f"internal: the adapter of {type(self.base_layer).__name__} has no forward")
        if forward_no_bias is None or renormalises_rows(self.base_layer):  # not linear in the weight (attention,
            return forward(self.base_layer, x, self.forward_weight(), *args, **kwargs)  # recurrent): it is drawn
        weight, var = self._forward_moments()
        out = forward(self.base_layer, x, weight, *args, **kwargs)
        if var is None:  # fixed, or the plug-in likelihood: the forward at θ^avg
            return out
        dtype = self.posterior.weight_dtype
        std = output_std(forward_no_bias, self.base_layer, x, var, dtype, self.adapter.square_input, *args, **kwargs)
        return out + std.to(out.dtype) * torch.randn_like(out)

    def _bypassed_modules(self) -> list[nn.Module]:
        """The modules below this layer that its call does not call (sqs_core._hooks): the wrapped module, or, where
        the module's own forward runs with its weights substituted, the SQS layers nested inside this one."""
        forward = self.adapter.forward
        if not (isinstance(forward, functools.partial) and forward.func is substituted_forward):
            return [self.base_layer]
        return list(_nested_layers(self.base_layer)[0])

    def extra_repr(self) -> str:
        p = self.posterior
        name = self.adapter.weight_name
        which = "" if name == "weight" else f"{name}: "  # a module's other parameter (in_proj_weight, weight_ih_l0)
        return f"{which}mode={self.mode}, K={p.num_components}, windows={p.num_windows}"
