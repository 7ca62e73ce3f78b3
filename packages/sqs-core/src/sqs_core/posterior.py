"""The spike-and-GMM variational posterior of one weight tensor (eq. marginal_vb).

    q(θ̃_i) = λ̃_i Σ_k φ_k(θ_i) N(μ_k, σ_k²) + (1 − λ̃_i) δ_0,   λ̃_i = sigmoid(s̃_i / τ')

θ (``weight``) is the fixed pretrained tensor (a buffer; a parameter with ``train_weight``). Each window
w has its own K components: ``means`` μ, ``log_stds`` log σ and ``mixing_logits`` (π = softmax) of
shape (W, K). ``gate_logits`` s̃ has θ's shape. ``mask`` is the pruning schedule's hard mask: a weight
with mask 0 has λ̃ = 0 in the forward pass and in the KL (it is pruned); ``pinned_zero_rows`` (an embedding's
padding row, zero in the layer) stay pruned whatever the schedule or inference asks. For a float16 or bfloat16 layer
all of these are float32 (θ upcast exactly); the layer's forward runs in its own dtype (``weight_dtype``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ._autocast import without_autocast
from ._checks import F32_STD_MIN, check_int
from ._compile_guard import eager_under_torch_compile
from ._compiled import use_compiled
from ._forward_cache import SharedMoments, log_other_tensors, pointers, sharing_is_safe, tensor_key
from ._gate_kl import gate_kl
from ._load_settings import compare_settings, settings_tensor
from ._mask_write import any_returning, sole_owner
from ._posterior_init import initial_gate_logits, initial_mixtures
from ._window_load import take_pinned_rows, take_window_count
from .chunked import (
    PosteriorSpec,
    certified_levels,
    posterior_moments,
    responsibility_blocks,
    uncertain_log_responsibilities,
)
from .config import SpikeSlabPrior, SQSConfig
from .kmeans import order_keys
from .mixture import gaussian_kl
from .onehot import check_finite_range, window_value_ranges

log = logging.getLogger(__name__)

__all__ = ["SAMPLING_FLOOR", "SpikeGMMPosterior"]

# Responsibilities below this are treated as exactly zero by the discrete inference distribution
# (eq. infer-theta), so a weight is "one-hot" when only one φ_k reaches it. The artifact stores the
# alternatives of the other weights with the same rule, so sampling from a file and from memory agree.
SAMPLING_FLOOR = 1e-3
# log σ's floor where the posterior is evaluated: σ ≥ √tiny(float32) ≈ 1.08e-19, K-means' floor (σ² normal).
# Below about e^-88.7, 1/σ overflows float32 and every gradient of the layer's μ and log σ is NaN.
LOG_STD_MIN = math.log(F32_STD_MIN)
# log σ's ceiling, the floor mirrored (σ ≤ 1/√tiny ≈ 9.2e18, σ² ≈ 8.5e37 a finite float32): an optimizer step too
# large for the loss once put log σ past 88.7, where σ = inf and its component's gradients 0·inf = NaN.
LOG_STD_MAX = -LOG_STD_MIN
_HALF = (torch.float16, torch.bfloat16)


class SpikeGMMPosterior(nn.Module):
    """Parameters and closed forms of q for one weight tensor; see the module docstring."""

    weight: torch.Tensor  # θ: a buffer, or a Parameter when config.train_weight; at least float32
    dtype_probe: torch.Tensor  # empty, of the wrapped layer's dtype (see weight_dtype)
    window_ids: torch.Tensor
    window_edges: torch.Tensor
    mask: torch.Tensor  # the pruning schedule's hard mask (bool)
    gate_temperature: torch.Tensor  # τ' as a 0-d buffer (halved by GateTemperatureSchedule)
    layer_name: str = ""  # the model's name for its (first) layer, for messages: set by prepare_ (a class default for
    # posteriors pickled before session 65)
    settings: torch.Tensor  # the config's settings a load compares (sqs_core._load_settings), JSON as uint8
    sharers: int = 1  # the SQS layers that share this posterior (tied weights); prepare_ sets it

    def __init__(self, weight: torch.Tensor, config: SQSConfig, *, generator: torch.Generator) -> None:
        super().__init__()
        # float16/bfloat16 weights: the posterior is kept and computed in float32 (the certificate's bins and
        # the paper's exp(π N) need it); the layer casts θ^avg and fixed weights back (SQSLayer)
        weight_dtype = weight.dtype if weight.is_floating_point() else torch.float32
        theta = weight.detach().to(torch.promote_types(weight_dtype, torch.float32))
        inits, window_ids, edges = initial_mixtures(theta, config, generator)
        dev, dtype = theta.device, theta.dtype
        self.means = nn.Parameter(torch.stack([i.means for i in inits]).to(dev, dtype))  # K-means' float64 rounded
        self.log_stds = nn.Parameter(torch.stack([i.stds for i in inits]).to(dev, dtype).log())
        self.mixing_logits = nn.Parameter(torch.stack([i.mixing for i in inits]).to(dev, dtype).log())
        self.gate_logits = nn.Parameter(initial_gate_logits(theta, config).to(dtype))
        if config.train_weight:
            self.weight = nn.Parameter(theta)
        else:
            self.register_buffer("weight", theta)
        self.register_buffer("window_ids", window_ids.to(dev))
        self.register_buffer("window_edges", edges.to(dev, dtype))
        self.register_buffer("mask", torch.ones(theta.shape, dtype=torch.bool, device=dev))
        self.register_buffer("gate_temperature", torch.tensor(float(config.gate_temperature), device=dev))
        self.register_buffer("settings", settings_tensor(config, dev))  # compared on load (_load_settings)
        # an empty tensor whose dtype is the layer's: model.to(dtype), .float() and .half() move it along
        self.register_buffer("dtype_probe", torch.empty(0, dtype=weight_dtype, device=dev), persistent=False)
        self.config = config
        self.pinned_zero_rows: tuple[int, ...] = ()  # rows of θ (dim 0) that are always pruned: pin_zero_rows_
        self.register_load_state_dict_post_hook(self._pin_after_load)
        self.register_load_state_dict_pre_hook(take_window_count)  # outlier windows: W varies
        self.register_load_state_dict_pre_hook(take_pinned_rows)  # a checkpoint from before they were saved
        self.register_load_state_dict_pre_hook(compare_settings)
        self._kstar: torch.Tensor | None = None
        self._pending_kl: tuple[torch.Tensor, tuple] | None = None  # (KL of the last forward, _kl_key then)
        self._ranges_key: tuple | None = None
        self._ranges = torch.zeros(0)
        self._shared = SharedMoments()  # a tie's other layers take the first one's θ^avg (sqs_core._forward_cache)

    def __getstate__(self) -> dict:
        """The state to pickle or deepcopy, without the last forward's caches: its KL is part of that forward's
        autograd graph, which ``copy.deepcopy`` refuses to copy. A copy's :meth:`kl` computes the KL afresh."""
        state = dict(super().__getstate__())
        state["_pending_kl"], state["_kstar"], state["_shared"] = None, None, SharedMoments()
        return state

    # -- shapes and simple closed forms ---------------------------------------------------------
    @property
    def num_windows(self) -> int:
        return int(self.means.shape[0])

    @property
    def num_components(self) -> int:
        return int(self.means.shape[1])

    def spec(self) -> PosteriorSpec:
        prior = self.config.prior
        spike_var = prior.slab_std**2 if prior.kind == "gaussian" else 0.0
        return PosteriorSpec(
            kind=self.config.responsibility,
            temperature=self.config.temperature,
            gate_temperature=float(self.gate_temperature),
            spike_variance=spike_var,
            compiled=use_compiled(self.config.compile_kernels, self.weight),
            prior_keep=prior.keep_prob if isinstance(prior, SpikeSlabPrior) else None,
        )

    def keep_probs(self) -> torch.Tensor:
        """λ̃ = sigmoid(s̃ / τ') (eq. lambda-prime), differentiable, θ's shape."""
        return torch.sigmoid(self.gate_logits / self.gate_temperature)

    def keep_logits(self) -> torch.Tensor:
        """s̃ / τ' = logit λ̃: ranks weights exactly as λ̃ does, but never saturates. Pruning ranks these,
        not λ̃: in float32 sigmoid rounds to exactly 1.0 beyond ≈ 17, and the gates of a trained model
        routinely pass that, which would turn the ranking into ties broken by position."""
        return self.gate_logits / self.gate_temperature

    @torch.no_grad()
    def effective_keep_probs(self) -> torch.Tensor:
        """λ̂ used for pruning at inference: λ̃ with the schedule's forced zeros."""
        return self.keep_probs() * self.mask

    @torch.no_grad()
    def effective_keep_logits(self) -> torch.Tensor:
        """logit λ̂, the inference pruning score: s̃ / τ', and −inf where the schedule forced a zero."""
        return torch.where(self.mask, self.keep_logits(), float("-inf"))

    @torch.no_grad()
    def pruning_keys(self) -> torch.Tensor:
        """int64 keys (θ's shape) that rank as λ̂ and break its ties: every weight the mask keeps above every
        one it prunes, each group ordered by s̃ / τ' (the pruned ones by the λ̃ they had before the mask; their
        λ̂ ties at 0, which inference used to break by position), the pinned rows lowest: the float32 logit's
        :func:`~sqs_core.kmeans.order_keys`, offset by the mask."""
        keys = order_keys(self.keep_logits().float()).long() + (self.mask.long() << 33)
        return self.without_pinned(keys, -(1 << 40))

    @torch.no_grad()
    def pin_zero_rows_(self, rows: Sequence[int]) -> None:
        """Prune these rows of θ (along dim 0; added to those pinned already) for good: their mask is 0 now, after
        every pruning-schedule update and state-dict load, and in every inference keep pattern, so they stay
        exactly zero. ``prepare_`` pins an ``nn.Embedding``'s ``padding_idx`` row when it is zero (the lookup
        gives the padding token a zero vector and no gradient)."""
        checked = [check_int("row to pin", r, 0) for r in rows]
        if any(r >= self.weight.shape[0] for r in checked):
            raise ValueError(f"rows to pin must lie in [0, {self.weight.shape[0]}), got {list(rows)!r}")
        self.pinned_zero_rows = tuple(sorted({*self.pinned_zero_rows, *checked}))
        self._prune_pinned()

    def get_extra_state(self) -> torch.Tensor:
        """The pinned rows (int64, sorted) as the state dict's ``_extra_state``: a model prepared from another
        init (whose padding row is zero where the checkpoint's was not, or the reverse) takes the checkpoint's.
        One tensor while the rows stay, so that a tie's layers, which share this posterior, hold it as an alias
        (sqs_core._ties.declare_tie_aliases), as they hold its other tensors."""
        rows = self.pinned_zero_rows
        held = self.__dict__.get("_pinned_state")
        if held is None or held[0] != rows:
            held = self.__dict__["_pinned_state"] = (rows, torch.tensor(rows, dtype=torch.int64))
        return held[1]

    def set_extra_state(self, state: Any) -> None:
        """load_state_dict's: the checkpoint's pinned rows (checked by :func:`take_pinned_rows` before); None (a
        checkpoint without them, or a tie's alias left out of it) keeps the rows this posterior has."""
        if state is not None:
            self.pinned_zero_rows = tuple(sorted({int(r) for r in state.tolist()}))

    def _pin_after_load(self, module: nn.Module, incompatible_keys: Any) -> None:
        """load_state_dict's post hook: a loaded mask gets the pinned rows pruned again; the last forward's k*
        (of other parameters, and only its bin's best for a weight pruned then) is dropped."""
        self._prune_pinned()
        self._kstar = None

    @torch.no_grad()
    def set_mask_(self, keep: torch.Tensor | bool) -> None:
        """Set the pruning mask to ``keep`` (a bool tensor of θ's shape, or True for all), the pinned rows pruned.
        Written into the mask buffer when no other tensor shares its storage (:func:`sole_owner`: no view, no saved
        tensor of a pending backward, no state dict's alias; a reference to the buffer itself sees the new mask, as
        for any buffer updated in place); else a new buffer, so a forward's backward keeps the mask that forward
        used (the schedule may step between the two; an in-place write failed that backward with autograd's error).
        A new T-byte buffer every schedule step fragmented glibc's heap and raised a step's peak RSS by about 55 MiB
        on the 4096² layer (docs/method.md, "Session 42")."""
        old = self.mask
        new = self.without_pinned(torch.broadcast_to(torch.as_tensor(keep, device=old.device), old.shape), False)
        returning = self._kstar is not None and any_returning(new, old)  # before an in-place write
        self.mask = (old if sole_owner(old) else torch.empty_like(old)).copy_(new)
        self._pending_kl = None  # summed at the old mask
        if returning:
            self._kstar = None  # a returning weight's k* was its bin's best (onehot.classify's keep), not its argmax

    @torch.no_grad()
    def _prune_pinned(self) -> None:
        if self.pinned_zero_rows:
            self.mask[list(self.pinned_zero_rows)] = False

    def without_pinned(self, tensor: torch.Tensor, fill: float | bool) -> torch.Tensor:
        """``tensor`` (θ's shape) with the pinned rows set to ``fill``: a copy, or ``tensor`` itself if none is."""
        if not self.pinned_zero_rows:
            return tensor
        return tensor.index_fill(0, torch.tensor(self.pinned_zero_rows, device=tensor.device), fill)

    def component_kl(self, log_stds: torch.Tensor | None = None) -> torch.Tensor:
        """KL(N(μ_wk, σ_wk²) ‖ N(0, σ_0²)) per window and component, (W, K), differentiable; ``log_stds``: the
        floored log σ if the caller has it (one clamp node, so log σ's gradient sums as without the floor)."""
        log_stds = self.floored_log_stds() if log_stds is None else log_stds
        return gaussian_kl(self.means, log_stds, self.config.prior.slab_std)

    def floored_log_stds(self) -> torch.Tensor:
        """log σ (W, K) as the posterior uses it: floored at :data:`LOG_STD_MIN` (σ ≈ 1.08e-19, K-means' floor)
        and capped at :data:`LOG_STD_MAX` (σ ≈ 9.2e18). The clamp's gradient is 0 outside, so training cannot
        drive σ to where 1/σ or σ² overflows (NaN gradients); between them the values and gradients are those of
        ``log_stds`` exactly."""
        return self.log_stds.clamp(min=LOG_STD_MIN, max=LOG_STD_MAX)

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype the layer computes in: its weight's at prepare_, then wherever ``model.to(dtype)`` took it."""
        return self.dtype_probe.dtype

    # -- the training forward ---------------------------------------------------------------------
    @eager_under_torch_compile
    @without_autocast
    def moments(self, *, second: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """θ^avg = λ̃ Σ_k φ_k μ_k (θ's shape) and, with ``second``, Var_q(θ̃) for the moment-matched
        likelihood. Memory-lean (chunked, recomputed in backward); caches k* for :meth:`kl`. With gradients
        on it also sums the gate KL in the same passes, for the next :meth:`kl` call."""
        self._check_precision()
        with_kl = torch.is_grad_enabled() and self.gate_logits.requires_grad
        key = self._moments_key(second) if with_kl and self.sharers > 1 and sharing_is_safe() else None
        if key is not None and (done := self._shared.lookup(key)) is not None:
            return done  # a tie's other layer in the same forward: one evaluation, one autograd node
        weights = (self.weight, self.gate_logits)
        log_stds = self.floored_log_stds()
        flat = (*(t.reshape(-1) for t in weights), self.means, log_stds, self.mixing_logits)
        flat = (*flat, self.mask.reshape(-1), self.window_ids.reshape(-1))
        component_kl = self.component_kl(log_stds) if with_kl else None
        self._kstar = None  # the last forward's k* (T bytes) is not kept alive beside this one's
        try:
            ranges = self._window_ranges()  # θ's range checked here, before any route (the dense one has no bins)
            mean, var, kstar, kl = posterior_moments(flat, self.spec(), second, ranges, component_kl)
        except FloatingPointError as err:  # onehot.check_finite_range: θ holds NaN or inf
            raise FloatingPointError(f"layer {self.layer_name or '(unnamed)'!r}: {err}") from None
        self._kstar = kstar
        self._pending_kl = (kl, self._kl_key()) if with_kl else None
        shape = self.weight.shape
        result = mean.reshape(shape), (var.reshape(shape) if second else None)
        if key is not None:
            self._shared.store(key, *result)
        return result

    def _moments_key(self, second: bool) -> tuple:
        """What θ^avg and Var depend on: a forward's result stays current while this is unchanged."""
        return (second, *self._kl_key(), *tensor_key((self.weight, self.mixing_logits, self.window_ids)))

    def _window_ranges(self) -> torch.Tensor:
        """Each window's smallest and largest θ, (W, 2); cached until θ changes (a trained θ: every step)."""
        key = (self.weight.data_ptr(), self.weight._version, self.weight.device)
        if self._ranges_key != key:
            flat = self.weight.detach().reshape(-1)
            ranges = window_value_ranges(flat, self.window_ids.reshape(-1), self.num_windows)
            check_finite_range(float(ranges[:, 0].min()), float(ranges[:, 1].max()))
            self._ranges, self._ranges_key = ranges, key
        return self._ranges

    def posterior_mean(self) -> torch.Tensor:
        """θ^avg (Section "Training Procedure"): the weight of the plug-in training forward."""
        return self.moments()[0]

    @eager_under_torch_compile
    @without_autocast
    def kl(self) -> torch.Tensor:
        """Σ_i KL(Bern(λ̃_i)‖Bern(λ)) + Σ_i λ̃_i KL(N(μ_k*, σ_k*²)‖N(0, σ_0²)) (eq. approx_elbo).

        The first call after a training forward returns the KL that forward summed (its gradients flow
        through the same backward as θ^avg); a later call, or one after the parameters changed, computes it
        again at the k* of the last forward. A call without gradients leaves the forward's KL in place."""
        pending, key = self._pending_kl, self._kl_key()
        if pending is not None and pointers(pending[1]) != pointers(key):
            log_other_tensors()
        if pending is not None and pending[1] == key:
            if not torch.is_grad_enabled():
                return pending[0].detach()
            self._pending_kl = None
            return pending[0]
        self._pending_kl = None
        kstar = self._kstar
        if kstar is None or kstar.numel() != self.weight.numel():
            kstar = self.greedy_levels().reshape(-1)
        elif kstar.is_inference() and not torch.is_inference_mode_enabled():
            kstar = kstar.clone()  # from a forward under torch.inference_mode: autograd cannot save it
        spec = self.spec()
        flat = (self.gate_logits.reshape(-1), self.component_kl(), self.mask.reshape(-1), self.window_ids.reshape(-1))
        return gate_kl(*flat, kstar, spec.gate_temperature, spec.prior_keep, compiled=spec.compiled)

    def _kl_key(self) -> tuple:
        """What the gate KL depends on besides k*: a forward's KL is current while this is unchanged."""
        return (*tensor_key((self.gate_logits, self.means, self.log_stds, self.mask)), float(self.gate_temperature))

    # -- inference ----------------------------------------------------------------------------------
    @torch.no_grad()
    @without_autocast
    def responsibilities(self) -> torch.Tensor:
        """φ (T, K) in flat weight order. Materialises T·K numbers: for inspection and tests."""
        out = torch.empty(self.weight.numel(), self.num_components, dtype=self.means.dtype, device=self.weight.device)
        for a, b, log_phi in responsibility_blocks(*self._flat_inputs()):
            out[a:b] = log_phi.exp()
        return out

    def _flat_inputs(self):
        self._check_precision()
        return (
            self.weight.detach().reshape(-1),
            self.window_ids.reshape(-1),
            self.means.detach(),
            self.floored_log_stds().detach(),
            self.mixing_logits.detach(),
            self.config.responsibility,
            self.config.temperature,
        )

    def _check_precision(self) -> None:
        """Refuse a posterior cast below float32 (e.g. ``model.half()`` after ``prepare_``): its bins and φ would
        be wrong in half precision (an index past the bin table, or a silently wrong certificate)."""
        tensors = (("weight", self.weight), ("means", self.means), ("gate_logits", self.gate_logits))
        low = [f"{name} ({str(t.dtype).removeprefix('torch.')})" for name, t in tensors if t.dtype in _HALF]
        if low:
            raise ValueError(
                f"the SQS posterior was cast to half precision: {', '.join(low)}; it must stay float32 or float64 "
                "(prepare_ keeps it so for half-precision layers, whose forward still runs in their own dtype). "
                "model.float() makes it usable again, but the cast has already rounded θ, μ, σ, π and the gates to "
                "half precision: reload the posterior from a checkpoint (load_state_dict) to undo that"
            )

    @torch.no_grad()
    @without_autocast
    def certified_fraction(self) -> float:
        """The share of weights whose φ is certified one-hot (:mod:`sqs_core.onehot`) at the current
        parameters; a training step costs K-component work only for the others (docs/method.md)."""
        return float(certified_levels(*self._flat_inputs())[1].float().mean())

    def _levels_and_uncertain(self):
        """(k*, meaningful where certified; a generator of (flat index, log φ) for the uncertified rest)."""
        theta, wid, means, log_stds, mixing, kind, temperature = self._flat_inputs()
        kstar, certified = certified_levels(theta, wid, means, log_stds, mixing, kind, temperature)
        blocks = uncertain_log_responsibilities(theta, wid, certified, means, log_stds, mixing, kind, temperature)
        return kstar, blocks

    @torch.no_grad()
    def greedy_levels(self) -> torch.Tensor:
        """k*_i = argmax_k φ_k(θ_i) (eq. greedy), uint8, θ's shape. Weights certified one-hot
        (:mod:`sqs_core.onehot`) take the certificate's k*; the others argmax_k log(π_k N_k(θ_i)), the same
        argmax without φ's float32 ties (see chunked.uncertain_log_responsibilities)."""
        return self.levels_and_alternatives(alternatives=False)[0]

    @torch.no_grad()
    def sampling_alternatives(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The weights whose inference distribution is not one-hot: (flat index (n,), probs (n, K)).

        probs are φ with entries below :data:`SAMPLING_FLOOR` zeroed, rounded to float16 (the precision
        the artifact stores), as float32; rows are not renormalised (sampling normalises by the sum).
        Certified weights (every other φ_j ≤ e^-40, far below the floor) have none.
        """
        return self.levels_and_alternatives()[1]

    @torch.no_grad()
    @without_autocast
    def levels_and_alternatives(self, *, alternatives: bool = True):
        """(:meth:`greedy_levels`, :meth:`sampling_alternatives`) from one evaluation of the weights that are not
        certified (their full φ: the costly part; a 4096×4096 layer late in training has millions); without
        ``alternatives`` the second is empty, and the evaluation spares the probabilities."""
        kstar, blocks = self._levels_and_uncertain()
        index, rows = [], []
        for flat, log_phi, levels in blocks:
            kstar[flat] = levels.to(torch.uint8)
            if alternatives:
                probs = sampling_probs(log_phi.exp())
                local = ((probs > 0).sum(-1) >= 2).nonzero().squeeze(1)
                if local.numel():
                    index.append(flat[local])
                    rows.append(probs[local])
        if not index:  # none, or not asked for
            k, device = self.num_components, self.means.device
            index, rows = [torch.zeros(0, dtype=torch.long, device=device)], [torch.zeros(0, k, device=device)]
        return kstar.reshape(self.weight.shape), (torch.cat(index), torch.cat(rows))

    @torch.no_grad()
    def level_values(self, levels: torch.Tensor) -> torch.Tensor:
        """μ_{w_i, levels_i} for a level tensor of θ's shape."""
        k = self.num_components
        flat = self.window_ids.reshape(-1).long() * k + levels.reshape(-1).long()
        return self.means.detach().reshape(-1)[flat].reshape(self.weight.shape)


def sampling_probs(phi: torch.Tensor) -> torch.Tensor:
    """The discrete inference distribution's (unnormalised) probabilities from φ (see SAMPLING_FLOOR)."""
    return torch.where(phi >= SAMPLING_FLOOR, phi, torch.zeros_like(phi)).half().float()
