"""Where and with what the convergence study ran: recorded in its JSON next to the results.

The study's numbers are bit-reproducible only on the same CPU (model and the kernels torch picks for it,
``torch_cpu_capability``) with the same thread count (``torch_threads`` and the OpenMP / MKL settings in
``thread_env``): a reduction split over another number of threads, or vectorised for another instruction
set, rounds differently, and the optimiser amplifies the last-bit differences.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

__all__ = ["THREAD_ENV_PREFIXES", "cpu_model", "machine_info"]

THREAD_ENV_PREFIXES = ("OMP_", "MKL_", "KMP_", "OPENBLAS_", "GOMP_")  # threading and kernel choice of the BLAS


def cpu_model(cpuinfo: Path | str = "/proc/cpuinfo") -> str:
    """The CPU's model name: the first ``model name`` line of ``cpuinfo`` where there is one (Linux), else
    ``platform.processor()`` or ``platform.machine()`` (which on Linux say only ``x86_64``)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _torch_info() -> dict:
    """torch's version, threads and CPU kernel capability: read only if the study has imported torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):  # older torch
        capability = None
    return {
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "torch_cpu_capability": capability,
    }


def _git() -> dict | None:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def machine_info() -> dict:
    """The platform, CPU model, core count, thread settings and library versions of this process (and the
    git commit), for the study's JSON."""
    import numpy as np

    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        **_torch_info(),
        "thread_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(THREAD_ENV_PREFIXES)},
        "numpy": np.__version__,
    }
    core = sys.modules.get("sqs_core")
    if core is not None:
        info.update(sqs_core=core.__version__, sqs_core_path=str(Path(core.__file__ or "").parent))
    info["git"] = _git()
    return info
