"""The weights ``prepare_`` leaves dense because no adapter knows their module's type, said when it prepares.

A model whose weights sit in modules sqs-core does not know (a custom block holding ``nn.Parameter`` matrices, an
MoE's experts in a type of its own) was prepared without a word about them: its file then holds them at full
precision, and only ``compression_report`` showed it. ``prepare_`` now logs them by type, as a WARNING when they
are at least :data:`WARN_SHARE` of the model's weights (parameters of two or more dimensions; biases, norms and
scales are not counted), else at INFO. Layers of a supported type that ``include`` / ``exclude`` / ``skip`` leave
dense are the user's choice and not reported.
"""

from __future__ import annotations

import logging

from torch import nn

from .layers import adapter_for, compressed_names

__all__ = ["WARN_SHARE", "DenseWeights", "dense_weights", "log_dense_weights"]

log = logging.getLogger("sqs_core.prepare")

WARN_SHARE = 0.05

DenseWeights = tuple[int, dict[str, tuple[list[str], int]]]  # (all weights, {type: (parameter names, weights)})


def dense_weights(model: nn.Module) -> DenseWeights:
    """(number of weights, {module type: (its parameter names, their weights)}) of the distinct parameters of two
    or more dimensions held by modules of types no adapter knows."""
    modules = list(model.modules())
    known = {id(m) for m in modules if adapter_for(m) is not None}
    compressible = {id(getattr(m, n)) for m in modules if id(m) in known for n in compressed_names(m)}
    seen: set[int] = set()
    total = 0
    dense: dict[str, tuple[list[str], int]] = {}
    for module in modules:
        for name, param in module._parameters.items():
            if param is None or param.dim() < 2 or id(param) in seen:
                continue
            seen.add(id(param))
            total += param.numel()
            if id(module) in known or id(param) in compressible:
                continue
            names, count = dense.get(type(module).__name__, ([], 0))
            dense[type(module).__name__] = (names if name in names else [*names, name], count + param.numel())
    return total, dense


def log_dense_weights(found: DenseWeights) -> None:
    """One log line naming the types whose weights stay dense, with their share of the model's weights."""
    total, dense = found
    left = sum(count for _, count in dense.values())
    if not left:
        return
    share = left / total
    parts = ", ".join(
        f"{kind} ({', '.join(names)}: {count / total:.1%})"
        for kind, (names, count) in sorted(dense.items(), key=lambda item: -item[1][1])
    )
    log.log(
        logging.WARNING if share >= WARN_SHARE else logging.INFO,
        "prepare_: %.1f%% of the model's weights (%d of %d, in parameters of 2+ dimensions) stay dense in modules of "
        "types sqs-core does not compress: %s. To compress one, register its type: sqs_core.register_layer_type("
        "Type, sqs_core.LayerAdapter(None, None, weight_names=names_of)), names_of(module) giving the parameters "
        "(a module-level function, so that the model pickles; sqs_core.expert_weights names a module's 3-D "
        "parameters, stacked experts); its own forward then runs with them compressed",
        100 * share,
        left,
        total,
        parts,
    )
