#!/usr/bin/env bash
# The checks that need a GPU, as one script for a lent GPU machine (never CI: CI has no GPU).
# 1. tests/core/test_cuda.py (training, inference and the artifact on CUDA against the CPU; the uncovered weights
#    on the eager, certified-compiled and dense routes) and test_autocast.py's CUDA test (the posterior under CUDA
#    autocast). On a fresh H200 in session 35 the whole file took over
#    230 s: the certified route's float64 kernels compile for minutes; TEST_TIMEOUT (default 300) bounds it.
# 2. gpu_dense.py: the compiled step of the 4096² Linear (K = 64, 2,048 tokens; sqs_core._dense, a GPU's compiled
#    route) beside a plain step, and its profile (~60 s from a bare machine).
# 3. bench_step.py --device cuda, eager, one case per process group (a case killed by its timeout loses only itself).
# gpu_chunk_sweep.py (the eager step against the chunk size, the certified compiled plan) is not run here.
# Run from the repository root with a python3 that holds a CUDA torch, pytest and hypothesis; sqs-core is taken
# from the source tree (PYTHONPATH), not installed. Results go to $OUT (default out/gpu, ignored by git).
# With the defaults it ends within ~8 minutes; a machine's start took 30-280 s, against a 15-minute device budget:
# call it once, `run` with timeout_s=540.
set -u
mkdir -p "${OUT:-out/gpu}"
OUT=$(cd "${OUT:-out/gpu}" && pwd)  # absolute: the benchmarks run from their own folder
ROOT=$PWD
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT/packages/sqs-core/src" HYPOTHESIS_PROFILE=ci
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, sqs_core; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), sqs_core.__file__)' \
    | tee -a "$OUT/gpu.txt"
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -v -p no:cacheprovider --durations=10 tests/core/test_cuda.py \
    tests/core/test_autocast.py -k cuda 2>&1 \
    | tee "$OUT/test_cuda.log" | grep -E "PASSED|FAILED|ERROR|passed|failed"
cd packages/sqs-core/benchmarks || exit 1
OUT="$OUT" timeout "${DENSE_TIMEOUT:-120}" python3 gpu_dense.py --variants 1 --profile 2>&1 | grep -v -i warn
# KIND:BATCH:TIMEOUT, the eager mode (~35 s a case on the H200; session 30 measured resnet20:128:45 and
# linear4096:8192:60 too)
for spec in ${CASES:-linear4096:2048:60}; do
    case=${spec%:*}
    timeout "${spec##*:}" python3 bench_step.py --device cuda --only "$case" --steps 30 --rounds 1 --warm-cache \
        --modes ${MODES:-plain sqs} --out "$OUT/step_bench_cuda_${case/:/_}.json" 2>&1 | tee -a "$OUT/bench.log"
done
# The compiled mode per case in its own process (COMPILED_CASES, none by default: gpu_dense.py above measures the
# 4096² case; e.g. COMPILED_CASES="resnet20:128:90" for the ResNet-20 at K = 4, not yet measured on the dense route)
for spec in ${COMPILED_CASES:-}; do
    case=${spec%:*}
    timeout "${spec##*:}" python3 bench_step.py --device cuda --only "$case" --steps 20 --rounds 1 --warm-cache \
        --modes plain sqs-compiled --out "$OUT/step_bench_cuda_compiled_${case/:/_}.json" 2>&1 | tee -a "$OUT/bench.log"
done
