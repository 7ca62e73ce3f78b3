"""The eager training step's certified and settled weights: their w·K + k* entries, moments and gradients.

A certified weight (:mod:`sqs_core.onehot`) has φ one-hot at k*: m = μ_{k*}, s = μ_{k*}² + σ_{k*}². A weight of a
settled all-lumped bin (onehot.LUMPED_SETTLED, :mod:`sqs_core._settled`) has φ = 1/K and its bin's k*: m = Σ_k μ_k / K,
s = Σ_k (μ_k² + σ_k²) / K. Either is one lookup in the (2·W·K,) tables of :func:`sqs_core._settled.level_tables` at
the entry w·K + k* + W·K·[settled], and its gradients are sums at the same entry into doubled float64 accumulators,
folded per window after the backward's loop (:func:`sqs_core._settled.fold_settled`), as the compiled step does
(sqs_core._fused). Until session 43 the eager step evaluated settled weights as all-lumped blocks (an index of them
kept from forward to backward, gathers of their θ, window and gradients, four columns each for k*): a quarter of the
4096² layer's kept weights late in training (docs/method.md, "Session 43").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._index_add import index_add_all
from ._settled import fold_settled, level_tables
from .onehot import CERTIFIED, LUMPED_SETTLED

__all__ = ["OneHotLevels", "OneHotSums", "one_hot_grads", "one_hot_workspace"]

_NARROW_IDS = (torch.uint8, torch.int16, torch.int32)  # window ids whose sum with int32 levels stays int32
ONE_HOT_BIT = 7
"""The classes (onehot.classify) CERTIFIED (255) and LUMPED_SETTLED (254) are the ones with this bit set (every other
is a width < 128): ``classes >> 7`` is 1 exactly where a weight is one-hot or settled, a uint8 factor (a comparison
to a bool and a float × bool product took 0.48 ms per 2^20 on the CPU against 0.12 ms; session 43)."""
assert CERTIFIED >> ONE_HOT_BIT == LUMPED_SETTLED >> ONE_HOT_BIT == 1 and LUMPED_SETTLED & 1 == 0 and CERTIFIED & 1 == 1


def one_hot_workspace(n, second, with_kl, device):
    """The int64 and float64 buffers a backward's one-hot sums of ``n`` weights take (index_add_all's index and
    sources): the entry w·K + k* (+ W·K where settled), ∂/∂μ, ∂/∂log σ (``second``, else None) and λ̃ (``with_kl``,
    else None). One set serves every chunk of a backward: fresh 8-byte outputs per chunk made glibc map and zero
    new pages again and again (eager 4096² step: 25k of its 181k page faults, docs/method.md "Session 42")."""

    def empty(dtype=torch.float64):
        return torch.empty(n, dtype=dtype, device=device)

    return empty(torch.int64), empty(), (empty() if second else None), (empty() if with_kl else None)


def _flat_index(window_ids: torch.Tensor, levels: torch.Tensor, k: int, dtype=torch.int32, out=None) -> torch.Tensor:
    """w·K + k: the index of each weight's component in the flattened (W, K) parameters, as ``dtype``: int32 for
    gathers (``index_select`` took 0.69 against 0.83 ms per 2^20 int64 indices), int64 for index_add_all (its
    ``scatter_add_`` takes no other). Formed in int32 and converted: AVX2 has no int64 multiply (emulated lane
    by lane), and the int64 arithmetic took 2.1 against 0.35 ms per 2^20 weights eagerly and the compiled
    one-hot backward kernel (sqs_core._fused, which traces this function) from 3.1–3.8 to 6.7–7.0 ms a chunk.
    One ``add`` with ``alpha`` = K converts the window ids inside its loop (int32 + uint8 → int32): no int32 copy of
    them and no product tensor (0.2–0.3 against 0.6–0.8 ms per 2^20 weights eagerly, session 41); eager only."""
    # traced (inductor fuses it anyway), a 0-d K (alpha takes a number) or int64 ids: the product form
    if torch.compiler.is_compiling() or isinstance(k, torch.Tensor) or window_ids.dtype not in _NARROW_IDS:
        flat = window_ids.int() * k + levels.int()
    else:
        flat = torch.add(levels.int(), window_ids, alpha=k)
    if out is not None:  # an int64 buffer (one_hot_workspace): no fresh T-sized int64 index per chunk
        return out.copy_(flat)
    return flat if dtype == torch.int32 else flat.to(dtype)


@dataclass(frozen=True)
class OneHotLevels:
    """The (2·W·K,) tables of :func:`~sqs_core._settled.level_tables` (no graph): ``levels``, m at an entry (μ_k,
    then each window's Σ_k μ_k / K); ``spreads``, s − m² where certified (σ_k²) and s where settled; and the
    factor of ∂L/∂Var λ̃ in ∂/∂log σ at an entry (2σ_k², then 1: the settled ∂L/∂s, folded per window); W·K, K."""

    levels: torch.Tensor
    spreads: torch.Tensor | None
    log_std_factors: torch.Tensor | None
    components: int
    k: int

    @classmethod
    def build(cls, means, log_stds, second: bool) -> OneHotLevels:
        levels, spreads = level_tables(means, log_stds, second)
        factors = None
        if spreads is not None:
            wk = means.numel()
            factors = torch.cat([2 * spreads[:wk], torch.ones_like(spreads[wk:])])
        return cls(levels, spreads, factors, means.numel(), means.shape[1])

    def entries(self, window_ids, kstar, classes):
        """(int32 entries w·K + k* + W·K·[settled], settled as uint8 0/1) of weights of ``classes`` (classify's)."""
        settled = (classes >> ONE_HOT_BIT) & ~classes  # 1 at LUMPED_SETTLED (254) only: faster than a comparison
        return _flat_index(window_ids, kstar, self.k).add_(settled, alpha=self.components), settled

    def second_moment(self, m, entry, settled):
        """s at the ``entry``s of weights whose m is ``m``: m² + σ_{k*}² where certified, the window's
        Σ_k (μ_k² + σ_k²) / K where ``settled`` (the compiled forward's m² (1 − settled) + spread, bit for bit)."""
        assert self.spreads is not None  # built with second
        return (m * m).mul_(settled ^ 1).add_(self.spreads.index_select(0, entry))

    def moments(self, entry, settled, second):
        """(m, s or None) of a one-hot or settled weight at its entry."""
        m = self.levels.index_select(0, entry)
        return m, (self.second_moment(m, entry, settled) if second else None)


def one_hot_grads(accumulators, entry, settled, on, values, levels: OneHotLevels, buffers):
    """The (accumulator, index, values) sums of the certified and settled weights' gradients for
    :func:`~sqs_core._index_add.index_add_all`, into the doubled float64 ``accumulators`` (∂/∂μ, ∂/∂log σ or None) at
    the int64 ``entry``: certified, ∂θ^avg/∂μ_{k*} = λ̃ and with Var = λ̃ (μ² + σ²) − (λ̃ μ)² also
    ∂Var/∂μ = 2 λ̃ μ (1 − λ̃), ∂Var/∂log σ = 2 λ̃ σ²; settled, ∂L/∂m = G_m (sqs_core._nearby.cotangents) and
    ∂L/∂s = ∂L/∂Var λ̃, which :func:`sqs_core._settled.fold_settled` takes to every component of the window.
    ``on``: λ̃ where certified or settled, else 0 (uncovered weights' gradients come from their blocks);
    ``values``: (∂L/∂θ^avg, ∂L/∂Var or None, λ̃, m); the float64 sources go into ``buffers`` (:func:`one_hot_workspace`'s
    ∂/∂μ, ∂/∂log σ or None)."""
    (g_means, g_log_stds), (gm, gv, lam, m) = accumulators, values
    if gv is None:  # the float32 product written as float64 in one pass (the same bits as a product, then a copy)
        return [(g_means, entry, torch.mul(gm, on, out=buffers[0]))]
    assert levels.log_std_factors is not None  # built with second
    gv = gv * on
    dm = gm * on + 2 * gv * m * (settled ^ 1).to(lam.dtype).sub_(lam)  # (1 − settled) − λ̃, as compiled
    d_log_std = gv * levels.log_std_factors.index_select(0, entry)
    return [(g_log_stds, entry, buffers[1].copy_(d_log_std)), (g_means, entry, buffers[0].copy_(dm))]


class OneHotSums:
    """One backward's sums of the certified and settled weights' gradients, chunk by chunk (:meth:`add`), into
    doubled float64 accumulators (∂/∂μ; ∂/∂log σ with Var; Σ λ̃ per component with the gate KL) at their entries,
    folded into the parameters' gradients once at the end (:meth:`into`). ``size``: the largest chunk."""

    def __init__(self, means, log_stds, second: bool, component_kl, with_kl: bool, size: int):
        self.means, self.log_stds, self.second = means, log_stds, second
        self.levels = OneHotLevels.build(means, log_stds, second)
        device, doubled = means.device, 2 * means.numel()

        def zeros(wanted):
            return torch.zeros(doubled, dtype=torch.float64, device=device) if wanted else None

        self.halves = [zeros(True), zeros(second), zeros(with_kl)]
        self.kl_table = component_kl.detach().reshape(-1).repeat(2) if with_kl else None  # KL_{w,k*} at every entry
        self.workspace = one_hot_workspace(size, second, with_kl, device)

    def add(self, window_ids, kstar, classes, grad_mean, grad_var, lam):
        """Sum one chunk's certified and settled gradients (∂L/∂θ^avg, ∂L/∂Var or None, λ̃ of its weights); return
        (m, s or None, KL_{w,k*} or None) of each weight as if one-hot or settled (the caller overwrites the
        uncovered weights' m and s)."""
        n = window_ids.numel()
        index, *sources = (None if w is None else w[:n] for w in self.workspace)
        assert index is not None  # the workspace's int64 buffer is always there
        entry, settled = self.levels.entries(window_ids, kstar, classes)
        # int64 for index_add_all, and for the small tables' gathers too: on session 43's AMD EPYC 0.33 against
        # 0.52 ms per 2^20 by the int32 entries
        index.copy_(entry)
        m, s = self.levels.moments(index, settled, self.second)
        on = lam * (classes >> ONE_HOT_BIT)  # λ̃ where certified or settled (:data:`ONE_HOT_BIT`), else 0: the same bits
        values = (grad_mean, grad_var, lam, m)
        sums = one_hot_grads(self.halves[:2], index, settled, on, values, self.levels, sources[:2])
        ck = None
        if self.kl_table is not None:
            ck = self.kl_table.index_select(0, index)
            assert sources[2] is not None  # the workspace has λ̃'s buffer whenever the KL is summed
            sums.append((self.halves[2], index, sources[2].copy_(lam)))
        index_add_all(sums)
        return m, s, ck

    def into(self, param_grads, g_comp) -> None:
        """Fold the sums into ``param_grads`` (∂/∂μ, ∂/∂log σ flat float64) and ``g_comp`` (Σ λ̃, or None)."""
        fold_settled((*param_grads[:2], g_comp), self.halves, self.means, self.log_stds)
