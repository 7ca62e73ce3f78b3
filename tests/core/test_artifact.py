"""Tests for the compressed artifact (sqs_core.save / load / load_bayesian_average) and its report.

The reference is always the in-memory model the file was saved from: greedy weights, ``sample_`` and
``BayesianAverage`` with the same generator seed must come back exactly.
"""

from __future__ import annotations

import copy
import json
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import sqs_core as sqs
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sqs_core import artifact as artifact_module
from sqs_core._artifact_layout import _split, decode_posterior, decode_weight, encode, field_bits
from sqs_core.discrete import DiscretePosterior
from sqs_core.packing import decode_mask
from strategies import nonzero_rates, window_kinds
from torch import nn

# Tempered responsibilities (τ = 0.5) so that most weights have alternatives to sample from.
WARM = {"temperature": 0.5}


class Net(nn.Module):
    """Nested: a conv block with batch-norm inside a Sequential, a hidden Linear, a head."""

    def __init__(self, hidden: int = 12) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.body = nn.ModuleDict({"fc": nn.Linear(4 * 4 * 4, hidden)})
        self.head = nn.Linear(hidden, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x).flatten(1)
        return self.head(torch.relu(self.body["fc"](x)))


class Tied(nn.Module):
    """Two Linear modules sharing one weight Parameter, and one Linear used at two places."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.b.weight = self.a.weight
        self.shared = nn.Linear(8, 8)
        self.again = self.shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.again(torch.tanh(self.shared(self.b(torch.tanh(self.a(x))))))


def _prepared(model: nn.Module, **config) -> tuple[nn.Module, nn.Module]:
    """(prepared model, plain skeleton copy of the original)."""
    skeleton = copy.deepcopy(model)
    sqs.prepare_(model, sqs.SQSConfig(**{**WARM, **config}))
    return model, skeleton


def _net(seed: int = 0, **config) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    return _prepared(Net(), **config)


@pytest.fixture
def net_file(tmp_path: Path) -> tuple[nn.Module, nn.Module, Path]:
    model, skeleton = _net(num_components=4)
    path = tmp_path / "net.sqs"
    sqs.save(model, path, nonzero=0.4)
    return model, skeleton, path


def _fixed_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {f"{name}.weight": layer.fixed_weight for name, layer in sqs.sqs_layers(model).items()}


def _assert_same_values(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal bit for bit once the sign of zero is ignored (pruned weights: μ·0 may be −0 in memory)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual, expected)
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}[actual.dtype]
    assert torch.equal((actual + 0.0).view(ints), (expected + 0.0).view(ints))


def _inputs(seed: int = 1) -> torch.Tensor:
    return torch.randn(5, 2, 4, 4, generator=torch.Generator().manual_seed(seed))


# -- round trips ---------------------------------------------------------------------------------------
@given(
    out_features=st.integers(1, 9),
    in_features=st.integers(1, 9),
    k=st.sampled_from([2, 3, 4, 5, 8, 16]),
    windows=window_kinds,
    nonzero=st.one_of(st.none(), nonzero_rates),
    per_layer=st.booleans(),
    temperature=st.sampled_from([5e-4, 0.05, 0.5]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=25)  # each example prepares a model (k-means): keep the suite to seconds
def test_greedy_round_trip_is_exact(
    tmp_path_factory, out_features, in_features, k, windows, nonzero, per_layer, temperature, seed
):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(in_features, out_features), nn.Tanh(), nn.Linear(out_features, 3))
    model, skeleton = _prepared(model, num_components=k, windows=windows, temperature=temperature)
    path = tmp_path_factory.mktemp("rt") / "m.sqs"
    sqs.save(model, path, nonzero=nonzero, per_layer=per_layer)
    loaded = sqs.load(path, copy.deepcopy(skeleton))
    dists = sqs.discrete_posteriors(model, nonzero=nonzero, per_layer=per_layer)
    state = loaded.state_dict()
    for name, d in dists.items():
        _assert_same_values(state[f"{name}.weight"], d.weights())
    for key, value in skeleton.state_dict().items():
        if not key.endswith("weight"):
            assert torch.equal(state[key], value)
    records = artifact_module.read_artifact(path).records
    total = sum(d.numel for d in dists.values())
    kept = sum(r["kept"] for r in records)
    if nonzero is not None and not per_layer:
        assert kept == max(1, round(nonzero * total))
    for rec, d in zip(records, dists.values(), strict=True):
        assert rec["kept"] == int(d.keep.sum())
        assert rec["code_bits"] <= field_bits(k) + field_bits(rec["windows"])  # never above separate streams


def test_global_nonzero_rate_in_file(net_file):
    model, _, path = net_file
    report = sqs.compression_report(path)
    total = sum(p.weight.numel() for p in sqs.posteriors(model).values())
    assert report.compressed_weights == total
    assert report.nonzero_weights / total == round(0.4 * total) / total
    art = artifact_module.read_artifact(path)
    kept = 0
    for rec in art.records:
        mask_bytes = _split(rec, art.blobs[rec["layers"][0]])["mask"]
        kept += int(decode_mask(rec["mask"], mask_bytes, math.prod(rec["shape"])).sum())
    assert kept == round(0.4 * total)


def test_per_layer_nonzero(tmp_path):
    model, _ = _net(num_components=4)
    sqs.save(model, tmp_path / "m.sqs", nonzero=0.3, per_layer=True)
    for rec in artifact_module.read_artifact(tmp_path / "m.sqs").records:
        assert rec["kept"] == max(1, round(0.3 * math.prod(rec["shape"])))


def test_nested_model_outputs_and_names(net_file):
    model, skeleton, path = net_file
    art = artifact_module.read_artifact(path)
    assert not any("base_layer" in key or "posterior" in key for key in art.dense)
    loaded = sqs.load(path, copy.deepcopy(skeleton)).eval()
    reference = sqs.greedy_(copy.deepcopy(model), nonzero=0.4).eval()
    assert torch.equal(loaded(_inputs()), reference(_inputs()))


@pytest.mark.parametrize("seed", [0, 7])
def test_sample_mode_equals_sample_(net_file, seed):
    model, skeleton, path = net_file
    reference = sqs.sample_(copy.deepcopy(model), nonzero=0.4, generator=torch.Generator().manual_seed(seed))
    loaded = sqs.load(path, copy.deepcopy(skeleton), mode="sample", generator=torch.Generator().manual_seed(seed))
    state = loaded.state_dict()
    fixed = _fixed_weights(reference)
    for key, weight in fixed.items():
        assert torch.equal(state[key], weight)
    greedy = sqs.load(path, copy.deepcopy(skeleton)).state_dict()
    assert any(not torch.equal(state[k], greedy[k]) for k in fixed)  # the draw did differ from greedy


@pytest.mark.parametrize("average", ["outputs", "probs"])
def test_bayesian_average_equals_in_memory(net_file, average):
    model, skeleton, path = net_file
    expected = sqs.BayesianAverage(
        model, samples=3, nonzero=0.4, generator=torch.Generator().manual_seed(5), average=average
    ).eval()
    loaded = sqs.load_bayesian_average(
        path, copy.deepcopy(skeleton), samples=3, generator=torch.Generator().manual_seed(5), average=average
    ).eval()
    x = _inputs()
    assert torch.equal(loaded(x), expected(x))
    greedy = sqs.load(path, copy.deepcopy(skeleton)).eval()
    assert not torch.equal(loaded(x), greedy(x))


def test_tied_and_repeated_layers(tmp_path):
    torch.manual_seed(3)
    model, skeleton = _prepared(Tied(), num_components=4)
    assert len(sqs.posteriors(model)) == 2
    path = tmp_path / "tied.sqs"
    sqs.save(model, path, nonzero=0.5)
    records = artifact_module.read_artifact(path).records
    assert sorted(sorted(r["layers"]) for r in records) == [["a", "b"], ["again", "shared"]]
    loaded = sqs.load(path, copy.deepcopy(skeleton))
    assert loaded.a.weight is loaded.b.weight and loaded.shared is loaded.again
    x = torch.randn(4, 8)
    assert torch.equal(loaded(x), sqs.greedy_(copy.deepcopy(model), nonzero=0.5)(x))
    averaged = sqs.load_bayesian_average(
        path, copy.deepcopy(skeleton), samples=2, generator=torch.Generator().manual_seed(1)
    )
    expected = sqs.BayesianAverage(model, samples=2, nonzero=0.5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(averaged(x), expected(x))


def test_excluded_layer_is_kept_exactly(tmp_path):
    torch.manual_seed(0)
    model, skeleton = _prepared(Net(), num_components=4, exclude=("head",))
    path = tmp_path / "m.sqs"
    sqs.save(model, path, nonzero=0.5)
    assert "head.weight" in artifact_module.read_artifact(path).dense
    loaded = sqs.load(path, copy.deepcopy(skeleton))
    assert torch.equal(loaded.head.weight, skeleton.head.weight)
    assert torch.equal(loaded.features[1].running_var, skeleton.features[1].running_var)


def test_float64_model(tmp_path):
    torch.manual_seed(0)
    model, skeleton = _prepared(nn.Sequential(nn.Linear(6, 5).double()), num_components=3)
    sqs.save(model, tmp_path / "m.sqs", nonzero=0.5)
    loaded = sqs.load(tmp_path / "m.sqs", copy.deepcopy(skeleton))
    _assert_same_values(loaded[0].weight.data, sqs.discrete_posteriors(model, nonzero=0.5)["0"].weights())


def test_load_uses_no_pickle(net_file, monkeypatch):
    _, skeleton, path = net_file

    def refuse(*args, **kwargs):
        raise AssertionError("the artifact must never be unpickled")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    sqs.load(path, copy.deepcopy(skeleton))


# -- the layout of one tensor, without a model -----------------------------------------------------------
@st.composite
def discrete_posteriors(draw: st.DrawFn) -> DiscretePosterior:
    """A random DiscretePosterior: any K/W (joint codes above 8 bits included), keep rate, alternatives."""
    numel = draw(st.integers(1, 300))
    k = draw(st.sampled_from([2, 3, 4, 7, 16, 200, 256]))
    w = draw(st.integers(1, 4))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    keep = torch.rand(numel, generator=gen) < draw(st.sampled_from([0.0, 0.1, 0.5, 0.97, 1.0]))
    n_alt = draw(st.integers(0, numel))
    alt_index = torch.randperm(numel, generator=gen)[:n_alt]
    probs = torch.rand(n_alt, k, generator=gen) * (torch.rand(n_alt, k, generator=gen) < 3 / k)
    probs[:, 0] += 0.5
    probs[:, -1] += 0.25
    return DiscretePosterior(
        shape=(numel,),
        codebook=torch.randn(w, k, generator=gen),
        window_ids=torch.randint(0, w, (numel,), generator=gen, dtype=torch.uint8),
        greedy=torch.randint(0, k, (numel,), generator=gen, dtype=torch.uint8),
        keep=keep,
        alt_index=alt_index,
        alt_probs=probs.half().float(),
    )


@given(d=discrete_posteriors(), seed=st.integers(0, 2**16))
def test_layout_round_trip(d, seed):
    record, blob = encode(d, alternatives=True)
    assert blob.numel() == sum(record["sections"].values())
    _assert_same_values(decode_weight("t", record, blob), d.weights())
    loaded = decode_posterior("t", record, blob)
    draws = [x.weights(x.draw(torch.Generator().manual_seed(seed))) for x in (d, loaded)]
    assert torch.equal(draws[0], draws[1])
    assert record["code_bits"] <= field_bits(d.codebook.shape[1]) + field_bits(d.codebook.shape[0])


# -- damaged files and wrong skeletons ------------------------------------------------------------------
def _header_span(data: bytes) -> tuple[int, int]:
    return 8, 8 + int.from_bytes(data[:8], "little")


@pytest.mark.parametrize("keep_bytes", [0, 5, 8, 100, -200, -1])
def test_truncated_file(net_file, tmp_path, keep_bytes):
    _, skeleton, path = net_file
    data = path.read_bytes()
    cut = tmp_path / "cut.sqs"
    cut.write_bytes(data[:keep_bytes])
    with pytest.raises(ValueError, match="truncated or not a safetensors file"):
        sqs.load(cut, copy.deepcopy(skeleton))


def test_every_flipped_header_byte_is_detected(net_file, tmp_path):
    _, skeleton, path = net_file
    data = path.read_bytes()
    start, end = _header_span(data)
    damaged = tmp_path / "flip.sqs"
    for pos in range(start, end, 3):
        flipped = bytearray(data)
        flipped[pos] ^= 0x01
        damaged.write_bytes(bytes(flipped))
        with pytest.raises(ValueError, match=r"checksum|JSON|truncated|not an SQS|magic|skeleton|format"):
            sqs.load(damaged, copy.deepcopy(skeleton))


def test_wrong_shape_names_layer_and_shapes(net_file):
    _, skeleton, path = net_file
    wrong = copy.deepcopy(skeleton)
    wrong.body["fc"] = nn.Linear(64, 13)
    with pytest.raises(
        ValueError, match=r"'body\.fc\.weight' has shape \(12, 64\) \(torch.float32\) in the file but \(13, 64\)"
    ):
        sqs.load(path, wrong)


def test_missing_and_unexpected_layers(net_file):
    _, skeleton, path = net_file
    fewer = copy.deepcopy(skeleton)
    del fewer.body["fc"]
    with pytest.raises(ValueError, match=r"not in the skeleton \['body\.fc\.bias', 'body\.fc\.weight'\]"):
        sqs.load(path, fewer)
    more = copy.deepcopy(skeleton)
    more.extra = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"missing from the file \['extra\.bias', 'extra\.weight'\]"):
        sqs.load(path, more)


def test_argument_validation(net_file, tmp_path):
    model, skeleton, path = net_file
    with pytest.raises(ValueError, match="mode"):
        sqs.load(path, copy.deepcopy(skeleton), mode="mean")
    with pytest.raises(ValueError, match="generator"):
        sqs.load(path, copy.deepcopy(skeleton), generator=torch.Generator())
    with pytest.raises(ValueError, match="plain model"):
        sqs.load(path, model)
    with pytest.raises(ValueError, match="nonzero"):
        sqs.save(model, tmp_path / "x.sqs", nonzero=1.5)
    with pytest.raises(ValueError, match="not prepared"):
        sqs.save(copy.deepcopy(skeleton), tmp_path / "x.sqs")
    assert not (tmp_path / "x.sqs").exists()
    sqs.save(model, tmp_path / "greedy.sqs", nonzero=0.4, include_alternatives=False)
    with pytest.raises(ValueError, match="include_alternatives=False"):
        sqs.load(tmp_path / "greedy.sqs", copy.deepcopy(skeleton), mode="sample", generator=torch.Generator())


# -- atomic save -----------------------------------------------------------------------------------------
def test_unwritable_path_leaves_nothing(net_file, tmp_path):
    model, _, _ = net_file
    with pytest.raises(OSError):
        sqs.save(model, tmp_path / "missing" / "m.sqs")
    assert not (tmp_path / "missing").exists()
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError):
        sqs.save(model, blocker / "m.sqs")


def test_failed_write_keeps_the_old_file(net_file, tmp_path, monkeypatch):
    model, _, _ = net_file
    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / "m.sqs"
    target.write_bytes(b"old content")

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        sqs.save(model, target, nonzero=0.5)
    assert target.read_bytes() == b"old content"
    assert sorted(p.name for p in folder.iterdir()) == ["m.sqs"]


# -- report and CLI --------------------------------------------------------------------------------------
def test_report_numbers(net_file):
    model, _, path = net_file
    report = sqs.compression_report(path)
    assert report.file_bytes == os.path.getsize(path)
    assert report.compressed_bytes + report.dense_bytes == report.file_bytes
    dists = sqs.discrete_posteriors(model, nonzero=0.4)
    t = sum(d.numel for d in dists.values())
    index_bits = sum(math.log2(d.codebook.shape[1]) * int(d.keep.sum()) for d in dists.values())
    stored = sum(int(torch.unique(d.window_ids[d.keep]).numel()) * d.codebook.shape[1] for d in dists.values())
    assert report.codebook_entries == stored
    assert report.paper_rate == pytest.approx(32 * t / (index_bits + 32 * stored), rel=1e-12)
    assert report.paper_plus_mask_rate == pytest.approx(32 * t / (index_bits + 32 * stored + t), rel=1e-12)
    assert report.file_rate == pytest.approx(32 * t / (8 * report.compressed_bytes))
    layer_bytes = sum(
        r.bytes_indices + r.bytes_mask + r.bytes_codebook + r.bytes_alternatives + r.bytes_shared for r in report.layers
    )
    assert layer_bytes == pytest.approx(report.compressed_bytes)
    dense = sum(v.numel() for k, v in model.state_dict().items() if ".posterior." not in k)
    assert report.fp32_bytes == 4 * (t + dense)
    assert [r.name for r in report.layers] == list(dists)
    text = str(report)
    assert all(name in text for name in dists) and "paper rate" in text
    assert json.loads(report.to_json())["file_bytes"] == report.file_bytes
    in_memory = sqs.compression_report(model, nonzero=0.4)
    assert in_memory.path is None and in_memory.file_bytes == report.file_bytes
    assert in_memory.paper_rate == report.paper_rate
    with pytest.raises(ValueError, match="nonzero"):
        sqs.compression_report(path, nonzero=0.5)


def test_cli_inspect(net_file, capsys):
    from sqs_core.__main__ import main

    _, _, path = net_file
    assert main(["inspect", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["file_bytes"] == os.path.getsize(path)
    assert main(["inspect", str(path)]) == 0
    assert "paper rate" in capsys.readouterr().out
    assert main(["inspect", str(path.with_name("nope.sqs"))]) == 1
    assert "error" in capsys.readouterr().err


def test_cli_help_in_a_fresh_process():
    done = subprocess.run([sys.executable, "-m", "sqs_core", "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "inspect" in done.stdout


def test_pruned_weights_are_exact_positive_zeros():
    # A negative level times a False mask would give -0.0, which changes the bytes of re-saved weights.
    d = DiscretePosterior(
        shape=(2, 2),
        codebook=torch.tensor([[-0.5, 0.25]]),
        window_ids=torch.zeros(4, dtype=torch.uint8),
        greedy=torch.tensor([0, 0, 1, 0], dtype=torch.uint8),
        keep=torch.tensor([False, True, False, False]),
        alt_index=torch.empty(0, dtype=torch.int64),
        alt_probs=torch.empty(0, 2),
    )
    w = d.weights().reshape(-1)
    assert w.tolist() == [0.0, -0.5, 0.0, 0.0]
    assert not torch.signbit(w[[0, 2, 3]]).any()
