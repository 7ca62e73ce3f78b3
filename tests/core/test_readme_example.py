"""The README's "Compress your own model" example runs as written, on a small MLP standing in for the user's model."""

import re
from pathlib import Path

import torch
from torch import nn

README = Path(__file__).resolve().parents[2] / "README.md"


def _example_code() -> str:
    """The first python block after the README's "Compress your own model" heading."""
    match = re.search(r"## Compress your own model.*?```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert match, f"no python example under '## Compress your own model' in {README}"
    return match.group(1)


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))


def test_the_readme_example_compresses_a_model_end_to_end(tmp_path, monkeypatch):
    """What the example leaves behind: a packed file, a model loaded from it whose compressed weights are half
    zero and on at most 4 levels per window, and a Bayesian average that returns the model's output shape."""
    monkeypatch.chdir(tmp_path)  # the example writes model.sqs to the working directory
    torch.manual_seed(0)
    xs, ys = torch.randn(256, 8), torch.randint(0, 3, (256,))
    loader = [(xs[i : i + 32], ys[i : i + 32]) for i in range(0, 256, 32)] * 3
    names = {"model": _net(), "train_set": list(zip(xs, ys, strict=True)), "loader": loader, "MyNet": _net}
    names["steps"] = len(loader)
    exec(compile(_example_code(), str(README), "exec"), names)  # the README's own code, run as written
    assert (tmp_path / "model.sqs").stat().st_size > 0
    plain = names["plain"]
    compressed = [plain[0].weight, plain[2].weight]
    nonzero = sum(int(w.count_nonzero()) for w in compressed) / sum(w.numel() for w in compressed)
    assert abs(nonzero - 0.5) < 0.01, nonzero
    for weight in compressed:  # 2 bits: at most K = 4 levels in each of at most 3 windows ("outlier"), plus 0
        assert torch.unique(weight).numel() <= 3 * 4 + 1
    assert names["avg"](xs[:5]).shape == (5, 3)
    assert torch.isfinite(plain(xs)).all()
