"""Training schedules of Appendix "Implementation of SQS".

* :class:`PruningSchedule` — the polynomial (cubic) schedule of Zhu & Gupta (2017): the fraction of
  gates forced to zero ramps as  p_t = p_f · (1 − (1 − progress)³),  progress = (t − t_0)/(t_1 − t_0)
  clipped to [0, 1]; at each update the lowest-λ̃ fraction p_t of all gates (global across layers by
  default) gets mask 0, i.e. λ̃ = 0 in the forward pass and the KL. Masks are recomputed from the raw
  λ̃ at every update, so a pruned weight can return if others fall below it; after t_1 the mask is the
  target's. Starting the ramp after a warm-up (``start_fraction``) lets the gates learn first. Its state
  (the rate of its last update) is ``state_dict()``'s; a fresh schedule whose first ``step(t)`` finds the
  model already pruned (a resumed run) takes the state an uninterrupted run of it had after step t − 1.
* :class:`GateTemperatureSchedule` — τ' is halved after half of the steps. τ'_0 is the prepared config's, so
  τ' at step t depends on t alone: a fresh schedule on a model resumed from a checkpoint (whose τ' buffer
  already holds τ'_0/2) sets the same τ' as an uninterrupted run.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import nn

from ._autocast import without_autocast
from ._checks import check_finite_parameters, check_flag, check_int, check_real
from ._compiled import use_compiled
from .prepare import check_unsharded, posteriors, prepared_config
from .selection import check_nonzero, keep_top_fraction_of_checked

log = logging.getLogger(__name__)

__all__ = ["GateTemperatureSchedule", "PruningSchedule"]


def _check_steps(total_steps: int) -> int:
    return check_int("total_steps", total_steps, 1)


def _check_fraction(name: str, value: float) -> float:
    out = check_real(name, value)
    if not 0.0 <= out <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return out


def _check_step(step: int) -> int:
    """The training step t: an int >= 0 (a float such as NaN would compare False everywhere and do nothing)."""
    return check_int("step", step, 0)


class PruningSchedule:
    """Cubic ramp of the forced-zero gates to ``1 − target_nonzero``; call ``step(t)`` every step.

    An update ranks every gate of the model (exact, ``selection.keep_top_fraction``): about 0.08 s per 16.8M
    gates on a 2-core CPU, 0.055 s where some layer runs the compiled kernels (the ranking pass is then one compiled
    kernel too; the same masks). ``update_every=N`` (Zhu & Gupta's Δt) updates the masks every N steps only, which
    amortises that cost on large models; a pruned weight costs no mixture evaluation in a training step."""

    def __init__(
        self,
        model: nn.Module,
        *,
        target_nonzero: float,
        total_steps: int,
        start_fraction: float = 0.0,
        end_fraction: float = 0.75,
        update_every: int = 1,
        per_layer: bool = False,
    ) -> None:
        prepared_config(model)
        self.target_nonzero = check_nonzero(target_nonzero, name="target_nonzero")
        self.total_steps = _check_steps(total_steps)
        self.start = _check_fraction("start_fraction", start_fraction) * self.total_steps
        self.end = _check_fraction("end_fraction", end_fraction) * self.total_steps
        if self.end < self.start:
            raise ValueError(f"end_fraction ({end_fraction}) must be >= start_fraction ({start_fraction})")
        self.update_every = check_int("update_every", update_every, 1)
        self.per_layer = check_flag("per_layer", per_layer)
        self.model = model
        self.current_nonzero = 1.0
        self._started = False  # False until the first step() or load_state_dict()

    def nonzero_at(self, step: int) -> float:
        """The non-zero rate the schedule asks for at ``step``."""
        step = _check_step(step)
        if step < self.start:
            return 1.0
        span = self.end - self.start
        progress = 1.0 if span == 0 else min(1.0, (step - self.start) / span)
        # target + (1 − target)(1 − progress)³: exactly the target at the end, where 1 − (1 − target)·1 was not
        # (0.30000000000000004 for 0.3), and the mask could keep one weight more or fewer than greedy_(nonzero=target)
        return self.target_nonzero + (1.0 - self.target_nonzero) * (1.0 - progress) ** 3

    @without_autocast
    def step(self, step: int) -> float:
        """Update the masks (every ``update_every`` steps and at the end); returns the current rate."""
        step = _check_step(step)
        if not self._started:
            self._started = True
            if step > 0 and self._model_pruned():
                self.current_nonzero = self._reported_after(step - 1)
                log.info(
                    "PruningSchedule: the model is pruned already; resuming at step %d at rate %.6g",
                    step,
                    self.current_nonzero,
                )
        nonzero = self.nonzero_at(step)
        final = step >= self.end
        if step % self.update_every != 0 and not (final and not math.isclose(nonzero, self.current_nonzero)):
            return self.current_nonzero
        posts = posteriors(self.model)
        check_unsharded(posts)  # FSDP after this schedule was made: torch's own error deep in the ranking
        if nonzero >= 1.0:
            for p in posts.values():
                p.set_mask_(True)
        else:  # ranks as λ̃; pinned rows (always pruned) rank lowest, so the kept count stays exact
            for name, p in posts.items():  # a NaN gate has no rank: it would be kept or pruned arbitrarily
                check_finite_parameters(name, p, ("gate_logits",), "its gates cannot be ranked for pruning")
            scores, divisors = {}, {}  # s̃ / τ' divided chunk by chunk where no row is pinned (they rank as λ̃)
            for name, p in posts.items():
                if p.pinned_zero_rows:
                    scores[name] = p.without_pinned(p.keep_logits().detach(), -math.inf)
                else:
                    scores[name], divisors[name] = p.gate_logits.detach(), p.gate_temperature
            # where some layer runs the compiled kernels, the ranking pass does too (selection)
            compiled = any(use_compiled(p.config.compile_kernels, p.weight) for p in posts.values())
            masks = keep_top_fraction_of_checked(
                scores, nonzero, per_layer=self.per_layer, divisors=divisors, compiled=compiled
            )
            for name, p in posts.items():
                p.set_mask_(masks[name])
        self.current_nonzero = nonzero
        return nonzero

    def _reported_after(self, step: int) -> float:
        """The rate an uninterrupted run of this schedule (``step(0)``, ``step(1)``, ...) holds after ``step(step)``:
        that of its last multiple of ``update_every``, or from the first step past the ramp, the target's."""
        last_update = step - step % self.update_every
        held = self.nonzero_at(last_update)
        if step < self.end or last_update >= self.end:
            return held
        target = self.nonzero_at(step)
        return held if math.isclose(target, held) else target

    def _model_pruned(self) -> bool:
        """Whether any mask prunes a weight other than the pinned rows (which are pruned from the start)."""
        return any(not bool(p.without_pinned(p.mask, True).all()) for p in posteriors(self.model).values())

    def state_dict(self) -> dict[str, float | int | bool]:
        """The schedule's settings and the rate of its last update, for a checkpoint (a resumed run that does
        not load it gets the same rate from :meth:`step`, inferred from the step number)."""
        return {**self._settings(), "current_nonzero": self.current_nonzero}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the rate of :meth:`state_dict`; its settings must be this schedule's (ValueError naming those
        that differ, nothing changed)."""
        if not isinstance(state, dict) or set(state) != {*self._settings(), "current_nonzero"}:
            keys = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"not a PruningSchedule state_dict: got {keys!r}, expected {sorted(self.state_dict())}")
        differ = {k: (state[k], v) for k, v in self._settings().items() if state[k] != v}
        if differ:
            said = ", ".join(f"{k}={got!r} (this schedule: {ours!r})" for k, (got, ours) in differ.items())
            raise ValueError(f"the state_dict is of another PruningSchedule: {said}")
        current = check_nonzero(state["current_nonzero"], name="current_nonzero")
        self.current_nonzero, self._started = current, True

    def _settings(self) -> dict[str, float | int | bool]:
        return {
            "target_nonzero": self.target_nonzero,
            "total_steps": self.total_steps,
            "start_step": self.start,
            "end_step": self.end,
            "update_every": self.update_every,
            "per_layer": self.per_layer,
        }


class GateTemperatureSchedule:
    """τ' ← τ'_0 · ``factor`` once ``step`` ≥ ``at_fraction`` · total_steps (paper: factor ½ at half), with τ'_0
    the gate temperature of each layer's prepared config (not the live buffer, which may already be scaled)."""

    def __init__(self, model: nn.Module, *, total_steps: int, factor: float = 0.5, at_fraction: float = 0.5) -> None:
        prepared_config(model)
        self.total_steps = _check_steps(total_steps)
        self.factor = check_real("factor", factor)
        if not 0.0 < self.factor <= 1.0:
            raise ValueError(f"factor must lie in (0, 1], got {factor!r}")
        self.at = _check_fraction("at_fraction", at_fraction) * self.total_steps
        self.posteriors = list(posteriors(model).values())
        self.initial = [float(p.config.gate_temperature) for p in self.posteriors]
        tiny = torch.finfo(torch.float32).tiny
        if any(tau0 * self.factor < tiny for tau0 in self.initial):
            raise ValueError(
                f"factor={factor!r} takes τ' = gate_temperature·factor below the smallest normal float32 ({tiny:.4g}), "
                f"where 1/τ' overflows; gate_temperature is {min(self.initial)!r}"
            )

    def step(self, step: int) -> float:
        """Set τ' for ``step`` (an int >= 0); returns the factor applied to τ'_0."""
        scale = self.factor if _check_step(step) >= self.at else 1.0
        for p, tau0 in zip(self.posteriors, self.initial, strict=True):
            p.gate_temperature.fill_(tau0 * scale)
        return scale
