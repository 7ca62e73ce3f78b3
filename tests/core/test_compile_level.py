"""This suite compiles inductor's kernels at -O1 (tests/core/conftest.py); users and benchmarks get inductor's -O3.
Inductor keeps IEEE semantics at every level (no fast-math, no FMA contraction), so the level may change compile
time only: a posterior's values and gradients from kernels compiled at -O3 in a fresh process (no conftest there)
are bitwise the ones this process computes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import FULL_OPTIMISATION
from sqs_core import chunked
from test_fused import _posterior, _values_and_grads
from torch._inductor import cpp_builder

# inductor's own use of torch.jit.script_method, not ours (as in test_fused)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

# K = 4, windows "none", θ trained, the first moments: the bin bounds, moments, one-hot backward, gate-KL and
# full-column kernels, small enough to compile at -O3 in seconds
SETTINGS = dict(num_components=4, windows="none", temperature=5e-3, train_weight=True)

CHUNK_ELEMENTS = 96  # several chunks, the last one smaller (as test_fused's small_chunks)

SCRIPT = """
import json, sys
import torch
sys.path.insert(0, {here!r})
from sqs_core import _compiled, chunked
from torch._inductor import cpp_builder
_compiled.INDEX_CHECKS = True  # as in the suite: the level is the only difference
chunked.CHUNK_ELEMENTS = {chunk}
from test_fused import _posterior, _values_and_grads
values, kstar = _values_and_grads(_posterior({settings!r}, True), False)
torch.save([*values, kstar], {out!r})
print(json.dumps(cpp_builder._get_optimization_cflags("g++")[0]))
"""


def _levels(cflags):
    return [flag for flag in cflags if flag.startswith("O") and flag[1:].isdigit()]


def test_kernels_at_o3_give_bitwise_the_values_of_this_suites_o1(tmp_path, monkeypatch):
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", CHUNK_ELEMENTS)
    values, kstar = _values_and_grads(_posterior(SETTINGS, True), False)
    out = tmp_path / "o3.pt"
    script = SCRIPT.format(here=str(Path(__file__).parent), settings=SETTINGS, chunk=CHUNK_ELEMENTS, out=str(out))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert _levels(json.loads(done.stdout.splitlines()[-1])) == ["O3"]
    assert _levels(cpp_builder._get_optimization_cflags("g++")[0]) == (["O3"] if FULL_OPTIMISATION else ["O1"])
    other = torch.load(out)
    assert len(other) == len(values) + 1
    for index, (a, b) in enumerate(zip([*values, kstar], other, strict=True)):
        assert a.dtype == b.dtype and torch.equal(a, b), f"output {index} differs between -O1 and -O3"
