"""Bad input to save / upgrade / load / load_bayesian_average / compression_report: a clear error, raised
before anything changes (the skeleton's weights, the file or whatever else is at the target path)."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path

import pytest
import sqs_core as sqs
import torch
from crafted_files import resealed
from hypothesis import given, settings
from hypothesis import strategies as st
from sqs_core.__main__ import main
from torch import nn


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[nn.Module, Path]:
    """(prepared model, its artifact at 50% non-zero, with alternatives to sample from)."""
    model = mlp()
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, temperature=0.5))
    path = tmp_path_factory.mktemp("saved") / "m.sqs"
    sqs.save(model, path, nonzero=0.5)
    return model, path


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# -- 1. load_bayesian_average checks everything before it writes -----------------------------------------
@pytest.mark.parametrize(
    "kwargs", [{"samples": 0}, {"samples": 2.0}, {"samples": True}, {"average": "mean"}, {"generator": 5}]
)
def test_bad_bayesian_average_arguments_leave_the_skeleton(saved, kwargs):
    _, path = saved
    skeleton = mlp(7)
    before = _state(skeleton)
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        sqs.load_bayesian_average(path, skeleton, **kwargs)
    assert _unchanged(skeleton, before)


# -- 2. writing through symlinks, never over FIFOs, keeping the mode -------------------------------------
def test_save_through_a_symlink_rewrites_its_target(saved, tmp_path):
    model, path = saved
    real = tmp_path / "real.sqs"
    real.write_bytes(b"old")
    (tmp_path / "sub").mkdir()
    link = tmp_path / "sub" / "link.sqs"
    link.symlink_to(Path("..") / "real.sqs")  # relative, from another folder
    chain = tmp_path / "chain.sqs"
    chain.symlink_to(link)
    sqs.save(model, chain, nonzero=0.5)
    assert chain.is_symlink() and link.is_symlink()
    assert real.read_bytes() == path.read_bytes()  # the same bytes as a plain save
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain.sqs", "real.sqs", "sub"]
    dangling = tmp_path / "dangling.sqs"
    dangling.symlink_to(tmp_path / "new.sqs")
    sqs.upgrade(path, dangling)
    assert dangling.is_symlink() and (tmp_path / "new.sqs").read_bytes() == path.read_bytes()


def test_fifo_target_is_refused_untouched(saved, tmp_path, capsys):
    model, path = saved
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(fifo)
    for target, shown in ((fifo, repr(str(fifo))), (link, f"{str(link)!r} (a link to {str(fifo)!r})")):
        with pytest.raises(ValueError, match="^" + re.escape(f"{shown} is not a regular file")):
            sqs.save(model, target, nonzero=0.5)
        with pytest.raises(ValueError, match="not a regular file"):
            sqs.upgrade(path, target)
    assert main(["upgrade", str(path), str(fifo)]) == 1
    assert "not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "pipe"]


@settings(max_examples=12)
@given(mode=st.integers(0, 0o777).map(lambda m: m | 0o400))
def test_an_existing_file_keeps_its_mode(saved, mode):
    model, path = saved
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "m.sqs"
        target.write_bytes(b"old")
        target.chmod(mode)
        sqs.save(model, target, nonzero=0.5)
        assert stat.S_IMODE(target.stat().st_mode) == mode
        assert target.read_bytes() == path.read_bytes()
        target.chmod(mode)
        sqs.upgrade(target, target)
        assert stat.S_IMODE(target.stat().st_mode) == mode


def test_a_new_file_gets_the_umask_mode(saved, tmp_path):
    model, _ = saved
    old = os.umask(0o027)
    try:
        sqs.save(model, tmp_path / "new.sqs", nonzero=0.5)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.sqs").stat().st_mode) == 0o640


# -- 3. meta skeletons -----------------------------------------------------------------------------------
def test_meta_skeleton_is_refused(saved):
    _, path = saved
    with torch.device("meta"):
        skeleton = mlp()
    for call in (sqs.load, sqs.load_bayesian_average):
        with pytest.raises(ValueError, match=r"'0\.weight' is on the meta device.*to_empty"):
            call(path, skeleton)
    assert skeleton[0].weight.is_meta
    loaded = sqs.load(path, skeleton.to_empty(device="cpu"))
    reference = sqs.load(path, mlp(3))
    assert all(
        torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), reference.state_dict().values(), strict=True)
    )


# -- 4. non-finite codebooks and alternative probabilities -----------------------------------------------
@settings(max_examples=15)
@given(value=st.sampled_from([float("nan"), float("inf"), float("-inf")]), which=st.integers(0, 1), at=st.data())
def test_non_finite_codebook_is_refused(saved, value, which, at):
    _, path = saved

    def poison(records, blobs):
        levels = records[which]["sections"]["codebook"] // 4  # float32 levels, the blob's first section
        blobs[which][: levels * 4].view(torch.float32)[at.draw(st.integers(0, levels - 1))] = value

    with tempfile.TemporaryDirectory() as folder:
        bad = resealed(path, Path(folder) / "bad.sqs", poison)
        skeleton = mlp(7)
        before = _state(skeleton)
        name = ["0", "2"][which]
        with pytest.raises(ValueError, match=rf"'{name}' has 1 NaN or infinite codebook level"):
            sqs.load(bad, skeleton)
        with pytest.raises(ValueError, match="NaN or infinite codebook"):
            sqs.compression_report(bad)
        assert _unchanged(skeleton, before)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.5])
def test_bad_alternative_probabilities_are_refused(saved, tmp_path, value):
    _, path = saved

    def poison(records, blobs):
        assert records[1]["alternatives"] > 0  # alt_probs, float16, is the blob's last section
        blobs[1][-2:] = torch.tensor([value], dtype=torch.float16).view(torch.uint8)

    bad = resealed(path, tmp_path / "bad.sqs", poison)
    skeleton = mlp(7)
    before = _state(skeleton)
    with pytest.raises(ValueError, match="'2' has alternative probabilities that are NaN, infinite or negative"):
        sqs.load(bad, skeleton, mode="sample", generator=torch.Generator())
    with pytest.raises(ValueError, match="'2' has alternative probabilities"):
        sqs.load_bayesian_average(bad, skeleton)
    assert _unchanged(skeleton, before)
    sqs.load(bad, skeleton)  # greedy weights need no alternatives


# -- 5. clear errors naming the argument or the user's path ----------------------------------------------
def test_bad_paths_and_arguments(saved, tmp_path):
    model, path = saved
    for bad in ("", None, 3, "a\0b"):
        with pytest.raises(ValueError, match="path must"):
            sqs.save(model, bad)
        with pytest.raises(ValueError, match="path must"):
            sqs.load(bad, mlp())
        with pytest.raises(ValueError, match="target must"):
            sqs.upgrade(path, bad)
        with pytest.raises(ValueError, match="source must"):
            sqs.upgrade(bad, tmp_path / "x.sqs")
    with pytest.raises(ValueError, match="path_or_model must"):
        sqs.compression_report(None)
    with pytest.raises(ValueError, match="path must"):
        sqs.compression_report("")
    for call in (sqs.load, sqs.load_bayesian_average):
        with pytest.raises(ValueError, match=r"generator must be a torch\.Generator or None, got 5"):
            call(path, mlp(), **({"mode": "sample"} if call is sqs.load else {}), generator=5)
    assert list(tmp_path.iterdir()) == []


def test_directory_target_names_the_users_path(saved, tmp_path):
    model, path = saved
    folder = tmp_path / "folder"
    folder.mkdir()
    for write in (lambda: sqs.save(model, folder, nonzero=0.5), lambda: sqs.upgrade(path, folder)):
        with pytest.raises(IsADirectoryError) as info:
            write()
        assert info.value.filename == str(folder)
    with pytest.raises(FileNotFoundError) as missing:
        sqs.save(model, tmp_path / "no" / "m.sqs", nonzero=0.5)
    assert missing.value.filename == str(tmp_path / "no" / "m.sqs")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"] and not any(folder.iterdir())


def test_a_path_ending_in_a_separator_is_refused_as_open_refuses_it(saved, tmp_path):
    """ "out/" names a folder: save wrote a file "out" (realpath drops the separator) and "keep.txt/" replaced the
    file keep.txt. Both refused now, as ``open`` refuses them, nothing written or replaced."""
    model, path = saved
    keep = tmp_path / "keep.txt"
    keep.write_text("precious")
    for write in (lambda t: sqs.save(model, t, nonzero=0.5), lambda t: sqs.upgrade(path, t)):
        with pytest.raises(IsADirectoryError, match="ends with a separator"):
            write(f"{tmp_path / 'out'}{os.sep}")
        with pytest.raises(NotADirectoryError, match="ends with a separator"):
            write(f"{keep}{os.sep}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"] and keep.read_text() == "precious"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_a_skeleton_of_another_dtype_is_told_how_to_load(saved, dtype):
    """The file holds the dtypes the model was saved in; a half skeleton is refused (nothing written), and the
    message says to load into the saved dtype and convert after."""
    _, path = saved
    skeleton = mlp(1).to(dtype)
    before = _state(skeleton)
    for load in (sqs.load, sqs.load_bayesian_average):
        with pytest.raises(ValueError, match=r"\(torch\.float32\) in the file.*then convert it: .*\.to\(torch\.\w+\)"):
            load(path, skeleton)
        assert all(torch.equal(v, before[k]) for k, v in skeleton.state_dict().items())
    converted = sqs.load(path, mlp(1)).to(dtype)  # what the message says works
    assert all(p.dtype == dtype for p in converted.parameters())


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_loaded_average_converted_after_loading_still_averages(saved, dtype):
    """load_bayesian_average's draws are set into the skeleton's parameters as they are at each forward: a model
    converted after loading (avg.to(dtype), as the dtype message advises) averaged its greedy weights before, the
    draws written into the tensors the conversion had replaced."""
    _, path = saved
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(3))
    want = sqs.load_bayesian_average(path, mlp(1), samples=3, generator=torch.Generator().manual_seed(0)).eval()(x)
    greedy = sqs.load(path, mlp(1))(x)
    assert not torch.allclose(want, greedy, atol=1e-3)  # the draws differ from the greedy weights
    avg = sqs.load_bayesian_average(path, mlp(1), samples=3, generator=torch.Generator().manual_seed(0)).eval()
    got = avg.to(dtype)(x.to(dtype)).float()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6 if dtype == torch.float64 else 5e-2)


class _TinyLM(nn.Module):
    """An embedding, a hidden Linear and a head: the head tied to the embedding or not, the hidden layer
    compressed or excluded (a dense tensor in the file)."""

    def __init__(self, tied: bool, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb, self.hidden = nn.Embedding(10, 10), nn.Linear(10, 10)
        self.head = nn.Linear(10, 10, bias=False)
        if tied:
            self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden(self.emb(x)))


@pytest.mark.parametrize("exclude", [(), ("hidden",)])
def test_a_skeleton_that_ties_what_the_file_holds_apart_is_refused(tmp_path, exclude):
    """A skeleton that ties two weights the saved model held apart (a language model built with tied embeddings,
    the file from the untied one) took both into its one tensor, the last winning: silently another model."""
    model = sqs.prepare_(_TinyLM(tied=False), sqs.SQSConfig(num_components=4, exclude=exclude))
    path = tmp_path / "m.sqs"
    sqs.save(model, path)
    skeleton = _TinyLM(tied=True, seed=1)
    before = _state(skeleton)
    with pytest.raises(ValueError, match=r"ties \['emb.weight', 'head.weight'\].*untied"):
        sqs.load(path, skeleton)
    with pytest.raises(ValueError, match="untied"):
        sqs.load_bayesian_average(path, skeleton)
    assert all(torch.equal(v, before[k]) for k, v in skeleton.state_dict().items())


def test_a_tie_the_file_holds_loads_tied_and_untied(tmp_path):
    """The saved model's tie (one record of two layers) loads into a tied skeleton and into an untied one, both
    computing what the saved greedy model computes; a dense tie (equal values in the file) loads tied too."""
    x = torch.tensor([[1, 2, 3]])
    for exclude in [(), ("emb", "head")]:
        model = sqs.prepare_(_TinyLM(tied=True), sqs.SQSConfig(num_components=4, exclude=exclude))
        path = tmp_path / "m.sqs"
        sqs.save(model, path)
        sqs.greedy_(model)
        want = model(x).detach()
        for tied in (True, False):
            torch.testing.assert_close(sqs.load(path, _TinyLM(tied=tied, seed=1))(x), want, rtol=0, atol=0)


def test_levels_beyond_a_float16_layers_range_are_refused_at_save(tmp_path):
    """A float16 layer's posterior is float32: training can move a level past 65504, which the file (levels in the
    layer's dtype) would hold as inf and load refuse as damage. save refuses it, writing nothing; a float32 copy
    saves and loads into a float32 skeleton."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 8)).half()
    with torch.no_grad():
        plain[0].weight.mul_(60000 / plain[0].weight.abs().max().float())
    model = sqs.prepare_(plain, sqs.SQSConfig(num_components=4, temperature=0.5))
    with torch.no_grad():
        sqs.posteriors(model)["0"].means.mul_(1.5)
    path = tmp_path / "m.sqs"
    with pytest.raises(ValueError, match=r"layer .0.: 2 of its quantization levels .* torch.float16 holds \(±65504\)"):
        sqs.save(model, path, nonzero=1.0)
    assert not path.exists() and not list(tmp_path.iterdir())
    model.float()
    sqs.save(model, path, nonzero=1.0)
    skeleton = sqs.load(path, nn.Sequential(nn.Linear(8, 8)))
    sqs.greedy_(model, nonzero=1.0)
    assert torch.equal(skeleton[0].weight, model[0].fixed_weight)
