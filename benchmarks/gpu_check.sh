#!/usr/bin/env bash
# The one prepared run for a lent GPU machine (issue #16): build the core there, run tests/gpu
# (HVD_REQUIRE=gpu: a missing GPU fails), then the GPU benchmark. GPU time is scarce: the whole
# script is bounded to ~7 minutes so that a rerun fits. Everything it prints also lands under
# $OUT (default /tmp/gpu_check): nvidia-smi.txt, build.log, tests.log, bench_gpu.md/.json.
#
#   bash benchmarks/gpu_check.sh                   # on the GPU machine, in the checkout
#   OUT=$OUT bash benchmarks/gpu_check.sh           # under the device tool: files come back
#   TESTS=tests/gpu/test_ipc_gpu.py TEST_K="not np4" CASES=ipc,ipc_latency bash benchmarks/gpu_check.sh
#   TESTS=tests/gpu/test_mps_gpu.py CASES=ipc_mps bash benchmarks/gpu_check.sh  # MPS (#19)
#
# TESTS: pytest's arguments (default tests/gpu), TEST_K its -k expression; CASES: bench_gpu.py's --cases (default all);
# TEST_TIMEOUT / BENCH_TIMEOUT bound each step in seconds.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
rc=0
step() { printf '\n=== %s (%s) ===\n' "$1" "$(date +%T)"; }

step "machine"
nvidia-smi 2>&1 | tee "$OUT/nvidia-smi.txt" | head -20
nvidia-smi -q 2>/dev/null | grep -iE "compute mode|mig mode" -A1 | head -6
command -v nvidia-cuda-mps-control >/dev/null && echo "MPS control present (not started)"
"$PYTHON" -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"

step "build"
if ! timeout 240 "$PYTHON" setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"
    echo "build failed"
    exit 1
fi
tail -2 "$OUT/build.log"
"$PYTHON" -c "from engine_native import gpu; print(gpu.require_cuda()['path']); print(gpu.nccl_info()['version_text'], gpu.nccl_info()['path'])"

step "test dependencies"
# The machine has no registry: wheels the tests need but it lacks (ml_dtypes, pytest-timeout)
# may be brought along in $WHEELS and are unpacked onto PYTHONPATH, nothing installed.
WHEELS=${WHEELS:-.gpu_wheels}
for module in ml_dtypes pytest_timeout; do
    "$PYTHON" -c "import $module" 2>/dev/null && { echo "$module: present"; continue; }
    wheel=$(ls "$WHEELS"/"${module}"-*.whl 2>/dev/null | head -1)
    if [ -z "$wheel" ]; then echo "$module: missing and no wheel in $WHEELS"; rc=1; continue; fi
    mkdir -p /tmp/gpu_check_site && "$PYTHON" -m zipfile -e "$wheel" /tmp/gpu_check_site
    export PYTHONPATH="/tmp/gpu_check_site:$PYTHONPATH"
    echo "$module: from $(basename "$wheel")"
done

step "tests/gpu"
# shellcheck disable=SC2086 # TESTS is a list of pytest arguments
HVD_REQUIRE=gpu timeout "${TEST_TIMEOUT:-200}" "$PYTHON" -m pytest ${TESTS:-tests/gpu} \
    ${TEST_K:+-k "$TEST_K"} -q -rA \
    -p no:cacheprovider --timeout 150 --durations=15 > "$OUT/tests.log" 2>&1 || rc=1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -40

step "benchmarks/bench_gpu.py"
timeout "${BENCH_TIMEOUT:-220}" "$PYTHON" benchmarks/bench_gpu.py --out "$OUT/bench_gpu.md" \
    ${CASES:+--cases "$CASES"} ${BENCH_ARGS:-} || rc=1

step "done (exit $rc)"
exit "$rc"
