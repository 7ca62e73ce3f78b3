"""``prepare_``: swap every eligible layer of a model, in place, for an :class:`SQSLayer`.

Works on nested models (the module tree is walked, every reference to an eligible module is replaced,
including a module used at several places) and on tied weights (modules sharing one weight Parameter
share one posterior, so they stay tied).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from typing import cast

import torch
from torch import nn
from torch.nn.utils import parametrize

from ._checks import F32_STD_MIN, all_finite, check_flag, check_initial_mixture
from ._coverage import dense_weights, log_dense_weights
from ._experts import EXPERT_PARALLEL_HINT, is_expert_parallel
from ._hooks import hook_kinds
from ._ties import (
    check_tied_settings,
    check_ties,
    declare_tie_aliases,
    declared_ties,
    retire_absorbed_ties,
    tensors_to_compress,
)
from .config import SQSConfig
from .layers import SQSLayer, adapter_for, compressed_names, own_forward, parameter_adapter
from .posterior import SpikeGMMPosterior

__all__ = ["is_prepared", "posteriors", "prepare_", "sqs_layers"]

log = logging.getLogger(__name__)

TINY_WEIGHTS = 1e4 * F32_STD_MIN
"""A layer whose weights all lie below this (~1.1e-15) is prepared with a WARNING: the posterior floors every σ at
F32_STD_MIN (~1.1e-19, so that 1/σ² is a normal float32), coarser than such weights' spacing (session 63: greedy
weights 0.875 away from θ, relative, at 1e-20 against 0.14 at 1)."""
_MARK = "_sqs_config"


def is_prepared(model: nn.Module) -> bool:
    return getattr(model, _MARK, None) is not None


def sqs_layers(model: nn.Module) -> dict[str, SQSLayer]:
    """Every :class:`SQSLayer` of ``model`` by qualified name (a shared layer appears once)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, SQSLayer)}


def sqs_paths(model: nn.Module) -> set[str]:
    """Every qualified name under which ``model`` reaches an SQS layer (a module used at several places: each)."""
    return {path for path, m in model.named_modules(remove_duplicate=False) if isinstance(m, SQSLayer)}


def posteriors(model: nn.Module, *, by_tensor: bool = False) -> dict[str, SpikeGMMPosterior]:
    """The distinct posteriors of ``model`` (tied layers share one), keyed by their first layer's name or, with
    ``by_tensor``, by the tensor each compresses under the plain model's names (``rnn.weight_ih_l0``,
    ``0.weight``: the state keys of the skeleton an artifact loads into)."""
    check_flag("by_tensor", by_tensor)
    paths = sqs_paths(model)
    out: dict[str, SpikeGMMPosterior] = {}
    seen: set[int] = set()
    for name, layer in sqs_layers(model).items():
        if id(layer.posterior) not in seen:
            seen.add(id(layer.posterior))
            out[f"{plain_key(name, paths)}.{layer.adapter.weight_name}" if by_tensor else name] = layer.posterior
    return out


def plain_key(key: str, sqs_paths: set[str]) -> str | None:
    """A prepared model's state key under the plain model's names (``base_layer.`` dropped); None for
    posterior tensors, which only training needs."""
    kept, here = [], None  # here: the prepared model's name of the module reached so far
    for seg in key.split("."):
        if here in sqs_paths:
            if seg == "posterior":
                return None
            if seg == "base_layer":
                here = f"{here}.{seg}"
                continue
        kept.append(seg)
        here = seg if here is None else f"{here}.{seg}"
    return ".".join(kept)


def _references(model: nn.Module) -> dict[int, list[tuple[nn.Module, str, str]]]:
    """id(module) -> every (parent, attribute, qualified name) that refers to it, in traversal order."""
    refs: dict[int, list[tuple[nn.Module, str, str]]] = {}
    for parent_name, parent in model.named_modules(remove_duplicate=False):
        for attr, child in parent._modules.items():
            if child is not None:
                name = f"{parent_name}.{attr}" if parent_name else attr
                refs.setdefault(id(child), []).append((parent, attr, name))
    return refs


def _select(model: nn.Module, config: SQSConfig):
    """(canonical name, module, layer config) of every layer to compress; validates the patterns."""
    refs = _references(model)
    eligible: list[tuple[str, nn.Module]] = []
    left: list[str] = []  # layers of a known type with nothing to compress: a pattern may still name them
    seen: set[int] = set()
    for _, module in model.named_modules(remove_duplicate=False):
        if id(module) in seen or module is model or adapter_for(module) is None:
            continue
        seen.add(id(module))
        name, params = refs[id(module)][0][2], compressed_names(module)
        _check_named(name, module, params)
        if not params or not all(isinstance(getattr(module, n, None), torch.Tensor) for n in params):
            log.info("prepare_: %r has no tensor %s to compress: left as it is", name, params)
        elif all(_is_empty(getattr(module, n)) for n in params):  # MobileBERT's head when hidden = embedding size
            log.info("prepare_: %r has only empty tensors %s: left as it is", name, params)
        else:
            eligible.append((name, module))
            continue
        left.append(name)
    root = type(model).__name__
    a_root = f"{'an' if root[:1] in 'AEIOU' else 'a'} {root}"
    if adapter_for(model) is not None:  # a layer swaps in place only inside a parent that holds it
        if not eligible:
            raise ValueError(
                f"model is itself {a_root} layer: prepare_ swaps layers inside a model, so wrap it first "
                f"(nn.Sequential(layer))"
            )
        log.warning(
            "prepare_: the model is itself %s, whose own weight stays dense: wrap it first "
            "(nn.Sequential(module)) to compress it too",
            a_root,
        )
    if not eligible:
        raise ValueError(f"model {root} has no layer SQS can compress (Linear, Conv, ...)")
    names = [n for n, _ in eligible]
    _check_patterns(config, names, left)
    chosen = []
    for name, module in eligible:
        if config.include and not any(re.search(p, name) for p in config.include):
            continue
        if any(re.search(p, name) for p in config.exclude):
            continue
        layer_config = config.for_layer(name)
        if layer_config is not None:
            chosen.append((name, module, layer_config))
    if not chosen:
        raise ValueError(f"include/exclude/overrides leave no layer to compress; eligible: {names}")
    return chosen, refs


def prepare_(model: nn.Module, config: SQSConfig | None = None) -> nn.Module:
    """Swap the eligible layers of ``model`` in place for SQS layers; returns ``model``.

    Fails (changing nothing) if the model was already prepared, has no eligible layer, a pattern
    names no layer, or a weight to compress holds NaN/inf.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"prepare_ needs a torch.nn.Module, got {type(model).__name__}")
    if is_prepared(model) or any(isinstance(m, SQSLayer) for m in model.modules()):
        raise ValueError("model is already prepared for SQS (prepare_ was called twice)")
    config = config if config is not None else SQSConfig()
    if not isinstance(config, SQSConfig):
        raise ValueError(
            f"config must be an SQSConfig (SQSConfig.from_dict builds one from a dict), got {type(config).__name__}"
        )
    chosen, refs = _select(model, config)
    for name, module, _ in chosen:
        _check_weights(name, module)
    check_ties(model, chosen)
    check_tied_settings(chosen)
    wrappers, created, shared = _wrap(chosen, torch.Generator().manual_seed(config.seed))
    dense = dense_weights(model)
    ties_declared = declared_ties(model)
    frozen = [name for name, module, _ in chosen if not all(w.requires_grad for w in tensors_to_compress(module))]
    for module, wrapper in wrappers:  # mutate only once everything above succeeded
        for attr in compressed_names(module):
            del module._parameters[attr]
            module.register_parameter(attr, None)
        for parent, attr, _ in refs[id(module)]:
            parent._modules[attr] = wrapper
    declare_tie_aliases(model)
    retire_absorbed_ties(ties_declared)
    setattr(model, _MARK, config)
    _log_prepared(len(created), shared)
    log_dense_weights(dense)
    _log_frozen(frozen)
    return model


def _check_patterns(config: SQSConfig, names: list[str], left: list[str]) -> None:
    """A ValueError for an include / exclude / override pattern that names no layer (``left``: layers of a known
    type with nothing to compress, which an exclude written for them may name)."""
    for kind, patterns in (("include", config.include), ("exclude", config.exclude), ("override", config.overrides)):
        for p in patterns:
            if not any(re.search(p, n) for n in names + left):
                raise ValueError(f"{kind} pattern {p!r} names no eligible layer; eligible: {names}")


def _is_empty(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds no element (a lazy module's uninitialised parameter is not known to: _check_weight
    refuses it)."""
    return not nn.parameter.is_lazy(tensor) and tensor.numel() == 0


def _check_named(name: str, module: nn.Module, params: tuple[str, ...]) -> None:
    """A ValueError for an eligible module lacking a parameter its adapter names (a registered adapter's typo, or
    a type changed since): it was skipped with an INFO line, the model compressed without it. (A parameter set to
    None, as a prepared layer's base holds, is not missing.)"""
    missing = [n for n in params if n not in module._parameters and not hasattr(module, n)]
    if missing:
        raise ValueError(
            f"layer {name!r} ({type(module).__name__}) has no attribute {missing[0]!r}, which the adapter registered "
            "for its type names (LayerAdapter.weight_name / weight_names): register the adapter with the name of "
            "the parameter to compress, or exclude the layer"
        )


def _wrap(chosen, generator: torch.Generator):
    """(each chosen module with its outermost SQS layer, every SQS layer made, every distinct posterior), nothing
    in the model changed yet. A module with several compressed parameters gets one SQS layer each, one around the
    other; modules sharing a weight Parameter (ties) share its posterior."""
    shared: dict[int, SpikeGMMPosterior] = {}
    wrappers: list[tuple[nn.Module, SQSLayer]] = []
    created: list[SQSLayer] = []
    for name, module, layer_config in chosen:
        adapter = adapter_for(module)
        if adapter is None:  # chosen layers were filtered by adapter_for already
            raise RuntimeError(f"internal: no adapter for the chosen layer {name!r}")
        outer: nn.Module = module
        for attr in compressed_names(module):
            weight = getattr(module, attr)
            posterior = shared.get(id(weight))
            if posterior is None:
                posterior = SpikeGMMPosterior(weight, layer_config, generator=generator)
                posterior.layer_name = name
                check_initial_mixture(name, posterior)
                shared[id(weight)] = posterior
            outer = SQSLayer(outer, posterior, parameter_adapter(adapter, attr))
            outer.sqs_name = name
            created.append(outer)
            _pin_padding_row(module, posterior)
        wrappers.append((module, cast(SQSLayer, outer)))
    layers_per_posterior = Counter(id(layer.posterior) for layer in created)
    for posterior in shared.values():
        posterior.sharers = layers_per_posterior[id(posterior)]
    return wrappers, created, list(shared.values())


def _log_frozen(names: list[str]) -> None:
    """Layers whose weight had requires_grad=False: their posteriors train like every other (a model frozen
    whole, so that only the compression learns, is a use), which is not what freezing one layer may have meant."""
    if names:
        log.info(
            "prepare_: %d layer(s) had a frozen weight (requires_grad=False), and their posteriors are trainable like "
            "the others: %s; to leave a layer uncompressed, exclude it (SQSConfig(exclude=...))",
            len(names),
            ", ".join(repr(n) for n in names),
        )


def _check_weights(name: str, module: nn.Module) -> None:
    """A clear ValueError, before anything changes, for a module whose weights SQS cannot take over."""
    if is_expert_parallel(module):
        raise ValueError(f"layer {name!r} ({type(module).__name__}) {EXPERT_PARALLEL_HINT}")
    for attr in compressed_names(module):
        _check_weight(name if attr == "weight" else f"{name}.{attr}", module, attr)
    _check_forward(name, module)


def _check_weight(name: str, module: nn.Module, attr: str) -> None:
    """A clear ValueError, before anything changes, for a weight SQS cannot take over."""
    if parametrize.is_parametrized(module, attr):
        raise ValueError(
            f"layer {name!r} has a parametrized weight (torch.nn.utils.parametrize: weight_norm, spectral_norm, ...); "
            "SQS replaces a plain weight tensor: fold it first with sqs_core.plain_weights_(model) (and the same on "
            "the skeleton you load into), or exclude the layer"
        )
    weight = cast(torch.Tensor, getattr(module, attr))
    if isinstance(weight, nn.parameter.UninitializedParameter):
        raise ValueError(f"layer {name!r} is a lazy module whose weight is not initialised: run a forward pass first")
    if weight.is_meta:
        raise ValueError(f"layer {name!r} has its weight on the meta device (no values): load its weights first")
    if is_sharded(weight):
        raise ValueError(f"layer {name!r} has its weight {SHARDED_HINT}")
    if attr in module._buffers:
        raise ValueError(
            f"layer {name!r} ({type(module).__name__}) holds {attr!r} as a buffer, not a parameter: SQS compresses "
            "an nn.Parameter (register it as one), or exclude the layer"
        )
    if not isinstance(module._parameters.get(attr), nn.Parameter):
        raise ValueError(
            f"layer {name!r} computes its weight instead of holding it as a parameter (old-style "
            "torch.nn.utils.weight_norm / spectral_norm, or torch.nn.utils.prune): fold it first with "
            "sqs_core.plain_weights_(model) (and the same on the skeleton you load into), or exclude the layer"
        )
    if not weight.is_floating_point() or not all_finite(weight):
        raise ValueError(f"layer {name!r} has a NaN or infinite weight (or a non-float dtype); fix it first")
    if weight.numel() == 0:
        raise ValueError(f"layer {name!r} has an empty weight {tuple(weight.shape)}: exclude it")
    largest = float(weight.detach().abs().max())
    if 0 < largest < TINY_WEIGHTS:
        log.warning(
            "layer %r: its weights are all below %.3g in magnitude (largest %.3g), finer than the posterior's σ floor "
            "(%.3g) resolves: its quantization levels will be coarse. Scale the layer's weights up (and its output "
            "down) before prepare_, or exclude it",
            name,
            TINY_WEIGHTS,
            largest,
            F32_STD_MIN,
        )


def _check_forward(name: str, module: nn.Module) -> None:
    """A ValueError for a layer whose call the SQS layer would not reproduce: SQSLayer computes the layer's
    functional form with the posterior's weight and never calls the module (its hooks); a forward patched onto the
    instance is refused whatever the type. A module whose own forward runs with its weights substituted (a type
    with several compressed parameters, a subclass with its own forward: LayerAdapter.weight_names) is called,
    hooks and all."""
    replaced = own_forward(module)
    if replaced is not None:
        raise ValueError(
            f"layer {name!r} ({type(module).__name__}) has {replaced}, which may read or move its weight itself: "
            "call prepare_ before patching the model, or exclude the layer"
        )
    adapter = adapter_for(module)
    if adapter is not None and adapter.weight_names is not None:
        return
    hooks = hook_kinds(module)
    if hooks:
        raise ValueError(
            f"layer {name!r} has hooks ({', '.join(hooks)}) that would never run on the SQS layer: remove them and "
            "register them after prepare_ on sqs_core.sqs_layers(model)[name], or exclude the layer"
        )
    if isinstance(module, nn.Embedding) and module.sparse:
        raise ValueError(f"layer {name!r} is an nn.Embedding with sparse=True (sparse gradients): SQS needs dense ones")


def _pin_padding_row(module: nn.Module, posterior: SpikeGMMPosterior) -> None:
    """An ``nn.Embedding``'s ``padding_idx`` row stays exactly zero when it is zero in the layer (as nn.Embedding
    makes it and its training keeps it): pinned pruned (SpikeGMMPosterior.pin_zero_rows_), else the nearest
    level would replace it. A non-zero padding row (some pretrained checkpoints) is compressed like the others."""
    row = getattr(module, "padding_idx", None) if isinstance(module, nn.Embedding) else None
    if row is not None and not bool(posterior.weight[row].any()):
        posterior.pin_zero_rows_([row])


def _log_prepared(num_layers: int, posteriors: list[SpikeGMMPosterior]) -> None:
    total = sum(p.weight.numel() for p in posteriors)
    log.info("SQS prepared %d layers (%d posteriors, %d weights)", num_layers, len(posteriors), total)
    half = sorted({str(p.weight_dtype) for p in posteriors if p.weight_dtype != p.weight.dtype})
    if half:  # float16 / bfloat16 layers (SpikeGMMPosterior)
        log.info(
            "SQS keeps the posteriors of %s layers in float32; the layers compute in their own dtype", "/".join(half)
        )


SHARDED_HINT = (
    "sharded (a torch.distributed DTensor, as FSDP's fully_shard leaves it): sqs-core's objective, schedules, "
    "inference and artifacts work on whole tensors; train with DistributedDataParallel (replicated parameters), "
    "and load a full state dict into an unsharded model for inference and sqs_core.save"
)


def is_sharded(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a torch.distributed DTensor (found by class name: no import of torch.distributed)."""
    return any(cls.__name__ == "DTensor" for cls in type(tensor).__mro__)


def check_unsharded(found: dict[str, SpikeGMMPosterior]) -> None:
    """A ValueError naming the first layer whose posterior (of ``found``, as :func:`posteriors` gives them) holds a
    sharded tensor (FSDP)."""
    for name, post in found.items():
        for attr, tensor in (*post.named_parameters(recurse=False), *post.named_buffers(recurse=False)):
            if is_sharded(tensor):
                raise ValueError(f"layer {name!r} holds its posterior's {attr} {SHARDED_HINT}")


def prepared_config(model: nn.Module) -> SQSConfig:
    """The config ``prepare_`` used; raises a clear error for a model that was not prepared or whose posteriors
    are sharded (FSDP)."""
    if not sqs_layers(model):
        raise ValueError("model was not prepared for SQS: call sqs_core.prepare_(model, config) first")
    check_unsharded(posteriors(model))
    config = getattr(model, _MARK, None)
    if config is not None:
        return config
    # a wrapper of prepared modules (DDP, AveragedModel, a module holding a prepared backbone)
    marked = {name: getattr(m, _MARK) for name, m in model.named_modules() if getattr(m, _MARK, None) is not None}
    if len(set(marked.values())) == 1:
        return next(iter(marked.values()))
    raise ValueError(
        "model holds SQS layers of modules prepared with different configs "
        f"({', '.join(map(repr, marked))}): pass one of them"
        if marked
        else "model holds SQS layers but is not a model prepare_ was called on, nor holds one (a part of a prepared "
        "model?): pass the model given to sqs_core.prepare_"
    )
