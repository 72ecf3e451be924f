#!/usr/bin/env bash
# The one prepared run for a lent GPU machine (issue #16): build the core there, run tests/gpu
# (HVD_REQUIRE=gpu: a missing GPU fails), then the GPU benchmark. GPU time is scarce: the whole
# script is bounded to ~6 minutes so that a rerun fits. Everything it prints also lands under
# $OUT (default /tmp/gpu_check): nvidia-smi.txt, build.log, tests.log, bench_gpu.md/.json.
#
#   bash benchmarks/gpu_check.sh                   # on the GPU machine, in the checkout
#   OUT=$OUT bash benchmarks/gpu_check.sh           # under the device tool: files come back
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
HVD_REQUIRE=gpu timeout 200 "$PYTHON" -m pytest tests/gpu -q -rA -p no:cacheprovider \
    --timeout 120 --durations=10 > "$OUT/tests.log" 2>&1 || rc=1
tail -40 "$OUT/tests.log"

step "benchmarks/bench_gpu.py"
timeout 220 "$PYTHON" benchmarks/bench_gpu.py --out "$OUT/bench_gpu.md" || rc=1

step "done (exit $rc)"
exit "$rc"
