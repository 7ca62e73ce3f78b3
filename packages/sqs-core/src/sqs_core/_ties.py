"""Tied weights in ``prepare_``: modules sharing one weight Parameter share one posterior.

Before anything changes, a tie to a module left dense and a tie whose layers the overrides configure differently
are refused. After, each later layer of a tie declares its posterior's state entries as aliases of the first
layer's (:func:`declare_tie_aliases`), the way a Hugging Face model declares its tied head.
"""

from __future__ import annotations

import re
from typing import Any, cast

import torch
from torch import nn

from .config import OVERRIDABLE
from .layers import SQSLayer, compressed_names

__all__ = ["ALIAS_PATTERN", "check_tied_settings", "check_ties", "declare_tie_aliases", "tensors_to_compress"]

ALIAS_PATTERN = r"posterior\.[^.]+$"
"""A tie's later layer's state keys that alias the first layer's, as a pattern relative to that layer: every
parameter and buffer of its (shared) posterior."""


def tensors_to_compress(module: nn.Module) -> list[torch.Tensor]:
    """The tensors SQS compresses in a chosen ``module`` (_select keeps only modules where they are tensors)."""
    return [cast(torch.Tensor, getattr(module, attr)) for attr in compressed_names(module)]


def check_ties(model: nn.Module, chosen) -> None:
    """A ValueError where a weight to compress is also a parameter of a module left dense (an excluded or
    skipped layer, or a bare use): prepare_ replaces it in the compressed layers only, which would untie it,
    and the file would store the dense copy that a tied skeleton then loads over the compressed one."""
    owners = {id(w): name for name, module, _ in chosen for w in tensors_to_compress(module)}
    compressed = {id(module) for _, module, _ in chosen}
    for module_name, module in model.named_modules(remove_duplicate=False):
        if id(module) in compressed:
            continue
        for param_name, param in module._parameters.items():
            if param is not None and id(param) in owners:
                where = f"{module_name}.{param_name}" if module_name else param_name
                raise ValueError(
                    f"the weight of layer {owners[id(param)]!r} is tied to {where!r}, which is not compressed: "
                    "compress both (include both, no skip) or neither"
                )


def check_tied_settings(chosen) -> None:
    """A ValueError where the overrides give layers that share a weight (one posterior) different settings: the
    posterior was built with the first layer's and the other's override was silently ignored."""
    first: dict[int, tuple[str, Any]] = {}
    for name, module, layer_config in chosen:
        for weight in tensors_to_compress(module):
            other, other_config = first.setdefault(id(weight), (name, layer_config))
            if other_config != layer_config:
                keys = [k for k in OVERRIDABLE if k != "skip" and getattr(other_config, k) != getattr(layer_config, k)]
                settings = ", ".join(f"{k} {getattr(other_config, k)!r} vs {getattr(layer_config, k)!r}" for k in keys)
                raise ValueError(
                    f"layers {other!r} and {name!r} share one weight (tied), so one posterior, but the overrides "
                    f"give them different settings ({settings}): give both the same, e.g. one override pattern "
                    f"matching both names"
                )


def declare_tie_aliases(model: nn.Module) -> None:
    """Declare, on each SQS layer of ``model``, the entries of ``model.state_dict()`` under it that are another
    entry's tensor under a second name, in ``_tied_weights_keys`` (patterns relative to the layer, each mapped to
    the entry it aliases): its posterior's, on every layer of a tie but the first (in module order), and any entry
    of the wrapped module that a module elsewhere holds too (BERT's decoder bias is its prediction head's ``bias``;
    prepare_ moved it to ``decoder.base_layer.bias``, where the model's own declaration no longer finds it).

    ``torch.save`` stores such aliases once; safetensors refuses aliased tensors, and Hugging Face's
    ``save_pretrained`` (so ``Trainer``'s checkpoints) drops the keys that submodules' ``_tied_weights_keys``
    declare, as it drops a tied head's weight, keeping one name of each tensor. Without this, a prepared model with
    a tie failed there ("contained shared tensors ... not properly defined"); loading the file back with
    ``load_state_dict(strict=False)`` fills each shared tensor through the name kept."""
    names: dict[int, list[str]] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        names.setdefault(id(tensor), []).append(key)
    first: dict[int, str] = {}
    for name, layer in model.named_modules():
        if not isinstance(layer, SQSLayer):
            continue
        aliases: dict[str, str] = {}
        source = first.setdefault(id(layer.posterior), name)
        if source != name:
            aliases[ALIAS_PATTERN] = f"{source}.posterior" if source else "posterior"
        prefix = f"{name}.base_layer." if name else "base_layer."
        for key, tensor in layer.base_layer.state_dict(prefix=prefix, keep_vars=True).items():
            others = [other for other in names.get(id(tensor), []) if other != key]
            if others and ".posterior." not in key[len(prefix) :]:  # a nested SQS layer declares its own
                aliases[re.escape(key[len(name) + 1 if name else 0 :]) + "$"] = others[0]
        if aliases:
            layer._tied_weights_keys = aliases
