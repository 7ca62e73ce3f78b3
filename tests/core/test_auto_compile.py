"""``compile_kernels="auto"`` (the default): which layers run the compiled kernels (sqs_core._compiled.use_compiled).

Large CPU layers compile once a probe kernel has compiled here; small layers, accelerators and machines where
torch.compile fails train eagerly. The threshold is lowered in these tests so that small layers stand for large
ones (the kernels serve every size with the same graphs)."""

import logging

import pytest
import sqs_core as sqs
import torch
from sqs_core import _compiled, _fused
from torch import nn

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

SETTINGS = dict(num_components=4, windows="none", temperature=5e-3, train_weight=True)  # test_fused's first case


def _model(seed: int = 0, **config):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(17, 24), nn.Tanh(), nn.Linear(24, 3))  # 408 and 72 weights
    sqs.prepare_(model, sqs.SQSConfig(**{**SETTINGS, **config}))
    return model.double()


def _step(model):
    x = torch.randn(5, 17, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    loss = model(x).square().mean() + 1e-3 * sqs.Objective(model, num_data=10).kl()
    loss.backward()
    return loss.detach()


def _never_probed(monkeypatch):
    def fail():
        raise AssertionError("compiler_works was called")

    monkeypatch.setattr(_compiled, "compiler_works", fail)


def test_bool_settings_are_taken_as_they_are(monkeypatch):
    _never_probed(monkeypatch)
    big = torch.empty(_compiled.AUTO_MIN_WEIGHTS)
    assert _compiled.use_compiled(True, torch.empty(3)) is True
    assert _compiled.use_compiled(False, big) is False


def test_auto_leaves_small_and_non_cpu_layers_eager_without_probing(monkeypatch):
    _never_probed(monkeypatch)
    assert not _compiled.use_compiled("auto", torch.empty(_compiled.AUTO_MIN_WEIGHTS - 1))
    assert not _compiled.use_compiled("auto", torch.empty(_compiled.AUTO_MIN_WEIGHTS, device="meta"))
    model = _model()  # the default config: "auto"
    assert [p.config.compile_kernels for p in sqs.posteriors(model).values()] == ["auto", "auto"]
    assert not any(p.spec().compiled for p in sqs.posteriors(model).values())


def test_auto_compiles_layers_from_the_threshold_and_matches_forced(monkeypatch):
    monkeypatch.setattr(_compiled, "AUTO_MIN_WEIGHTS", 100)  # the first layer (408) counts as large
    auto = _model()
    first, second = sqs.posteriors(auto).values()
    assert first.spec().compiled and not second.spec().compiled
    before = _fused.KERNELS["_moments_first"].calls
    loss_auto = _step(auto)
    assert _fused.KERNELS["_moments_first"].calls == before + 1  # the large layer only
    forced = _model(overrides={r"^0$": {"compile_kernels": True}, r"^2$": {"compile_kernels": False}})
    torch.testing.assert_close(_step(forced), loss_auto, rtol=0, atol=0)  # the same routes: the same numbers
    for got, want in zip(auto.parameters(), forced.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=0)


def test_auto_trains_eagerly_where_compiling_fails(no_compiler, monkeypatch, caplog):
    monkeypatch.setattr(_compiled, "_COMPILER_WORKS", None)  # probe again, under the broken compiler
    monkeypatch.setattr(_compiled, "AUTO_MIN_WEIGHTS", 100)
    model = _model()
    with caplog.at_level(logging.WARNING, logger="sqs_core._compiled"):
        assert not any(p.spec().compiled for p in sqs.posteriors(model).values())
    assert "no C++ compiler" in caplog.text and "trains eagerly" in caplog.text
    calls = {name: kernel.calls for name, kernel in _fused.KERNELS.items()}
    loss = _step(model)
    assert {name: kernel.calls for name, kernel in _fused.KERNELS.items()} == calls  # no compiled kernel ran
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    caplog.clear()
    assert not _compiled.compiler_works() and not caplog.text  # asked once per process, warned once


def test_probe_result_is_kept(monkeypatch):
    monkeypatch.setattr(_compiled, "_COMPILER_WORKS", None)
    assert _compiled.compiler_works()  # this machine (and CI) has a C++ compiler: the other tests compile too
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("probed twice"))
    assert _compiled.compiler_works()
