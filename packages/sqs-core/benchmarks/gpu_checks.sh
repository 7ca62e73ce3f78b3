#!/usr/bin/env bash
# The checks that need a GPU, as one script for a lent GPU machine (never CI: CI has no GPU).
# 1. tests/core/test_cuda.py (training, inference and the artifact on CUDA against the CPU);
# 2. bench_step.py --device cuda, one case per process group (a case killed by its timeout loses only itself);
# 3. gpu_chunk_sweep.py: sqs_core._index_add's sums against index_add_, the eager and compiled step of the 4096²
#    Linear (K = 64, 2,048 tokens) against the chunk size, and a torch.profiler table of the compiled step.
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
# sqs_core._index_add's rows against index_add_, the eager and compiled step against DEVICE_CHUNK_ELEMENTS beside
# a plain step, and a profile of the compiled step (gpu_chunk_sweep.py; ~150 s on the H200 from a bare machine)
OUT="$OUT" timeout "${SWEEP_TIMEOUT:-160}" python3 gpu_chunk_sweep.py 2>&1 | grep -v -i warn
