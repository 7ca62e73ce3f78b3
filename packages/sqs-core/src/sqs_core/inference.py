"""Inference: greedy (eq. greedy), one posterior draw (eq. infer-theta), deterministic pruning by the
Non-zero quantile of λ̂ (global by default), and Bayesian averaging of M draws (eq. infer-bam)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import torch
from torch import nn

from ._checks import check_finite_parameters, check_flag, check_generator, check_int
from .discrete import DiscretePosterior
from .layers import SQSLayer
from .posterior import SpikeGMMPosterior
from .prepare import posteriors, prepared_config, sqs_layers
from .selection import keep_top_fraction

__all__ = ["BayesianAverage", "discrete_posteriors", "greedy_", "sample_", "variational_"]

log = logging.getLogger(__name__)

# a NaN or inf in any of them would make the greedy levels, the draws or the saved codebook NaN (θ: its bins)
POSTERIOR_PARAMETERS = ("weight", "means", "log_stds", "mixing_logits", "gate_logits")


def _log_revived(posts: dict[str, SpikeGMMPosterior], keep: dict[str, torch.Tensor]) -> None:
    """A warning when ``nonzero`` keeps weights the pruning schedule had forced to zero (trained at λ̃ = 0)."""
    revived = sum(int(p.without_pinned(keep[name] & ~p.mask, False).sum()) for name, p in posts.items())
    if revived:
        total = sum(p.mask.numel() for p in posts.values())
        log.warning(
            "nonzero keeps %d weights (%.2f%% of %d) that the pruning schedule had pruned in training; they are "
            "chosen by their gates before the mask",
            revived,
            100.0 * revived / total,
            total,
        )


@torch.no_grad()
def discrete_posteriors(
    model: nn.Module, *, nonzero: float | None = None, per_layer: bool = False, alternatives: bool = True
) -> dict[str, DiscretePosterior]:
    """The discrete inference distribution of every posterior, with pruning decided.

    ``nonzero`` keeps that fraction of the highest λ̂ (the schedule's forced zeros count as λ̂ = 0);
    None keeps every weight the pruning schedule left on. ``alternatives=False`` keeps no weight's
    alternatives (only the greedy weights can then be drawn), which spares evaluating them: what
    :func:`greedy_` and ``save(include_alternatives=False)`` ask for.
    """
    check_flag("alternatives", alternatives)
    check_flag("per_layer", per_layer)
    prepared_config(model)
    posts = posteriors(model)
    for name, p in posts.items():
        check_finite_parameters(name, p, POSTERIOR_PARAMETERS, "it cannot be turned into weights")
    if nonzero is None:
        keep = {name: p.mask.clone() for name, p in posts.items()}
    else:
        scores = {name: p.pruning_keys() for name, p in posts.items()}  # ranks as λ̂, ties by λ̃ before the mask
        keep = keep_top_fraction(scores, nonzero, per_layer=per_layer)
        _log_revived(posts, keep)
    out = {}
    for name, p in posts.items():
        greedy, (alt_index, alt_probs) = p.levels_and_alternatives(alternatives=alternatives)  # one pass
        out[name] = DiscretePosterior(
            shape=tuple(p.weight.shape),
            codebook=p.means.detach().to(p.weight_dtype, copy=True),  # the levels as the layer stores weights
            window_ids=p.window_ids.reshape(-1),
            greedy=greedy.reshape(-1),
            keep=p.without_pinned(keep[name], False).reshape(-1),
            alt_index=alt_index,
            alt_probs=alt_probs,
        )
    return out


@dataclass(frozen=True)
class LayerSetter:
    """Fixes the weight of the SQS layers ``names`` (the layers sharing one posterior) of the model it is given:
    names, not the layers themselves, so that a copy of a BayesianAverage (deepcopy, torch.save) sets its own
    model's layers."""

    names: tuple[str, ...]

    def __call__(self, model: nn.Module, weight: torch.Tensor) -> None:
        for name in self.names:
            cast(SQSLayer, model.get_submodule(name)).set_fixed_weight(weight)


def _setters(model: nn.Module) -> dict[str, LayerSetter]:
    """For each posterior (by name), the setter of every layer sharing it."""
    names = {id(p): name for name, p in posteriors(model).items()}
    groups: dict[str, list[str]] = {}
    for layer_name, layer in sqs_layers(model).items():
        groups.setdefault(names[id(layer.posterior)], []).append(layer_name)
    return {name: LayerSetter(tuple(layers)) for name, layers in groups.items()}


def greedy_(model: nn.Module, *, nonzero: float | None = None, per_layer: bool = False) -> nn.Module:
    """Fix every SQS layer to its greedy sparse quantized weight μ_{k*} (eq. greedy); returns model."""
    setters = _setters(model)
    for name, d in discrete_posteriors(model, nonzero=nonzero, per_layer=per_layer, alternatives=False).items():
        setters[name](model, d.weights())
    return model


def sample_(
    model: nn.Module,
    *,
    nonzero: float | None = None,
    generator: torch.Generator | None = None,
    per_layer: bool = False,
) -> nn.Module:
    """Fix every SQS layer to one draw from the discrete posterior (eq. infer-theta); returns model."""
    check_generator("generator", generator)
    setters = _setters(model)
    for name, d in discrete_posteriors(model, nonzero=nonzero, per_layer=per_layer).items():
        setters[name](model, d.weights(d.draw(generator)))
    return model


def variational_(model: nn.Module) -> nn.Module:
    """Return every SQS layer to the variational (training) forward."""
    prepared_config(model)
    for layer in sqs_layers(model).values():
        layer.set_variational()
    return model


class BayesianAverage(nn.Module):
    """ŷ = (1/M) Σ_m f(x; θ̃^m) (eq. infer-bam) over M draws made once, at construction, from
    ``generator`` (so every batch sees the same M models). ``average="probs"`` averages softmax
    probabilities over the last dimension instead of raw outputs (a class dimension elsewhere, as in a
    segmentation model's (N, C, H, W): ``output=lambda out: out.movedim(1, -1)``). ``output`` takes the model's
    output to the tensor averaged, for models whose output is not a tensor (``lambda out: out.logits`` for a
    transformers model, whose output is a ``ModelOutput``; ``lambda out: out[0]`` for a tuple). A forward sets
    each draw's weights in turn and then puts the model's layers back as they were (variational, or their fixed
    weights), so the wrapped model can go on training or be evaluated on its own."""

    def __init__(
        self,
        model: nn.Module,
        *,
        samples: int = 4,
        nonzero: float | None = None,
        generator: torch.Generator | None = None,
        per_layer: bool = False,
        average: str = "outputs",
        output: Callable[[Any], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        check_arguments(samples, generator, average, output)
        dists = discrete_posteriors(model, nonzero=nonzero, per_layer=per_layer)
        self._init(model, dists, _setters(model), samples, generator, average, output)
        self._snapshot: Callable[[nn.Module], Callable[[], None]] = _layer_modes

    def _init(self, model, dists, setters, samples, generator, average, output) -> None:
        self.model = model
        self.average, self.output = average, output
        self._dists = dists
        self._setters = setters
        self.draws = [{name: d.draw(generator) for name, d in dists.items()} for _ in range(samples)]
        self._warned_training = False

    @classmethod
    def from_parts(cls, model, dists, setters, *, samples=4, generator=None, average="outputs", output=None):
        """Build from discrete posteriors and weight setters (used by ``sqs_core.load_bayesian_average``);
        a forward leaves the greedy weights set."""
        check_arguments(samples, generator, average, output)
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self._init(model, dists, setters, samples, generator, average, output)
        self._snapshot = partial(_greedy_restorer, dists, setters)
        return self

    @torch.no_grad()
    def forward(self, *args, **kwargs) -> torch.Tensor:
        if self.model.training and not self._warned_training:
            self._warned_training = True  # once per wrapper
            log.warning(
                "BayesianAverage: the model is in training mode, so each of its %d forwards uses (and updates) "
                "batch-norm batch statistics and applies dropout; call model.eval() for inference",
                len(self.draws),
            )
        total = None
        restore = self._snapshot(self.model)
        try:
            for levels in self.draws:
                for name, d in self._dists.items():
                    self._setters[name](self.model, d.weights(levels[name]))
                out = self._averaged_part(self.model(*args, **kwargs))
                if self.average == "probs":
                    out = torch.softmax(out, dim=-1)
                total = out if total is None else total + out
        finally:
            restore()
        if total is None:
            raise RuntimeError("BayesianAverage holds no draws")
        return total / len(self.draws)

    def _averaged_part(self, out: Any) -> torch.Tensor:
        """The tensor of one draw's output that is averaged: ``output(out)``, or ``out`` itself."""
        part = out if self.output is None else self.output(out)
        what = "output(model output)" if self.output is not None else "the model's output"
        if not (isinstance(part, torch.Tensor) and (part.is_floating_point() or part.is_complex())):
            hint = "" if self.output is not None else "; pass output= to pick it (e.g. lambda out: out.logits)"
            raise ValueError(f"BayesianAverage averages a floating-point tensor, but {what} is {_describe(part)}{hint}")
        if self.average == "probs" and (part.dim() == 0 or part.is_complex()):
            kind = "a 0-d" if part.dim() == 0 else "a"
            raise ValueError(
                'BayesianAverage(average="probs") takes a softmax over the last dimension of real scores, but '
                f'{what} is {kind} {part.dtype} tensor; average the outputs instead (average="outputs")'
            )
        return part


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor"
    return f"a {type(value).__module__}.{type(value).__qualname__}"


def check_arguments(samples, generator, average, output=None) -> None:
    """BayesianAverage's own arguments (also checked by ``load_bayesian_average`` before it loads)."""
    check_int("samples (M)", samples, 1)
    check_generator("generator", generator)
    if average not in ("outputs", "probs"):
        raise ValueError(f"average must be 'outputs' or 'probs', got {average!r}")
    if output is not None and not callable(output):
        raise ValueError(f"output must be None or a callable taking the model's output to a tensor, got {output!r}")


def _layer_modes(model: nn.Module) -> Callable[[], None]:
    """A function that puts every SQS layer of ``model`` back in its present mode (and fixed weight)."""
    saved = [(layer, layer.fixed_weight) for layer in sqs_layers(model).values()]

    def restore() -> None:
        for layer, weight in saved:
            if weight is None:
                layer.set_variational()
            else:
                layer.set_fixed_weight(weight)

    return restore


def _greedy_restorer(dists, setters, model: nn.Module) -> Callable[[], None]:
    """A function that sets the greedy weights of ``model`` again (a skeleton loaded by load_bayesian_average)."""

    def restore() -> None:
        for name, d in dists.items():
            setters[name](model, d.weights())

    return restore
