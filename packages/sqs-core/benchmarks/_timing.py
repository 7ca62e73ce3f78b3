"""Shared by the benchmark scripts (run as ``python bench_*.py`` from this folder): best-of-N wall time, the
machine a run measured, and writing a result file whole or not at all."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch
from sqs_core.files import write_atomic


def best_seconds(fn: Callable[[], object], repeats: int, *, warmup: bool = False) -> float:
    """The fastest of ``repeats`` calls of ``fn`` (after one untimed call when ``warmup``)."""
    if warmup:
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def restart_peak_rss() -> bool:
    """Linux: restart this process's VmHWM (peak RSS) from its current RSS, through /proc/self/clear_refs, so that
    :func:`peak_rss_mib` then reports the peak of what runs after; False where that file is not there."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_rss_mib() -> float | None:
    """This process's VmHWM in MiB (Linux), None where /proc/self/status does not give it."""
    try:
        with open("/proc/self/status", encoding="utf-8") as status:
            for line in status:
                if line.startswith("VmHWM"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def write_json(path: Path | str, data: object, *, indent: int = 2) -> None:
    """``data`` as JSON (and a final newline) at ``path``, its folder made if missing, written whole or not at
    all by sqs-core's atomic writer (sqs_core.files: temporary file beside it, fsync, rename), so an
    interrupted run leaves the earlier file, never half of one."""
    text = json.dumps(data, indent=indent) + "\n"  # serialised first: a value JSON refuses leaves no file behind
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def cpu_model() -> str | None:
    """The first CPU's model name, family and model number from /proc/cpuinfo (Linux), else None: a VM may
    name only the vendor, and the step figures differ between CPUs of one architecture (docs/step-benchmarks.md),
    so a result names the one it ran on."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            first = info.read().split("\n\n")[0]
    except OSError:
        return None
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first.splitlines())}
    if "model name" not in fields:
        return None
    return f"{fields['model name']} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def machine_info() -> dict:
    """The machine a run measured: platform, CPU model and the kernels torch picked for it, CPUs, Python, torch
    and its threads, and the allocator settings (LD_PRELOAD, GLIBC_TUNABLES), which change peak RSS and speed on
    the CPU (docs/method.md, "Memory")."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "ld_preload": os.environ.get("LD_PRELOAD") or None,
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES") or None,
    }
