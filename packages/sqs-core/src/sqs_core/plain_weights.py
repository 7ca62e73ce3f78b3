"""``plain_weights_``: fold what computes a compressible layer's weight (weight normalisation, spectral
normalisation, pruning masks, any torch.nn.utils.parametrize parametrization) into a plain weight parameter.

``prepare_`` replaces a plain weight tensor by the posterior and refuses a computed one with a ValueError naming
the layer. Audio models hold many such layers (EnCodec's and HiFi-GAN's convolutions, wav2vec2's positional
convolution are weight-normalised); this folds them, in place, into the weight they compute now, so the model
computes what it computed, and its state holds ``weight`` instead of ``weight_g``/``weight_v`` or
``parametrizations.weight.original0/1``. Call it on the model before ``prepare_`` and on the skeleton before
``load``, whose state must match the file's.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.nn.utils import parametrize

from .layers import SQSLayer, compressed_names

__all__ = ["plain_weights_"]

log = logging.getLogger(__name__)


def plain_weights_(model: nn.Module) -> list[str]:
    """Fold every parametrization, weight norm, spectral norm or pruning mask of a weight that SQS would compress
    into a plain parameter holding its current value, in place; returns the qualified names of the changed
    tensors (``conv.weight``). Other tensors and layers SQS does not compress are left as they are."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"plain_weights_ needs a torch.nn.Module, got {type(model).__name__}")
    if any(isinstance(m, SQSLayer) for m in model.modules()):
        raise ValueError("plain_weights_ acts on a plain model: call it before prepare_ (and on the skeleton)")
    changed = []
    for module_name, module in model.named_modules():
        for name in compressed_names(module):
            if _fold(module, name):
                changed.append(f"{module_name}.{name}" if module_name else name)
    if changed:
        log.info("plain_weights_: %d weight(s) folded into plain parameters: %s", len(changed), ", ".join(changed))
    return changed


def _fold(module: nn.Module, name: str) -> bool:
    """Fold what computes ``module.<name>`` into a plain parameter; whether anything was there to fold."""
    from torch.nn.utils import prune  # here: importing sqs_core loads no torch module that torch itself does not
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    if parametrize.is_parametrized(module, name):
        parametrize.remove_parametrizations(module, name, leave_parametrized=True)
        return True
    for key, hook in list(module._forward_pre_hooks.items()):
        if getattr(hook, "name", getattr(hook, "_tensor_name", None)) != name:  # pruning names it _tensor_name
            continue
        if isinstance(hook, WeightNorm):
            torch.nn.utils.remove_weight_norm(module, name)
        elif isinstance(hook, SpectralNorm):
            torch.nn.utils.remove_spectral_norm(module, name)
            _drop_spectral_load_hook(module, name)
        elif isinstance(hook, prune.BasePruningMethod):
            prune.remove(module, name)
        else:
            continue
        if key in module._forward_pre_hooks:
            raise RuntimeError(f"internal: the hook computing {name!r} is still registered")
        return True
    return False


def _drop_spectral_load_hook(module: nn.Module, name: str) -> None:
    """remove_spectral_norm leaves its load_state_dict pre-hook (wrapped, so torch's own check misses it), which
    would then ask every state loaded into the module for ``weight_orig``."""
    from torch.nn.utils.spectral_norm import SpectralNormLoadStateDictPreHook

    for key, hook in list(module._load_state_dict_pre_hooks.items()):
        inner = getattr(hook, "hook", hook)
        if isinstance(inner, SpectralNormLoadStateDictPreHook) and inner.fn.name == name:
            del module._load_state_dict_pre_hooks[key]
