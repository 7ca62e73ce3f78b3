"""The compressed artifact: one safetensors file (never pickle) holding a prepared model's SQS weights.

``save`` writes, per posterior (tied layers share one), the bit-packed levels of the kept weights, the
sparsity mask, the codebooks and the alternatives Bayesian averaging needs (eq. infer-theta), plus every
uncompressed tensor of the model under the plain model's names, and a JSON header with SHA-256 checksums.
``load`` validates all of it and sets the weights of a plain ``skeleton`` model (the architecture before
``prepare_``): greedy (eq. greedy), one posterior draw, or :func:`load_bayesian_average` (eq. infer-bam),
with the same draws as in memory for the same ``torch.Generator`` seed. The format: docs/artifact.md.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ._artifact_file import (
    FORMAT_VERSION,
    MAGIC,
    PREFIX,
    Artifact,
    check_path,
    container,
    read_artifact,
    record_name,
    weight_keys,
)
from ._artifact_layout import FLOAT_DTYPES, encode, parameter_names
from ._checks import check_flag, check_generator
from ._safetensors_format import safetensors_chunks
from ._ties import aliased_keys
from .files import replaced_file, write_atomic
from .inference import BayesianAverage, check_arguments, discrete_posteriors
from .layers import SQSLayer
from .prepare import plain_key, posteriors, prepared_config, sqs_paths

__all__ = ["FORMAT_VERSION", "MAGIC", "load", "load_bayesian_average", "save", "upgrade"]

log = logging.getLogger(__name__)


# -- save -------------------------------------------------------------------------------------------------
def _layer_groups(model: nn.Module) -> tuple[dict[str, dict[str, str]], set[str]]:
    """Posterior name -> {plain layer name: the parameter it compresses} of every layer that uses it (tied or
    repeated layers), in traversal order; all SQS paths."""
    names = {id(p): name for name, p in posteriors(model).items()}
    paths = sqs_paths(model)
    groups: dict[str, dict[str, str]] = {name: {} for name in names.values()}
    for path, m in model.named_modules(remove_duplicate=False):
        if isinstance(m, SQSLayer):
            plain = plain_key(path, paths)
            if plain is not None:
                groups[names[id(m.posterior)]].setdefault(plain, m.adapter.weight_name)
    return groups, paths


def _layer_fields(group: dict[str, str]) -> dict[str, list[str]]:
    """A record's ``layers`` (the first plain layer name identifies it) and, where a layer compresses another
    parameter than ``weight``, ``parameters`` (one per layer)."""
    fields = {"layers": list(group)}
    if any(name != "weight" for name in group.values()):
        fields["parameters"] = list(group.values())
    return fields


def _dense_state(model: nn.Module, sqs_paths: set[str]) -> dict[str, torch.Tensor]:
    """Every uncompressed tensor of the model state, contiguous on the CPU, storage not shared."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, value in model.state_dict().items():
        plain = plain_key(key, sqs_paths)
        if plain is None:
            continue
        if plain.startswith(PREFIX):
            raise ValueError(f"state key {plain!r} collides with the artifact's reserved prefix {PREFIX!r}")
        t = value.detach().cpu().contiguous()
        if t.numel() and t.untyped_storage().data_ptr() in seen:
            t = t.clone()  # safetensors refuses tensors that share memory (e.g. tied dense weights)
        seen.add(t.untyped_storage().data_ptr())
        out[plain] = t
    return out


def save(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    nonzero: float | None = None,
    per_layer: bool = False,
    include_alternatives: bool = True,
) -> None:
    """Write the compressed artifact of a prepared ``model`` to ``path`` (atomically: all or nothing).

    ``nonzero`` / ``per_layer`` decide the pruning as in :func:`sqs_core.greedy_` (None keeps what the
    pruning schedule left); ``include_alternatives`` stores what sampling and Bayesian averaging need.
    A symlink at ``path`` is followed (its final target is rewritten); an existing file keeps its mode
    bits; an existing folder, FIFO or device at ``path`` is refused untouched.
    """
    model = _uncompiled(model)
    config = prepared_config(model)
    check_flag("per_layer", per_layer)
    check_flag("include_alternatives", include_alternatives)
    target = check_path("path", path)
    replaced_file(target)  # refuse a folder, FIFO or device before the (costly) encoding
    dists = discrete_posteriors(model, nonzero=nonzero, per_layer=per_layer, alternatives=include_alternatives)
    groups, sqs_paths = _layer_groups(model)
    records, blobs = [], []
    for name, d in dists.items():
        _check_levels(name, d.codebook)
        record, blob = encode(d, alternatives=include_alternatives)
        records.append({**_layer_fields(groups[name]), **record})
        blobs.append(blob)
    dense = _dense_state(model, sqs_paths)
    body = {
        "config": config.to_dict(),
        "nonzero": nonzero,
        "per_layer": per_layer,
        "alternatives": include_alternatives,
        "compressed": records,
    }
    size = _write(target, body, blobs, dense)
    log.info("saved %s: %d bytes, %d compressed tensors, %d dense", target, size, len(records), len(dense))


def _check_levels(name: str, codebook: torch.Tensor) -> None:
    """A ValueError for quantization levels μ_wk (finite: the posterior was checked) that the layer's dtype cannot
    hold, a float16 layer's beyond ±65504: the file would store them as inf, which ``load`` refuses as damage."""
    if not bool(torch.isfinite(codebook).all()):
        bad, limit = int((~torch.isfinite(codebook)).sum()), torch.finfo(codebook.dtype).max
        raise ValueError(
            f"layer {name!r}: {bad} of its quantization levels lie beyond what its dtype {codebook.dtype} holds "
            f"(±{limit:.6g}), so the file cannot store them: save a float32 copy (model.float(), loaded into a float32 "
            "skeleton), or bring those levels into range"
        )


def upgrade(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Rewrite the artifact at ``source`` (any readable format version) in the current version at ``target``.

    Every compressed tensor is decoded to its discrete posterior and encoded again, so the greedy weights,
    the alternatives and every draw stay exactly as they were; only the bytes change (smaller header,
    escaped code layouts where they help). Atomic like :func:`save`; ``target`` may equal ``source``.
    """
    check_path("source", source)
    where = check_path("target", target)
    replaced_file(where)
    art = read_artifact(source)
    records, blobs = [], []
    for rec, d in zip(art.records, art.posteriors().values(), strict=True):
        record, blob = encode(d, alternatives=bool(art.header.get("alternatives")))
        group = dict(zip(rec["layers"], parameter_names(rec), strict=True))
        records.append({**_layer_fields(group), **record, "windows": rec["windows"]})
        blobs.append(blob)
    keys = ("config", "nonzero", "per_layer", "alternatives")
    body = {**{k: art.header.get(k) for k in keys}, "compressed": records}
    _write(where, body, blobs, art.dense)
    log.info("upgraded %s (format %s) to %s", art.path, art.header["format_version"], where)


def _write(path: str, body: dict[str, Any], blobs: list[torch.Tensor], dense: dict[str, torch.Tensor]) -> int:
    """Write the version-2 file of ``body`` (the header without magic, version, checksums and the writing
    library, added here), the records' blobs and the dense state atomically; returns its size in bytes."""
    from . import __version__  # here, not at import time: the package imports this module

    tensors, metadata = container({"library": f"sqs-core {__version__}", **body}, blobs, dense)
    chunks, keep_alive = safetensors_chunks(tensors, metadata=metadata)
    write_atomic(path, chunks)
    del keep_alive
    return sum(len(c) for c in chunks)


# -- load -------------------------------------------------------------------------------------------------
def _check_state(art: Artifact, skeleton: nn.Module) -> dict[str, torch.Tensor]:
    """Check the file's full state against the skeleton's (names, shapes, dtypes) before anything is
    written; returns the skeleton's state (its tensors, detached)."""
    kinds = {key: (tuple(value.shape), value.dtype) for key, value in art.dense.items()}
    for rec in art.records:
        for key in weight_keys(rec):
            kinds[key] = (tuple(rec["shape"]), FLOAT_DTYPES[rec["dtype"]])
    expected = skeleton.state_dict(keep_vars=True)
    missing, unexpected = sorted(set(expected) - set(kinds)), sorted(set(kinds) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{art.path} does not match the skeleton {type(skeleton).__name__}: "
            f"missing from the file {missing}, not in the skeleton {unexpected}"
        )
    wrong = [
        f"{key!r} has shape {shape} ({dtype}) in the file but "
        f"{tuple(expected[key].shape)} ({expected[key].dtype}) in the skeleton"
        for key, (shape, dtype) in kinds.items()
        if shape != tuple(expected[key].shape) or dtype != expected[key].dtype
    ]
    if wrong:
        hint = ""
        if all(shape == tuple(expected[key].shape) for key, (shape, _) in kinds.items()):  # the dtypes alone
            dtype = next(expected[key].dtype for key, (_, d) in kinds.items() if d != expected[key].dtype)
            hint = (
                f". The file holds the dtypes the model was saved in: load into a skeleton of those, then convert "
                f"it: sqs_core.load(path, skeleton).to({dtype})"
            )
        raise ValueError(f"{art.path} does not match the skeleton: " + "; ".join(wrong) + hint)
    _check_skeleton_ties(art, expected)
    return {key: value.detach() for key, value in expected.items()}


def _check_skeleton_ties(art: Artifact, expected: dict[str, torch.Tensor]) -> None:
    """A ValueError where the skeleton ties state entries (one tensor under several keys) that the file holds
    apart: one record's layers (a tie the saved model had) or dense entries of equal values are one tensor there
    too; else loading wrote them into the one tensor in turn and the last won, silently another model."""
    sources = {key: ("dense", key) for key in art.dense}
    for rec in art.records:
        sources.update(dict.fromkeys(weight_keys(rec), ("record", record_name(rec))))
    for keys in aliased_keys(expected):
        kinds = {sources[k] for k in keys}
        if all(kind == "dense" for kind, _ in kinds):
            first = art.dense[keys[0]]
            if all(torch.equal(art.dense[k], first) for k in keys[1:]):
                continue
        elif len(kinds) == 1:
            continue
        raise ValueError(
            f"the skeleton ties {keys} (one tensor), but {art.path} holds them as different tensors: the model was "
            "saved with them untied; build the skeleton as that model was (e.g. tie_word_embeddings=False)"
        )


def _load_state(art: Artifact, skeleton: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Load the file's state into the (checked) skeleton strictly. Weights decoded into the skeleton's own
    tensors cost nothing here: ``copy_`` from an alias of the same data returns at once. The state carries the
    skeleton's own ``_metadata`` (each module's state version), which a ``state_dict()`` carries: modules that
    read it on load (torchvision's MNASNet: "version should be set to 1 or 2 instead of None") need it."""
    state: dict[str, torch.Tensor] = OrderedDict(art.dense)
    for rec in art.records:
        for key in weight_keys(rec):
            state[key] = weights[record_name(rec)]
    metadata = getattr(skeleton.state_dict(keep_vars=True), "_metadata", None)
    if metadata is not None:
        state._metadata = metadata  # type: ignore[attr-defined]
    skeleton.load_state_dict(state, strict=True)


def _check_skeleton(skeleton: Any) -> None:
    """A plain (not prepared) module whose tensors hold data: loading into meta tensors writes nothing."""
    if not isinstance(skeleton, nn.Module):
        raise ValueError(f"skeleton must be a torch.nn.Module, got {type(skeleton).__name__}")
    if any(isinstance(m, SQSLayer) for m in skeleton.modules()):
        raise ValueError("skeleton must be the plain model (not prepared for SQS)")
    for key, value in skeleton.state_dict(keep_vars=True).items():
        if isinstance(value, torch.Tensor) and value.is_meta:
            raise ValueError(
                f"skeleton tensor {key!r} is on the meta device (it holds no data to load into): materialise "
                "the skeleton first, e.g. skeleton.to_empty(device='cpu'), then load"
            )


def load(
    path: str | os.PathLike,
    skeleton: nn.Module,
    *,
    mode: str = "greedy",
    generator: torch.Generator | None = None,
) -> nn.Module:
    """Set ``skeleton``'s weights from the artifact at ``path``, in place; returns ``skeleton``.

    ``mode="greedy"`` gives μ_{k*} (eq. greedy); ``mode="sample"`` one draw of eq. infer-theta from
    ``generator``, equal to :func:`sqs_core.sample_` on the saved model with the same generator state.
    """
    skeleton = _uncompiled(skeleton)
    _check_skeleton(skeleton)
    if mode not in ("greedy", "sample"):
        raise ValueError(f"mode must be 'greedy' or 'sample', got {mode!r}")
    check_generator("generator", generator)
    if mode == "greedy" and generator is not None:
        raise ValueError("generator is only used with mode='sample'")
    art = read_artifact(path)
    params = _check_state(art, skeleton)
    if mode == "greedy":  # decoded straight into the skeleton's weights (after every check of the file)
        weights = art.weights(into={record_name(rec): params[weight_keys(rec)[0]] for rec in art.records})
    else:
        _check_alternatives(art)
        weights = {name: d.weights(d.draw(generator)) for name, d in art.posteriors().items()}
    _load_state(art, skeleton, weights)
    return skeleton


def _uncompiled(model: Any) -> Any:
    """The module inside a ``torch.compile`` wrapper (OptimizedModule), whose names carry no ``_orig_mod.``
    prefix, so that a file saved from a compiled model loads into a plain skeleton and the reverse."""
    while type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), nn.Module):
        model = model._orig_mod
    return model


def _check_alternatives(art: Artifact) -> None:
    if not art.header.get("alternatives"):
        raise ValueError(f"{art.path} was saved with include_alternatives=False: it cannot be sampled")


def load_bayesian_average(
    path: str | os.PathLike,
    skeleton: nn.Module,
    *,
    samples: int = 4,
    generator: torch.Generator | None = None,
    average: str = "outputs",
    output: Callable[[Any], torch.Tensor] | None = None,
) -> BayesianAverage:
    """Bayesian averaging (eq. infer-bam) of ``samples`` draws from the artifact, over ``skeleton``.

    Its outputs equal ``BayesianAverage(model, samples=samples, nonzero=..., generator=g)`` on the saved
    model for a generator in the same state. Every argument and the whole file are checked, and the draws
    made, before the skeleton's weights are set.
    """
    skeleton = _uncompiled(skeleton)
    _check_skeleton(skeleton)
    check_arguments(samples, generator, average, output)
    art = read_artifact(path)
    _check_alternatives(art)
    _check_state(art, skeleton)
    dists = art.posteriors()
    setters = {record_name(rec): TensorSetter(tuple(weight_keys(rec))) for rec in art.records}
    bam = BayesianAverage.from_parts(
        skeleton, dists, setters, samples=samples, generator=generator, average=average, output=output
    )
    _load_state(art, skeleton, {name: d.weights() for name, d in dists.items()})
    return bam


@dataclass(frozen=True)
class TensorSetter:
    """Copies a weight into the tensors ``keys`` of the skeleton it is given, as they are at the call: a skeleton
    converted after loading (``.to(dtype)``, ``.to(device)``) holds new tensors, and a copy of the
    BayesianAverage (deepcopy, torch.save) its own skeleton; the draws must reach those."""

    keys: tuple[str, ...]

    def __call__(self, skeleton: nn.Module, weight: torch.Tensor) -> None:
        with torch.no_grad():
            for key in self.keys:
                module, _, name = key.rpartition(".")
                getattr(skeleton.get_submodule(module), name).copy_(weight)
