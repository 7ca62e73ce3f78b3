"""Writing a new pruning mask into the mask buffer in place (SpikeGMMPosterior.set_mask_), when that is safe.

A new T-byte buffer every schedule step left a hole in glibc's heap each time (bool tensors under its mmap
threshold live in the heap), which grew and stayed grown; writing into the buffer avoids it when no other tensor
shares its storage (docs/method.md, "Session 42"). A forward's k* of a pruned weight is its bin's best, not its
argmax, so a weight that returns makes the forward's k* stale: :func:`any_returning` tells, before the write.
"""

from __future__ import annotations

import torch

__all__ = ["any_returning", "sole_owner"]


def sole_owner(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` alone holds its storage: no view of it, no autograd graph that saved it (a saved view or a
    forward's pending gate KL), no state dict's detached alias. An in-place write into it is then seen by nobody
    else. False where this torch cannot tell (no ``torch._C._storage_Use_Count``) and for tensor subclasses."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None or type(tensor) is not torch.Tensor:
        return False
    storage = tensor.untyped_storage()
    return bool(count(storage._cdata) == 2)  # ``tensor``'s own reference and ``storage``'s


def any_returning(new: torch.Tensor, old: torch.Tensor, chunk: int = 1 << 20) -> bool:
    """Whether a bool mask ``new`` keeps a weight ``old`` pruned, compared ``chunk`` entries at a time (no T-sized
    temporary). A forward's k* of a pruned weight is its bin's best, not its argmax (onehot.classify's keep)."""
    pairs = zip(new.reshape(-1).split(chunk), old.reshape(-1).split(chunk), strict=True)
    return any(bool(torch.gt(n, o).any()) for n, o in pairs)
