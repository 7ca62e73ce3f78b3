"""The compile machinery of the fused kernels (``SQSConfig.compile_kernels``): each kernel body is compiled
with inductor on its first call, and :func:`use_compiled` decides which layers use them. Importing this module
compiles nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

__all__: list[str] = []  # used by sqs_core._fused and sqs_core._fused_uncovered

log = logging.getLogger(__name__)

RECOMPILE_LIMIT = 64  # graphs per kernel (see _Kernel._run)

AUTO_MIN_WEIGHTS = 1 << 20
"""``compile_kernels="auto"`` compiles the kernels of a CPU layer with at least this many weights. Compiling
costs 20–35 s once per process with a warm inductor cache (minutes on a new machine); late in a scheduled run
of the 4096² Linear (K = 64, 2,048 tokens) a compiled step saves 0.2–0.8 s against the eager one on the three
CPUs measured (docs/method.md, "Session 50"), so it pays for itself within ~40–150 steps. Small layers (a CIFAR
ResNet-20's are under 37k weights) meet the targets eagerly and stay eager, with no compiler needed."""

THREADED = {"cpp.dynamic_threads": True}
"""Inductor settings of every kernel: a CPU loop is always an OpenMP parallel loop. Inductor decides whether to
parallelise from the sizes of the call it compiles for, and with ``dynamic=True`` (or from its FX-graph cache, which
ignores sizes) that graph then serves every size: compiled first for a small layer, the kernels over all T weights of
a 4096² layer ran on one thread (session 47, AMD EPYC, 2 threads: the moments forward 363 ms a step, the one-hot
backward 208 ms, both without a parallel loop). With this setting OpenMP runs each loop on every thread; a
reduction's per-thread partial sums are combined in thread order, so a result depends on the thread count only."""


INDEX_CHECKS = False
"""Whether the kernels check every index they gather with against the size of the tensor it reads (inductor's
``assert_indirect_indexing``). Off: every such index is in range by construction (bins clamped into the table,
flat component indices w·K + k from the bin table and the certificate, weights from ``nonzero``, windows from the
layer's own buffer); on session 51's Intel Xeon (AVX-512, 2 threads) the checks took 17% of the late 4096² step's
kernel time, 331 against 276 ms a step (session 48's AVX2 EPYC showed no gain within its noise). The core test
suite turns them on (tests/core/conftest.py), so that an index out of range fails there instead of reading stray
memory. Read when a kernel compiles (its first call in a process)."""


class _Kernel:
    """``fn`` compiled with inductor on its first call; ``calls`` counts the calls (tests check it).
    ``dynamic``: torch.compile's: True (the default here) compiles one graph for every size; None specialises the
    sizes of the first call and makes a size dynamic once it changes (sqs_core._dense: K stays a constant, so its
    reductions over the components are unrolled into registers instead of loops that recompute their inputs).
    ``options``: inductor settings for this kernel alone (torch.compile's ``options``), added to :data:`THREADED`.
    ``eager_variants``: the call signatures (:func:`_variant`) whose graph failed to compile, each with the reason:
    those calls run the body eagerly; the others stay compiled."""

    def __init__(self, fn: Callable[..., Any], dynamic: bool | None = True, options: dict | None = None) -> None:
        self.fn = fn
        self.dynamic = dynamic
        self.options = options
        self.compiled: Callable[..., Any] | None = None
        self.eager_variants: dict[tuple, str] = {}
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if args[0].shape[0] < 2:  # dynamic shapes still specialise sizes 0 and 1: a graph each; not worth it
            return self.fn(*args)
        if self.eager_variants and _variant(args) in self.eager_variants:
            return self.fn(*args)
        args = tuple(_unviewed(a) for a in args)
        if self.compiled is None:
            log.info("compiling %s with torch.compile (once per process; takes seconds)", self.fn.__name__)
            settings = {**THREADED, "assert_indirect_indexing": INDEX_CHECKS, **(self.options or {})}
            known = {k: v for k, v in settings.items() if _known_option(k)}
            self.compiled = torch.compile(self.fn, dynamic=self.dynamic, fullgraph=True, options=known)
            if self.compiled is self.fn and self.fn is not _probe:
                log.warning(
                    "SQSConfig.compile_kernels=True, but torch.compile is disabled in this process "
                    "(TORCHDYNAMO_DISABLE=1?): %s runs uncompiled, slower than compile_kernels=False",
                    self.fn.__name__,
                )
        try:
            out = self._run(self.compiled, args)
        except Exception as exc:
            if not isinstance(exc, _compile_errors()):  # the kernel's own error
                raise
            return self._fall_back(exc, args)  # raised before the kernel ran: nothing was written
        if self.compiled is not self.fn:
            _mark_compiled()
        return out

    @staticmethod
    def _run(compiled: Callable[..., Any], args: tuple) -> Any:
        """The compiled call. A kernel legitimately needs more graphs than dynamo's default limit of 8 per
        function (grad mode × responsibility kind × Var or not × dtype × nearby width): past it, a new variant
        raises FailOnRecompileLimitHit (fullgraph) before anything runs, and is compiled again under
        RECOMPILE_LIMIT. The limit is raised only for that call, and calls of compiled variants pay nothing."""
        try:
            return compiled(*args)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                return compiled(*args)

    def _fall_back(self, exc: Exception, args: tuple) -> Any:
        """A variant that did not compile (a failed C++ build, dynamo's recompile limit reached after many
        configurations in one process): where some kernel has compiled and run in this process, calls of this
        signature run the body eagerly from now on (the same formulas, slower), with a WARNING; where none has, the
        compiler does not work here: a RuntimeError naming ``compile_kernels``. The body runs first: an error of
        the kernel's own that dynamo met while tracing (a TorchRuntimeError) is raised from it, nothing marked."""
        if not _COMPILED_ONCE:
            self.compiled = None
            raise RuntimeError(
                f"SQSConfig.compile_kernels: torch.compile failed on {self.fn.__name__} ({type(exc).__name__}); "
                "inductor needs a working C++ compiler on CPU. Set compile_kernels=False to train eagerly."
            ) from exc
        out = self.fn(*args)
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        self.eager_variants[_variant(args)] = reason
        log.warning(
            "SQSConfig.compile_kernels: torch.compile failed on a new variant of %s (%s); calls like this one run "
            "it eagerly from now on in this process (the same results, slower)",
            self.fn.__name__,
            reason,
        )
        return out


def _variant(args: tuple) -> tuple:
    """What tells a kernel's graphs apart, as far as a call shows it: each tensor's dtype, rank, device and
    whether it requires grad (sizes are dynamic), the other arguments' values (an int's type only: sizes and
    offsets vary from call to call), and the grad mode."""
    return (torch.is_grad_enabled(), *(_signature(a) for a in args))


def _signature(value: Any) -> Any:
    """One argument's part of :func:`_variant`."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.dim(), value.device.type, value.requires_grad)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *(_signature(v) for v in value))
    if isinstance(value, (bool, float, str, type(None))):
        return value
    return type(value).__name__


def _compile_errors() -> tuple[type[Exception], ...]:
    """What a compiled call raises when compiling (tracing, lowering, the C++ build) fails, before the kernel runs:
    inductor's InductorError and BackendCompilerFailed are TorchDynamoExceptions. An error of the kernel itself
    (an index out of range under INDEX_CHECKS) is none of these and propagates. (A function: importing
    torch._dynamo at sqs_core's import would cost seconds.)"""
    return (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit)


_COMPILED_ONCE = False  # whether some kernel has compiled and run in this process (the compiler works here)


def _mark_compiled() -> None:
    """Record that a compiled kernel ran in this process: from now on a variant that fails to compile falls back."""
    global _COMPILED_ONCE
    _COMPILED_ONCE = True


def use_compiled(setting: bool | str, weight: torch.Tensor) -> bool:
    """Whether a layer whose ``SQSConfig.compile_kernels`` is ``setting`` and whose θ is ``weight`` runs the
    compiled kernels: ``setting`` itself when it is a bool; for ``"auto"``, a CPU layer of at least
    :data:`AUTO_MIN_WEIGHTS` weights where :func:`compiler_works`. On an accelerator ``"auto"`` stays eager."""
    if isinstance(setting, bool):
        return setting
    return weight.device.type == "cpu" and weight.numel() >= AUTO_MIN_WEIGHTS and compiler_works()


_COMPILER_WORKS: bool | None = None  # compiler_works' answer in this process


def compiler_works() -> bool:
    """Whether ``torch.compile`` compiles and runs a small kernel here (once per process; a few seconds the first
    time). False, with a warning naming the error, where it fails (no C++ compiler, say) or is a no-op
    (TORCHDYNAMO_DISABLE=1: the kernels' bodies would run uncompiled, slower than the eager path): ``"auto"`` layers
    then train eagerly instead."""
    global _COMPILER_WORKS
    if _COMPILER_WORKS is None:
        x = torch.arange(4, dtype=torch.float32)
        probe = _Kernel(_probe)
        try:
            _COMPILER_WORKS = bool(torch.equal(probe(x), _probe(x)))
            if probe.compiled is _probe:  # torch.compile returned the function itself: a no-op here
                _COMPILER_WORKS = False
                log.warning(
                    "compile_kernels='auto': torch.compile is disabled in this process (TORCHDYNAMO_DISABLE=1?); "
                    "every layer trains eagerly"
                )
        except Exception as exc:  # whatever inductor raises (a missing compiler, a broken toolchain): eager
            _COMPILER_WORKS = False
            cause = exc.__cause__ or exc  # _Kernel wraps inductor's error
            log.warning("compile_kernels='auto': torch.compile failed here (%r); every layer trains eagerly", cause)
    return _COMPILER_WORKS


def _probe(x: torch.Tensor) -> torch.Tensor:
    """The kernel :func:`compiler_works` compiles: one fused elementwise pass."""
    return x.mul(2.0).add_(1.0)


def _known_option(name: str) -> bool:
    """Whether this torch's inductor has the setting ``name``, dotted for a nested one (``cpp.dynamic_threads``):
    settings come and go between versions."""
    import torch._inductor.config as inductor_config

    owner: Any = inductor_config
    for part in name.split("."):
        if not hasattr(owner, part):
            return False
        owner = getattr(owner, part)
    return True


def _unviewed(value: Any) -> Any:
    """A view (say ``conv.weight.reshape(-1)[a:b]``) as a plain tensor when no gradient must flow through it:
    dynamo guards on a view's base's shape, which would recompile the kernels for every layer shape."""
    viewed = isinstance(value, torch.Tensor) and value._base is not None
    return value.detach() if viewed and not (torch.is_grad_enabled() and value.requires_grad) else value


def _scalar(value: float) -> torch.Tensor:
    """A 0-d float64 tensor: a kernel input whose value is not baked into the compiled graph."""
    return torch.tensor(value, dtype=torch.float64)
