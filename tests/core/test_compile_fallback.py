"""A kernel variant that fails to compile once the compiler has worked in this process (a failed C++ build under
load, dynamo's recompile limit after many configurations) runs its body eagerly with a warning instead of stopping
training; where no kernel ever compiled, compile_kernels=True fails naming the switch (test_fused); a kernel's own
error propagates; a torch.compile that is a no-op (TORCHDYNAMO_DISABLE=1) leaves "auto" layers eager."""

import logging

import pytest
import sqs_core as sqs
import torch
from conftest import failing_compile
from sqs_core import _compiled, _fused
from torch import nn

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def _double_then_add(x, y):
    return x.mul(2.0).add(y)


def test_a_variant_that_fails_to_compile_runs_eagerly_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(_compiled, "_COMPILED_ONCE", True)  # another kernel compiled: the compiler works here
    monkeypatch.setattr(torch, "compile", failing_compile(BlockingIOError(11, "Resource temporarily unavailable")))
    kernel = _compiled._Kernel(_double_then_add)
    x, y = torch.arange(6.0), torch.ones(6)
    with caplog.at_level(logging.WARNING, logger="sqs_core._compiled"):
        torch.testing.assert_close(kernel(x, y), x * 2 + 1, rtol=0, atol=0)
        assert all(word in caplog.text for word in ("_double_then_add", "run it eagerly", "BlockingIOError"))
        torch.testing.assert_close(kernel(x.double(), y.double()), x.double() * 2 + 1, rtol=0, atol=0)
    assert kernel.calls == 2 and len(kernel.eager_variants) == 2  # each variant warned once, then eager
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sqs_core._compiled"):
        torch.testing.assert_close(kernel(x + 1, y), x * 2 + 3, rtol=0, atol=0)
    assert not caplog.text


def test_a_kernels_own_error_propagates_and_is_not_taken_for_a_compile_failure(monkeypatch):
    monkeypatch.setattr(_compiled, "_COMPILED_ONCE", True)

    def compile_(fn, **options):
        def run(*args):
            raise IndexError("index 7 is out of bounds")  # as an index check inside a kernel reports it

        return run

    monkeypatch.setattr(torch, "compile", compile_)
    kernel = _compiled._Kernel(_double_then_add)
    with pytest.raises(IndexError, match="out of bounds"):
        kernel(torch.arange(6.0), torch.ones(6))
    assert not kernel.eager_variants


def _triple(x):
    return x * 3


def test_the_recompile_limit_reached_falls_back_to_the_eager_body(monkeypatch, caplog):
    """A real compile: a second dtype is a second graph, past a limit of one (RECOMPILE_LIMIT patched)."""
    monkeypatch.setattr(_compiled, "RECOMPILE_LIMIT", 1)
    monkeypatch.setattr(_compiled, "_COMPILED_ONCE", False)
    kernel = _compiled._Kernel(_triple)
    with torch._dynamo.config.patch(recompile_limit=1):
        torch.testing.assert_close(kernel(torch.arange(5.0)), torch.arange(5.0) * 3, rtol=0, atol=0)
        assert _compiled._COMPILED_ONCE
        with caplog.at_level(logging.WARNING, logger="sqs_core._compiled"):
            got = kernel(torch.arange(5, dtype=torch.float64))
    torch.testing.assert_close(got, torch.arange(5, dtype=torch.float64) * 3, rtol=0, atol=0)
    assert "run it eagerly" in caplog.text
    (reason,) = kernel.eager_variants.values()
    assert "FailOnRecompileLimitHit" in reason
    torch.testing.assert_close(kernel(torch.arange(7.0)), torch.arange(7.0) * 3, rtol=0, atol=0)
    assert len(kernel.eager_variants) == 1  # the float32 variant stays compiled


def test_a_training_step_survives_every_fused_kernel_failing_to_compile(monkeypatch, caplog):
    """compile_kernels="auto" after the probe compiled: the step runs, eagerly, to the eager path's numbers."""
    monkeypatch.setattr(_compiled, "AUTO_MIN_WEIGHTS", 100)
    assert _compiled.compiler_works()
    for kernel in _fused.KERNELS.values():  # compiled earlier in the suite: compile them again, failing
        monkeypatch.setattr(kernel, "compiled", None)
        monkeypatch.setattr(kernel, "eager_variants", {})
    monkeypatch.setattr(torch, "compile", failing_compile(OSError("simulated C++ build failure")))

    def step(compile_kernels):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(24, 32), nn.Tanh(), nn.Linear(32, 3))
        sqs.prepare_(model, sqs.SQSConfig(num_components=6, train_weight=True, compile_kernels=compile_kernels))
        model.double()
        x = torch.randn(7, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        loss = sqs.Objective(model, num_data=10)(model(x).square().mean())
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters()]

    with caplog.at_level(logging.WARNING, logger="sqs_core._compiled"):
        loss, grads = step("auto")
    assert "simulated C++ build failure" in caplog.text
    want_loss, want_grads = step(False)
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=0)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-14)


def test_auto_stays_eager_where_torch_compile_is_disabled(monkeypatch, caplog):
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    monkeypatch.setattr(_compiled, "_COMPILER_WORKS", None)
    with caplog.at_level(logging.WARNING, logger="sqs_core._compiled"):
        assert not _compiled.compiler_works()
    assert "disabled" in caplog.text
    assert not _compiled.use_compiled("auto", torch.empty(_compiled.AUTO_MIN_WEIGHTS))


def _mismatched(x, y):
    return x + y[:3]  # a size mismatch dynamo meets while tracing (TorchRuntimeError), eagerly a RuntimeError


def test_an_error_dynamo_meets_while_tracing_is_the_kernels_own_and_marks_nothing(monkeypatch):
    monkeypatch.setattr(_compiled, "_COMPILED_ONCE", True)
    kernel = _compiled._Kernel(_mismatched)
    with pytest.raises(RuntimeError, match="must match"):
        kernel(torch.ones(6), torch.ones(6))
    assert not kernel.eager_variants
    torch.testing.assert_close(kernel(torch.ones(3), torch.ones(6)), torch.full((3,), 2.0), rtol=0, atol=0)
    assert not kernel.eager_variants  # compiled, not eager
