"""transformers' fused mixture-of-experts modules, recognised by their contract without importing transformers.

Since transformers 5 a MoE block keeps its experts in one module (``MixtralExperts``, ``Qwen2MoeExperts``,
``Qwen3MoeExperts``, ``OlmoeExperts``, ``GraniteMoeExperts``, ``Llama4TextExperts``, ``GptOssExperts``, ...) holding
each projection as one stacked 3-D parameter, ``gate_up_proj`` of shape (experts, 2·intermediate, hidden) and
``down_proj`` (experts, hidden, intermediate), and no ``nn.Linear`` at all: on such a model ``prepare_`` used to
compress the attention only (a quarter of Mixtral's weights) and leave the experts dense. The decorator that builds
these classes (``transformers.integrations.moe.use_experts_implementation``) sets four boolean flags on every instance
(``has_gate``, ``has_bias``, ``is_transposed``, ``is_concatenated``); a module with those flags and a 3-D parameter is
taken as fused experts. Each 3-D parameter gets a posterior of its own (one codebook over all the experts of the
tensor, as for any weight), and the module's own forward (whichever experts implementation its config picks) runs
with the compressed tensors substituted, as for nn.MultiheadAttention. The 2-D per-expert biases (gpt-oss's
``gate_up_proj_bias``) stay dense, as every bias does.
"""

from __future__ import annotations

from torch import nn

__all__ = ["EXPERT_PARALLEL_HINT", "expert_weights", "is_fused_experts"]

_FLAGS = ("has_gate", "has_bias", "is_transposed", "is_concatenated")

EXPERT_PARALLEL_HINT = (
    "is expert-parallel (transformers' distributed experts: this process holds a shard of them): sqs-core compresses "
    "whole tensors; prepare the model without expert parallelism"
)


def expert_weights(module: nn.Module) -> tuple[str, ...]:
    """The stacked per-expert weight matrices of a fused experts module: its own parameters of three dimensions.
    Public as ``sqs_core.expert_weights``, the ``weight_names`` to register an experts type that transformers'
    decorator does not mark (Llama-4's ``Llama4TextExperts``, JetMoE's ``JetMoeParallelExperts``):
    ``register_layer_type(T, LayerAdapter(None, None, weight_names=sqs_core.expert_weights))``."""
    return tuple(name for name, p in module._parameters.items() if p is not None and p.dim() == 3)


def is_fused_experts(module: nn.Module) -> bool:
    """Whether ``module`` is a transformers fused experts module (its four flags set, a 3-D parameter held)."""
    flags = vars(module)
    return all(isinstance(flags.get(flag), bool) for flag in _FLAGS) and bool(expert_weights(module))


def is_expert_parallel(module: nn.Module) -> bool:
    """Whether transformers' expert parallelism sharded ``module``'s experts over processes."""
    return vars(module).get("_is_expert_parallel") is True
