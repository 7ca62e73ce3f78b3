"""Tied weights in ``prepare_``: modules sharing one weight Parameter share one posterior.

Before anything changes, a tie to a module left dense and a tie whose layers the overrides configure differently
are refused. After, every state entry that is another entry's tensor under a second name (a tie's shared posterior
on its later layers, a wrapped module's tied bias) is declared as an alias on its SQS layer
(:func:`declare_tie_aliases`), the way a Hugging Face model declares its tied head, and the model's own declarations
of the ties now held by a shared posterior are retired (:func:`retire_absorbed_ties`).
"""

from __future__ import annotations

import logging
import re
from typing import Any, NamedTuple, cast

import torch
from torch import nn

from .config import OVERRIDABLE
from .layers import SQSLayer, adapter_for, compressed_names

__all__ = [
    "TieDeclarations",
    "aliased_keys",
    "check_tied_settings",
    "check_ties",
    "declare_tie_aliases",
    "declared_ties",
    "retire_absorbed_ties",
    "tensors_to_compress",
]

log = logging.getLogger("sqs_core.prepare")


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
                if adapter_for(module) is None:  # IBERT's QuantEmbedding: no include compresses it
                    remedy = (
                        f"it is a parameter of a {type(module).__name__}, a module sqs-core does not compress: exclude "
                        f"{owners[id(param)]!r} too (or, if {type(module).__name__} is a layer, register its type: "
                        "sqs_core.register_layer_type)"
                    )
                else:
                    remedy = "compress both (include both, no skip) or neither"
                raise ValueError(
                    f"the weight of layer {owners[id(param)]!r} is tied to {where!r}, which is not compressed: {remedy}"
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
    """Declare, on the SQS layers of ``model``, the entries of ``model.state_dict()`` that are another entry's tensor
    under a second name: ``layer._tied_weights_keys`` maps each (an escaped pattern relative to the layer, as
    transformers writes them) to the entry kept. Of each group of names of one tensor, the first outside every SQS
    layer is kept, else the first: a tie's posterior on every layer of the tie but the first (in state order), and an
    entry of a wrapped module that a module elsewhere holds too (BERT's decoder bias is its prediction head's
    ``bias``; prepare_ moved it to ``decoder.base_layer.bias``, where the model's own declaration no longer finds it).

    ``torch.save`` stores such aliases once; safetensors refuses aliased tensors, and Hugging Face's
    ``save_pretrained`` (so ``Trainer``'s checkpoints) drops the keys that submodules' ``_tied_weights_keys``
    declare, as it drops a tied head's weight. Without this, a prepared model with a tie failed there ("contained
    shared tensors ... not properly defined"); loading the file back with ``load_state_dict(strict=False)`` fills
    each shared tensor through the name kept."""
    layers = {name: layer for name, layer in model.named_modules() if isinstance(layer, SQSLayer)}
    for keys in aliased_keys(model.state_dict(keep_vars=True)):
        owners = [_innermost_layer(key, layers) for key in keys]
        kept = next((key for key, owner in zip(keys, owners, strict=True) if owner is None), keys[0])
        for key, owner in zip(keys, owners, strict=True):
            if key != kept and owner is not None:
                aliases = layers[owner].__dict__.setdefault("_tied_weights_keys", {})
                aliases[re.escape(key[len(owner) + 1 :]) + "$"] = kept


def aliased_keys(state: dict[str, Any]) -> list[list[str]]:
    """The keys of ``state`` (a ``state_dict(keep_vars=True)``) that name one tensor under several names, a list
    per tensor, each in state order."""
    groups: dict[int, list[str]] = {}
    for key, tensor in state.items():
        groups.setdefault(id(tensor), []).append(key)
    return [keys for keys in groups.values() if len(keys) > 1]


def _innermost_layer(key: str, layers: dict[str, SQSLayer]) -> str | None:
    """The name of the innermost SQS layer holding the state entry ``key``, or None."""
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in layers:
            return prefix
    return None


class TieDeclarations(NamedTuple):
    """A module's tie declarations as transformers keeps them, read before ``prepare_`` changes anything."""

    module: nn.Module
    own: dict[str, str]  # its ``_tied_weights_keys``, expanded to tensor names ({} if none or not expandable)
    gathered: dict[str, str]  # its ``all_tied_weights_keys``: its own and its submodels', gathered at construction
    names: set[str]  # the module's parameter and buffer names then


def declared_ties(model: nn.Module) -> list[TieDeclarations]:
    """The modules of ``model`` that declare ties as a Hugging Face ``PreTrainedModel`` does (recognised by that
    contract, ``get_expanded_tied_weights_keys`` / ``all_tied_weights_keys``, as Conv1D is, without importing
    transformers), read before ``prepare_`` changes anything: the patterns may match nothing after."""
    found = []
    for module in model.modules():
        if isinstance(module, SQSLayer):
            continue
        own, gathered = _expanded(module), getattr(module, "all_tied_weights_keys", None)
        gathered = dict(gathered) if isinstance(gathered, dict) else {}
        if own or gathered:
            found.append(TieDeclarations(module, own, gathered, _tensor_names(module)))
    return found


def retire_absorbed_ties(declared: list[TieDeclarations]) -> None:
    """Drop, from each module's tie declarations, the ties whose tensors ``prepare_`` replaced by one shared posterior
    (``lm_head.weight`` -> ``transformer.wte.weight``: both names gone, one posterior in both SQS layers).

    transformers' ``tie_weights()`` (called by users, by ``init_weights`` from ``all_tied_weights_keys``, and by
    libraries after loading) re-ties every declared pair with ``setattr(parent, name, source)``, and failed after
    ``prepare_`` on the vanished source ("``transformer.wte.weight`` is neither a parameter, buffer, nor extra
    state"). The layers are tied already, through their posterior, and :func:`declare_tie_aliases` declares its
    second names for saving. A pair is kept unless a name of it was a tensor before and is gone now: ties left dense
    keep their declarations."""
    for module, own, gathered, before in declared:
        gone = before - _tensor_names(module)
        for attribute, pairs in (("_tied_weights_keys", own), ("all_tied_weights_keys", gathered)):
            kept = {t: s for t, s in pairs.items() if t not in gone and s not in gone}
            if len(kept) < len(pairs):
                module.__dict__[attribute] = kept


def _expanded(module: nn.Module) -> dict[str, str]:
    """``module``'s own tie declarations expanded to tensor names by transformers' method, or {} (none, not
    transformers' method, or a declaration it cannot expand: left as it is)."""
    expand = getattr(module, "get_expanded_tied_weights_keys", None)
    if not callable(expand):
        return {}
    try:
        expanded = expand(all_submodels=False)
    except (TypeError, ValueError) as error:
        log.debug("tie declarations of a %s left as they are: %s", type(module).__name__, error)
        return {}
    return dict(expanded) if isinstance(expanded, dict) else {}


def _tensor_names(module: nn.Module) -> set[str]:
    names = {name for name, _ in module.named_parameters(remove_duplicate=False)}
    return names | {name for name, _ in module.named_buffers(remove_duplicate=False)}
