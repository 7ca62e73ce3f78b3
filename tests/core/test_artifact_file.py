"""The artifact's container (sqs_core._artifact_file): compressed header, one blob tensor, checksums, versions.

Each damaged file here is rebuilt with valid checksums everywhere except where the damage is meant to be
found, so the test fails if that one check is missing (not merely if some other check fires first).
"""

from __future__ import annotations

import copy
import json
import zlib
from pathlib import Path

import pytest
import safetensors.torch
import sqs_core as sqs
import torch
from crafted_files import resealed
from sqs_core import _artifact_file as container_module
from sqs_core.__main__ import main
from sqs_core._artifact_file import (
    BLOBS_TENSOR,
    CRC_TABLE,
    HEADER_TENSOR,
    MAGIC,
    PREFIX,
    canonical,
    header_sha256,
    read_artifact,
    seal,
)
from sqs_core._safetensors_format import safetensors_chunks
from torch import nn

META_KEYS = ("magic", "format_version", "checksum")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 16)
        self.body = nn.ModuleDict({"fc": nn.Linear(16, 12)})
        self.head = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body["fc"](torch.relu(self.first(x)))))


def _saved_net(seed: int, path: Path) -> tuple[nn.Module, nn.Module, Path]:
    """(prepared Net, its plain skeleton, the artifact saved at 40% non-zero)."""
    torch.manual_seed(seed)
    model = Net()
    skeleton = copy.deepcopy(model)
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, windows="outlier", temperature=0.5))
    sqs.save(model, path, nonzero=0.4)
    return model, skeleton, path


@pytest.fixture
def saved(tmp_path: Path) -> tuple[nn.Module, nn.Module, Path]:
    return _saved_net(0, tmp_path / "net.sqs")


def _body(path: Path) -> dict:
    return {k: v for k, v in read_artifact(path).header.items() if k not in META_KEYS}


def _write(out: Path, tensors: dict, meta: dict) -> Path:
    chunks, _alive = safetensors_chunks(tensors, {"sqs": canonical(meta)})
    out.write_bytes(b"".join(bytes(c) for c in chunks))
    return out


def _rebuild(path: Path, out: Path, *, packed: bytes | None = None, body: dict | None = None) -> Path:
    """A version-2 file with the header tensor ``packed`` (default: zlib of ``body``), every checksum valid
    except that the header SHA-256 is the original body's (so a changed body fails only that check)."""
    art = read_artifact(path)
    original = _body(path)
    packed = zlib.compress(canonical(body or original).encode()) if packed is None else packed
    tensors = dict(art.dense)
    tensors[HEADER_TENSOR] = torch.frombuffer(bytearray(packed), dtype=torch.uint8)
    tensors[BLOBS_TENSOR] = torch.cat(list(art.blobs.values()))
    meta = {"magic": MAGIC, "format_version": 2}
    meta["checksum"] = seal(meta | original, tensors)
    return _write(out, tensors, meta)


def test_layout_of_a_version_2_file(saved):
    _, _, path = saved
    art = read_artifact(path)
    assert art.header["format_version"] == 2
    tensors = {n for n in art.index_bytes if n.startswith(PREFIX)}
    assert tensors == {HEADER_TENSOR, BLOBS_TENSOR, CRC_TABLE}
    assert [r["layers"] for r in art.records] == [["first"], ["body.fc"], ["head"]]
    assert sum(b.numel() for b in art.blobs.values()) == sum(sum(r["sections"].values()) for r in art.records)


def test_rebuilt_file_loads_and_equals_the_original(saved, tmp_path):
    _, skeleton, path = saved
    loaded = sqs.load(_rebuild(path, tmp_path / "same.sqs"), copy.deepcopy(skeleton))
    reference = sqs.load(path, copy.deepcopy(skeleton))
    for a, b in zip(loaded.state_dict().values(), reference.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_damaged_header_body(saved, tmp_path):
    _, skeleton, path = saved
    with pytest.raises(ValueError, match="SQS header is not valid JSON"):
        sqs.load(_rebuild(path, tmp_path / "a.sqs", packed=zlib.compress(b'{"compressed": [')), skeleton)
    with pytest.raises(ValueError, match="does not decompress"):
        sqs.load(_rebuild(path, tmp_path / "b.sqs", packed=b"not zlib at all"), skeleton)
    with pytest.raises(ValueError, match="truncated or decompresses beyond"):
        sqs.load(
            _rebuild(path, tmp_path / "c.sqs", packed=zlib.compress(canonical(_body(path)).encode())[:-6]), skeleton
        )
    body = _body(path)
    body["compressed"][1]["kept"] += 1  # still valid JSON, still a consistent payload
    with pytest.raises(ValueError, match="header checksum mismatch"):
        sqs.load(_rebuild(path, tmp_path / "d.sqs", body=body), skeleton)
    with pytest.raises(ValueError, match="without magic, version or checksum"):
        sqs.load(_rebuild(path, tmp_path / "e.sqs", body=_body(path) | {"magic": MAGIC}), skeleton)


def test_decompression_bomb_is_refused(saved, tmp_path, monkeypatch):
    _, skeleton, path = saved
    monkeypatch.setattr(container_module, "MAX_HEADER_BYTES", 100)
    with pytest.raises(ValueError, match="decompresses beyond 100 bytes"):
        sqs.load(path, skeleton)


def test_flipped_blob_byte_names_the_layer(saved, tmp_path):
    _, skeleton, path = saved
    data = path.read_bytes()
    index, end = _index(data)
    art = read_artifact(path)
    start = art.blobs["first"].numel() + art.blobs["body.fc"].numel() // 2  # inside body.fc's blob
    offset = index[BLOBS_TENSOR]["data_offsets"][0]
    flipped = bytearray(data)
    flipped[end + offset + start] ^= 0x10
    (tmp_path / "p.sqs").write_bytes(bytes(flipped))
    expected = r"payload checksum mismatch.*\['@sqs/blobs'\] damaged \(the blob\(s\) of \['body\.fc'\]\)"
    with pytest.raises(ValueError, match=expected):
        sqs.load(tmp_path / "p.sqs", copy.deepcopy(skeleton))
    with pytest.raises(ValueError, match="payload checksum mismatch"):
        sqs.compression_report(tmp_path / "p.sqs")


def _index(data: bytes) -> tuple[dict, int]:
    """A file's safetensors JSON index, and where its tensor data starts."""
    end = 8 + int.from_bytes(data[:8], "little")
    return json.loads(data[8:end]), end


def test_blob_sizes_must_add_up(saved, tmp_path):
    _, skeleton, path = saved
    body = _body(path)
    body["compressed"][0]["sections"]["mask"] += 1
    out = _rebuild(path, tmp_path / "s.sqs", body=body)
    meta = _meta(out)
    meta["checksum"]["header"] = header_sha256(meta | body)  # a self-consistent header that lies about sizes
    tensors = _tensors(out)
    with pytest.raises(ValueError, match=r"sections add up to 1281 bytes, '@sqs/blobs' has 1280"):
        sqs.load(_write(tmp_path / "t.sqs", tensors, meta), skeleton)


def _meta(path: Path) -> dict:
    return json.loads(_index(path.read_bytes())[0]["__metadata__"]["sqs"])


def _tensors(path: Path) -> dict:
    return safetensors.torch.load(path.read_bytes())


def test_not_an_sqs_file_and_future_version(saved, tmp_path):
    _, skeleton, path = saved
    plain = _write(tmp_path / "plain.safetensors", skeleton.state_dict(), {"x": 1})
    with pytest.raises(ValueError, match="bad magic"):
        sqs.load(plain, copy.deepcopy(skeleton))
    meta = _meta(path) | {"format_version": 3}
    with pytest.raises(ValueError, match=r"unsupported format version 3 \(this library reads versions \(1, 2\)\)"):
        sqs.load(_write(tmp_path / "future.sqs", _tensors(path), meta), copy.deepcopy(skeleton))
    meta = _meta(path) | {"config": {}}
    with pytest.raises(ValueError, match="unexpected fields in the metadata header"):
        sqs.load(_write(tmp_path / "extra.sqs", _tensors(path), meta), copy.deepcopy(skeleton))


def _version_1(path: Path, out: Path) -> Path:
    """The same artifact in format version 1: the whole header in the metadata, one tensor per blob."""
    art = read_artifact(path)
    header = {k: v for k, v in art.header.items() if k != "checksum"} | {"format_version": 1}
    for record in header["compressed"]:
        record.pop("crc32")
        assert "escaped" not in record  # version 1 had only the plain code layout
    tensors = dict(art.dense) | {PREFIX + n: b.clone() for n, b in art.blobs.items()}
    header["checksum"] = seal(header, tensors)
    return _write(out, tensors, header)


def test_version_1_file_still_loads(tmp_path):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    skeleton = copy.deepcopy(model)
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, temperature=0.5))
    path = tmp_path / "v2.sqs"
    sqs.save(model, path, nonzero=0.5)
    old = _version_1(path, tmp_path / "v1.sqs")
    assert read_artifact(old).header["format_version"] == 1
    loaded = sqs.load(old, copy.deepcopy(skeleton))
    reference = sqs.load(path, copy.deepcopy(skeleton)).state_dict().values()
    for a, b in zip(loaded.state_dict().values(), reference, strict=True):
        assert torch.equal(a, b)
    g1, g2 = (torch.Generator().manual_seed(5) for _ in range(2))
    x = torch.randn(3, 16)
    old_avg = sqs.load_bayesian_average(old, copy.deepcopy(skeleton), samples=2, generator=g1)(x)
    assert torch.equal(old_avg, sqs.BayesianAverage(model, samples=2, nonzero=0.5, generator=g2)(x))
    report = sqs.compression_report(old)
    assert report.file_bytes == old.stat().st_size


def test_upgrade_keeps_weights_and_draws(tmp_path, capsys):
    _, skeleton, path = _saved_net(2, tmp_path / "v2.sqs")
    old = _version_1(path, tmp_path / "v1.sqs")
    new = tmp_path / "up.sqs"
    assert main(["upgrade", str(old), str(new)]) == 0
    assert "wrote" in capsys.readouterr().out
    art_old, art_new = read_artifact(old), read_artifact(new)
    assert art_new.header["format_version"] == 2 and new.stat().st_size < old.stat().st_size
    assert {k: art_new.header[k] for k in ("config", "nonzero", "alternatives")} == {
        k: art_old.header[k] for k in ("config", "nonzero", "alternatives")
    }
    for a, b in zip(art_new.weights().values(), art_old.weights().values(), strict=True):
        assert torch.equal(a, b)
    x = torch.randn(4, 6)
    outputs = []
    for file in (old, new):
        g = torch.Generator().manual_seed(9)
        outputs.append(sqs.load_bayesian_average(file, copy.deepcopy(skeleton), samples=3, generator=g)(x))
    assert torch.equal(outputs[0], outputs[1])
    before = new.read_bytes()
    sqs.upgrade(new, new)  # in place, and idempotent: the same bytes again
    assert new.read_bytes() == before
    assert main(["upgrade", str(tmp_path / "missing.sqs"), str(new)]) == 1
    assert "error:" in capsys.readouterr().err


def test_upgrade_of_tied_layers_without_alternatives(tmp_path):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    model[2].weight = model[0].weight  # tied: one posterior, one record for two layers
    skeleton = copy.deepcopy(model)
    sqs.prepare_(model, sqs.SQSConfig(num_components=4))
    path, new = tmp_path / "a.sqs", tmp_path / "b.sqs"
    sqs.save(model, path, nonzero=0.5, include_alternatives=False)
    sqs.upgrade(path, new)
    (record,) = read_artifact(new).records
    assert record["layers"] == ["0", "2"] and not read_artifact(new).header["alternatives"]
    loaded = sqs.load(new, copy.deepcopy(skeleton))
    assert loaded[0].weight is loaded[2].weight
    assert torch.equal(loaded[0].weight, sqs.load(path, copy.deepcopy(skeleton))[0].weight)
    with pytest.raises(ValueError, match="include_alternatives=False"):
        sqs.load(new, copy.deepcopy(skeleton), mode="sample", generator=torch.Generator())


def _big_all(rec: dict) -> None:
    rec["mask"], rec["shape"] = "all", [1 << 16, 1 << 14]  # 2^30 weights, a few kept: 8 GiB of positions


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda rec: rec.pop("mask"), "field 'mask' must be one of"),
        (lambda rec: rec.update(mask=["bitmap"]), "field 'mask' must be one of"),
        (lambda rec: rec.update(dtype=["float32"]), r"unsupported dtype \['float32'\]"),
        (_big_all, r"mask 'all' with \d+ of 1073741824 weights kept"),
        (lambda rec: rec.update(shape=[1 << 62, 4]), "beyond"),
    ],
)
def test_crafted_record_fields_are_refused_from_the_header(saved, tmp_path, edit, message, capsys):
    """A missing or mistyped mask or dtype failed with KeyError / TypeError deep in the decoders, and a shape the
    mask contradicts made upgrade allocate every weight's position (8 GiB) first (session 63)."""
    _, skeleton, path = saved
    bad = resealed(path, tmp_path / "bad.sqs", lambda records, _: edit(records[0]))
    before = {k: v.clone() for k, v in skeleton.state_dict().items()}
    for call in (lambda: sqs.load(bad, skeleton), lambda: sqs.upgrade(bad, tmp_path / "up.sqs")):
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(ValueError, match=message):
        sqs.compression_report(bad)
    assert main(["inspect", str(bad)]) != 0 and "Traceback" not in capsys.readouterr().err
    assert all(torch.equal(v, before[k]) for k, v in skeleton.state_dict().items())
    assert not (tmp_path / "up.sqs").exists()


@pytest.mark.parametrize(
    ("text", "message"), [("[" * 100_000 + "]" * 100_000, "maximum recursion"), ('{"a": NaN}', "NaN is not")]
)
def test_header_json_nested_too_deep_or_holding_nan_is_refused_by_name(saved, tmp_path, text, message):
    """Deeply nested JSON raised RecursionError, and a NaN literal (which Python's json reads) failed later in the
    checksum with a message naming neither the file nor the cause."""
    _, skeleton, path = saved
    bad = _rebuild(path, tmp_path / "nested.sqs", packed=zlib.compress(text.encode()))
    for call in (lambda: sqs.load(bad, skeleton), lambda: sqs.compression_report(bad)):
        with pytest.raises(ValueError, match=rf"{bad}: the SQS header is not valid JSON .*{message}"):
            call()


def test_an_escaped_record_without_its_escape_mask_is_refused(tmp_path):
    """The escaped code layout's ``escape_mask`` missing failed with KeyError in the decoder (session 63)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64))
    with torch.no_grad():
        model[0].weight.copy_(torch.randn(64, 64) ** 3)  # a few levels take most weights: the escaped layout
    skeleton = copy.deepcopy(model)
    sqs.prepare_(model, sqs.SQSConfig(num_components=64, windows="none"))
    path = tmp_path / "m.sqs"
    sqs.save(model, path, nonzero=1.0)
    assert "escape_mask" in read_artifact(path).records[0]
    bad = resealed(path, tmp_path / "bad.sqs", lambda records, _: records[0].pop("escape_mask"))
    for call in (lambda: sqs.load(bad, skeleton), lambda: sqs.upgrade(bad, tmp_path / "up.sqs")):
        with pytest.raises(ValueError, match="field 'escape_mask' must be one of"):
            call()
