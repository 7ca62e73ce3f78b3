"""The compiled kernels' loops run on every thread, whatever size they were compiled for (_compiled.THREADED)."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch
from sqs_core import _compiled
from sqs_core._compiled import THREADED, _Kernel, _known_option


def _dot_in_float64(x, y):
    return (x * y).sum(dtype=torch.float64), torch.sigmoid(x) * y


def test_dotted_settings_are_looked_up_level_by_level():
    assert _known_option("cpp.dynamic_threads")
    assert _known_option("max_fusion_size")
    assert not _known_option("cpp.no_such_setting")
    assert not _known_option("no_such_group.dynamic_threads")


@pytest.mark.parametrize("checks", [False, True])
def test_every_kernel_gets_the_threaded_settings_besides_its_own(monkeypatch, checks):
    """THREADED and the index checks as _compiled.INDEX_CHECKS is when a kernel compiles (off by default; this
    suite turns it on, tests/core/conftest.py), beside a kernel's own known settings."""
    seen = []

    def fake_compile(fn, dynamic, fullgraph, options):
        seen.append(options)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(_compiled, "INDEX_CHECKS", checks)
    x = torch.arange(4.0)
    _Kernel(_dot_in_float64)(x, x)
    _Kernel(_dot_in_float64, options={"max_fusion_size": 99, "no_such_setting": 1})(x, x)
    shared = {**THREADED, "assert_indirect_indexing": checks}
    assert seen == [shared, {**shared, "max_fusion_size": 99}]


def test_index_checks_are_off_by_default_and_on_in_this_suite():
    """The library's own INDEX_CHECKS, read from its source (tests/core/conftest.py set the module's to True)."""
    tree = ast.parse(inspect.getsource(_compiled))
    names = [(t, n.value) for n in tree.body if isinstance(n, ast.Assign) for t in n.targets]
    assigned = [ast.literal_eval(v) for t, v in names if isinstance(t, ast.Name) and t.id == "INDEX_CHECKS"]
    assert assigned == [False]
    assert _compiled.INDEX_CHECKS is True


@pytest.mark.skipif(not torch.backends.openmp.is_available(), reason="this torch has no OpenMP")
def test_a_kernel_compiled_for_a_small_call_has_a_parallel_loop():
    """Inductor parallelises a loop only if the sizes it compiles for give each thread enough work; a dynamic
    graph compiled for 432 weights (a small layer) then ran a 4096² layer's 16.7M on one thread. With THREADED the
    loop is an OpenMP one at any size, and the values stay the eager ones."""
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    x, y = torch.randn(432, generator=torch.Generator().manual_seed(0)), torch.linspace(-1.0, 1.0, 432)
    with inductor_config.patch(fx_graph_cache=False):  # compile here, so that the code can be read
        (total, gated), code = run_and_get_code(_Kernel(_dot_in_float64), x, y)
    assert "#pragma omp parallel" in "\n".join(code)
    want_total, want_gated = _dot_in_float64(x, y)
    torch.testing.assert_close(total, want_total)
    torch.testing.assert_close(gated, want_gated)
