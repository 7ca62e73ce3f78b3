"""docs/benchmarks.md states the training budget the committed runs (docs/results/cifar10_runs) record."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_the_documented_budget_is_the_one_the_committed_runs_record():
    """The page said 39 batches (≈ 400 steps) while every trained run recorded 350 steps."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    match = re.search(r"\*\*Budget\*\*: (\d+) epochs of (\d+) batches of (\d+) \((?:≈ )?([\d,]+) steps", text)
    assert match, "the Budget line of docs/benchmarks.md"
    epochs, batches, batch_size, steps = (int(g.replace(",", "")) for g in match.groups())
    recorded = Counter()
    for path in (ROOT / "docs" / "results" / "cifar10_runs").glob("*.json"):
        result = json.loads(path.read_text())
        train = result["record"].get("train")
        if train is not None:  # uniform does not train
            recorded[(result["config"]["epochs"], result["config"]["batch_size"], train["steps"])] += 1
    assert recorded == {(epochs, batch_size, steps): 43} and steps == epochs * batches
