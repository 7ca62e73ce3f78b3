#!/usr/bin/env bash
# The checks that need a GPU, as one script for a lent GPU machine (never CI: CI has no GPU).
# 1. tests/core/test_cuda.py (training, inference and the artifact on CUDA against the CPU);
#    then sqs_core._index_add's long sums timed against index_add_ (seconds);
# 2. bench_step.py --device cuda, one case per process group (a case killed by its timeout loses only itself);
# 3. torch.profiler tables of the eager and the compiled SQS step of the 4096² Linear, K = 64, 2,048 tokens.
# Run from the repository root with a python3 that holds a CUDA torch, pytest and hypothesis; sqs-core is taken
# from the source tree (PYTHONPATH), not installed. Results go to $OUT (default out/gpu, ignored by git).
# With the defaults it ends within ~9.5 minutes (each part has its own timeout); on the lent H200 a machine's start
# took 30 s once and 280 s once, against a 15-minute device budget: call it once, `run` with timeout_s=590.
set -u
mkdir -p "${OUT:-out/gpu}"
OUT=$(cd "${OUT:-out/gpu}" && pwd)  # absolute: the benchmarks run from their own folder
ROOT=$PWD
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT/packages/sqs-core/src" HYPOTHESIS_PROFILE=ci
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, sqs_core; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), sqs_core.__file__)' \
    | tee -a "$OUT/gpu.txt"
timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider --durations=10 tests/core/test_cuda.py 2>&1 \
    | tee "$OUT/test_cuda.log"
timeout "${SUMS_TIMEOUT:-30}" python3 - <<'PY' 2>&1 | tee "$OUT/index_add.txt"
# sqs_core._index_add's rows against one index_add_ (atomic adds on few addresses), 2^20 float64 sources
import torch
from sqs_core._index_add import index_add_all
def ms(fn, reps=50):
    fn(); torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record(); torch.cuda.synchronize()
    return start.elapsed_time(end) / reps
for entries in (128, 256, 4096):
    index = torch.randint(0, entries, (1 << 20,), device="cuda")
    source = torch.randn(1 << 20, dtype=torch.float64, device="cuda")
    acc = torch.zeros(entries, dtype=torch.float64, device="cuda")
    plain = ms(lambda: acc.index_add_(0, index, source))
    rows = ms(lambda: index_add_all([(acc, index, source)]))
    print(f"2^20 float64 sources into {entries} entries: index_add_ {plain:.3f} ms, index_add_all {rows:.3f} ms")
PY
cd packages/sqs-core/benchmarks || exit 1
# KIND:BATCH:TIMEOUT; eager cases first (~35 s each on the H200; session 30 measured resnet20:128:45 and
# linear4096:8192:60 too), then the compiled mode alone: its first process compiles the kernels (the float64
# ones of test_cuda.py took 130-150 s there)
for spec in ${CASES:-linear4096:2048:60}; do
    case=${spec%:*}
    timeout "${spec##*:}" python3 bench_step.py --device cuda --only "$case" --steps 30 --rounds 1 --warm-cache \
        --modes ${MODES:-plain sqs} --out "$OUT/step_bench_cuda_${case/:/_}.json" 2>&1 | tee -a "$OUT/bench.log"
done
for spec in ${COMPILED_CASES:-linear4096:2048:170}; do
    case=${spec%:*}
    timeout "${spec##*:}" python3 bench_step.py --device cuda --only "$case" --steps 20 --rounds 1 --warm-cache \
        --modes sqs-compiled --out "$OUT/step_bench_cuda_compiled_${case/:/_}.json" 2>&1 | tee -a "$OUT/bench.log"
done
# MODE:TIMEOUT: a profile of three steps of each mode (the compiled one with the kernels cached by the bench above),
# then its step time and peak at three chunk sizes, and a plain step's
for spec in ${PROFILES:-sqs:45 sqs-compiled:70}; do
timeout "${spec##*:}" python3 - "${spec%:*}" "$OUT/profile_${spec%:*}_2048.txt" <<'PY' 2>&1 | tail -8
import sys, torch
from _step_models import build, training
model, x, loss_fn = build("linear4096", 2048, torch.device("cuda"))
opt, loss_of = training(model, loss_fn, sys.argv[1], 64)
def step():
    loss = loss_of(model(x)); opt.zero_grad(); loss.backward(); opt.step()
for _ in range(3):
    step()
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
open(sys.argv[2], "w").write(table + "\n\n" + prof.key_averages().table(sort_by="cpu_time_total", row_limit=30))
print("profile written", sys.argv[1])
# the step against sqs_core.chunked.CHUNK_ELEMENTS (sized for a CPU's caches), beside a plain step in this process
import sqs_core.chunked as chunked
def per_step(fn, steps=10):
    fn(); fn(); torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        fn()
    end.record(); torch.cuda.synchronize()
    return start.elapsed_time(end) / steps, torch.cuda.max_memory_allocated() / 2**20
for chunk in (1 << 18, 1 << 20, 1 << 22):
    chunked.CHUNK_ELEMENTS = chunk
    print(sys.argv[1], f"CHUNK_ELEMENTS 2^{chunk.bit_length() - 1}: %.2f ms/step, peak %.0f MiB" % per_step(step))
del model, opt
plain, x, loss_fn = build("linear4096", 2048, torch.device("cuda"))
plain_opt, _ = training(plain, loss_fn, "plain", 64)
def plain_step():
    loss = loss_fn(plain(x)); plain_opt.zero_grad(); loss.backward(); plain_opt.step()
print("plain: %.2f ms/step, peak %.0f MiB" % per_step(plain_step))
PY
done
