"""What a training forward of a posterior leaves for the calls after it: θ^avg (and Var) for the other layers of
a tie, and the checks of the pending gate KL's key.

Tied layers (a language model's head and its token embedding) share one posterior. Each layer's call asked it
for θ^avg, so a training forward evaluated the posterior, and its backward recomputed it, once per layer: for
SmolLM2-135M the 28.3M-weight embedding, 21% of the model, twice a step. :class:`SharedMoments` hands the
first call's result to the others while nothing it depends on has changed and its graph has not been through a
backward, so one autograd node takes the sum of the layers' gradients.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Sequence

import torch

log = logging.getLogger(__name__)

__all__ = ["SharedMoments", "sharing_is_safe", "tensor_key"]


def sharing_is_safe() -> bool:
    """Whether a training forward may hand its θ^avg to the tie's other layers: not inside a backward (activation
    checkpointing's recomputation runs the forward there) nor under saved-tensor hooks (its first forward runs
    under them; ``save_on_cpu`` too). A recomputation must save the tensors its first forward saved, so both
    evaluate every layer, as untied layers do. False, the safe answer, where torch lacks either query."""
    try:
        in_backward = torch._C._current_graph_task_id() != -1
        hooked = torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
    except (AttributeError, RuntimeError, TypeError):
        return False
    return not (in_backward or hooked)


def tensor_key(tensors: Sequence[torch.Tensor]) -> tuple:
    """(storage pointer, version) of each tensor: changed by any in-place update through autograd's view of the
    tensor (an optimizer step, ``copy_``, ``load_state_dict``), by replacing it (a new mask buffer, ``.to()``)
    and by ``torch.func.functional_call``'s substitutes."""
    return tuple((t.data_ptr(), t._version) for t in tensors)


class SharedMoments:
    """The last training forward's (θ^avg, Var or None) of one posterior, keyed by what it depends on.

    :meth:`lookup` returns it for an equal key; :meth:`store` keeps a new one and registers a hook on θ^avg that
    drops it when its gradient is computed (a backward consumed the graph: a later forward must build its own).
    Only training forwards (gradients on) of posteriors shared by several layers use it."""

    def __init__(self) -> None:
        self._entry: tuple[tuple, tuple[torch.Tensor, torch.Tensor | None]] | None = None

    def lookup(self, key: tuple) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        entry = self._entry
        if entry is not None and entry[0] == key:
            return entry[1]
        self._entry = None  # stale: free it
        return None

    def store(self, key: tuple, mean: torch.Tensor, var: torch.Tensor | None) -> None:
        self._entry = (key, (mean, var))
        if mean.requires_grad:
            mean.register_hook(functools.partial(_drop_after_backward, weakref.ref(self)))

    def clear(self) -> None:
        self._entry = None


def _drop_after_backward(cache: weakref.ref, grad: torch.Tensor) -> None:
    owner = cache()
    if owner is not None:
        owner.clear()


def pointers(key: tuple) -> list[int]:
    return [entry[0] for entry in key[:4]]  # the storage pointers of SpikeGMMPosterior._kl_key's pairs


@functools.cache
def log_other_tensors() -> None:
    """Once per process (cached): the last forward ran on other tensors than the module's parameters (not the
    same storage, as after an optimizer step, but others: torch.func.functional_call), and the KL is computed
    again from the module's own, not from those the forward used."""
    log.warning(
        "SpikeGMMPosterior.kl(): the last forward used other tensors than the posterior's parameters "
        "(torch.func.functional_call?); the KL is computed from the module's own. To take the KL at the "
        "supplied parameters, compute the objective inside the functional call (a module whose forward "
        "returns objective(nll))"
    )
