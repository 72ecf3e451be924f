#!/usr/bin/env bash
# The one prepared run for a lent GPU machine (issues #16, #39 item 7): build the core there, run
# tests/gpu (HVD_REQUIRE=gpu: a missing GPU fails), then the GPU benchmark. GPU time is scarce:
# the whole script keeps to DEADLINE seconds (default 420) — each step gets what is left, the
# most wanted first, and a step that no longer fits is skipped and says so. Everything it
# prints also lands under $OUT (default /tmp/gpu_check): nvidia-smi.txt, build.log, tests*.log,
# bench_gpu*.md/.json.
#
#   bash benchmarks/gpu_check.sh                   # on the GPU machine, in the checkout
#   OUT=$OUT bash benchmarks/gpu_check.sh           # under the device tool: files come back
#   TESTS=tests/gpu/test_ipc_gpu.py TEST_K="not np4" CASES=ipc,ipc_latency bash benchmarks/gpu_check.sh
#
# NCCL with two ranks on the one GPU needs NCCL 2.30+ (issue #39 item 1). When the image's is
# older and NCCL_PARTS names a folder of parts (part0, part1, ... of an xz-compressed
# libnccl.so.2 that benchmarks/nccl_parts.sh makes, carried over consecutive calls: the
# library is 344 MB, a call carries 64 MiB),
# the parts are joined, checked against NCCL_SHA256, and that library serves the NCCL steps:
# HVD_NCCL_LIBRARY for ours, LD_PRELOAD for torch, so both run on the same library.
#
# RUN_TESTS=0 skips the test steps (a rerun for figures only); TESTS: pytest's arguments
# (default tests/gpu), TEST_K its -k expression; CASES: bench_gpu.py's
# --cases for the image's NCCL (default latency,ipc_mps,p2p,pipeline,profile,cpu_latency);
# TEST_WORKERS: pytest-xdist workers for tests/gpu (default 4; the GPU has room for them).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
START=$(date +%s)
DEADLINE=${DEADLINE:-420}
rc=0
step() { printf '\n=== %s (%s, %ss in) ===\n' "$1" "$(date +%T)" "$(( $(date +%s) - START ))"; }
# left WANTED: seconds this step may take — WANTED, or what is left before the deadline.
left() {
    local remaining=$(( DEADLINE - ($(date +%s) - START) ))
    [ "$remaining" -lt "$1" ] && echo "$remaining" || echo "$1"
}
# fits NEED: whether at least NEED seconds are left; says so when not.
fits() {
    local remaining=$(( DEADLINE - ($(date +%s) - START) ))
    [ "$remaining" -ge "$1" ] && return 0
    echo "SKIPPED: ${remaining}s left, the step needs ${1}s"
    return 1
}

step "machine"
nvidia-smi 2>&1 | tee "$OUT/nvidia-smi.txt" | head -20
nvidia-smi -q 2>/dev/null | grep -iE "compute mode|mig mode" -A1 | head -6
command -v nvidia-cuda-mps-control >/dev/null && echo "MPS control present (not started)"
"$PYTHON" -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"
"$PYTHON" -m pip show nvidia-nccl-cu13 nvidia-nccl-cu12 2>/dev/null | grep -E "^(Name|Version)"

step "build"
if ! timeout "$(left 240)" "$PYTHON" setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
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
for module in ml_dtypes pytest_timeout xdist; do
    "$PYTHON" -c "import $module" 2>/dev/null && { echo "$module: present"; continue; }
    wheel=$(ls "$WHEELS"/"${module}"-*.whl 2>/dev/null | head -1)
    if [ -z "$wheel" ]; then echo "$module: missing and no wheel in $WHEELS"; continue; fi
    mkdir -p /tmp/gpu_check_site && "$PYTHON" -m zipfile -e "$wheel" /tmp/gpu_check_site
    export PYTHONPATH="/tmp/gpu_check_site:$PYTHONPATH"
    echo "$module: from $(basename "$wheel")"
done
workers=()
"$PYTHON" -c "import xdist" 2>/dev/null && workers=(-n "${TEST_WORKERS:-4}")

step "NCCL 2.30+ for two ranks on one GPU"
image_nccl=$("$PYTHON" -c "from engine_native import gpu; print(gpu.nccl_info()['version'])" 2>/dev/null)
[[ "$image_nccl" =~ ^[0-9]+$ ]] || image_nccl=0  # no NCCL loads: 0
NEW_NCCL=""
if [ "$image_nccl" -ge 23000 ]; then
    echo "the image's NCCL ($image_nccl) takes two ranks per GPU"
    NEW_NCCL=$("$PYTHON" -c "from engine_native import gpu; print(gpu.nccl_info()['path'])")
elif [ -n "${NCCL_PARTS:-}" ] && ls "$NCCL_PARTS"/part* > /dev/null 2>&1; then
    mkdir -p /tmp/nccl_new
    if command -v xz > /dev/null; then
        cat "$NCCL_PARTS"/part* | timeout "$(left 60)" xz -d -T0 > /tmp/nccl_new/libnccl.so.2
    else
        cat "$NCCL_PARTS"/part* | timeout "$(left 60)" "$PYTHON" -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer, 1 << 20)" > /tmp/nccl_new/libnccl.so.2
    fi
    got=$(sha256sum /tmp/nccl_new/libnccl.so.2 | cut -d' ' -f1)
    if [ "$got" = "${NCCL_SHA256:-}" ]; then
        NEW_NCCL=/tmp/nccl_new/libnccl.so.2
        HVD_NCCL_LIBRARY=$NEW_NCCL "$PYTHON" -c "from engine_native import gpu; i = gpu.nccl_info(); print('joined:', i['version_text'], i['path'], i['error'] or '')"
        LD_PRELOAD=$NEW_NCCL "$PYTHON" -c "import torch, torch.distributed; print('torch imports with it preloaded')" \
            || { echo "torch does not import with it preloaded"; NEW_NCCL=""; }
    else
        echo "the joined library's sha256 is $got, not ${NCCL_SHA256:-(NCCL_SHA256 unset)}"; rc=1
    fi
else
    echo "the image's NCCL is $image_nccl and no parts of a newer one came (NCCL_PARTS):"
    echo "NOT RUN: tests/gpu/test_nccl_shared_gpu.py and the nccl2 benchmark (NCCL 2.30+)"
fi

if [ -n "$NEW_NCCL" ]; then
    step "tests/gpu/test_nccl_shared_gpu.py (NCCL $NEW_NCCL)"
    if [ "${RUN_TESTS:-1}" = 0 ]; then
        echo "SKIPPED: RUN_TESTS=0"
    elif fits 60; then
        HVD_NCCL_LIBRARY=$NEW_NCCL LD_PRELOAD=$NEW_NCCL HVD_REQUIRE=gpu timeout "$(left 150)" \
            "$PYTHON" -m pytest tests/gpu/test_nccl_shared_gpu.py -q -rA -p no:cacheprovider \
            --timeout 140 --durations=5 > "$OUT/tests_nccl2.log" 2>&1 || rc=1
        grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|Error" "$OUT/tests_nccl2.log" | tail -20
    fi
    step "benchmarks/bench_gpu.py --cases nccl2"
    if fits 45; then
        HVD_NCCL_LIBRARY=$NEW_NCCL LD_PRELOAD=$NEW_NCCL timeout "$(left 90)" "$PYTHON" \
            benchmarks/bench_gpu.py --cases nccl2 --iters 1000 --out "$OUT/bench_gpu_nccl2.md" || rc=1
    fi
fi

step "tests/gpu"
if [ "${RUN_TESTS:-1}" = 0 ]; then
    echo "SKIPPED: RUN_TESTS=0"
elif fits 60; then
    # shellcheck disable=SC2086 # TESTS is a list of pytest arguments
    # In parallel, but not the files that start an MPS daemon: a daemon serves the whole GPU.
    HVD_REQUIRE=gpu timeout "$(left "${TEST_TIMEOUT:-200}")" "$PYTHON" -m pytest ${TESTS:-tests/gpu} \
        ${TEST_K:+-k "$TEST_K"} --deselect tests/gpu/test_nccl_shared_gpu.py \
        --deselect tests/gpu/test_mps_gpu.py "${workers[@]}" -q -rA \
        -p no:cacheprovider --timeout 150 --durations=15 > "$OUT/tests.log" 2>&1 || rc=1
    grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -60
fi
if [ -z "${TESTS:-}" ] && [ "${RUN_TESTS:-1}" != 0 ]; then
    step "tests/gpu/test_mps_gpu.py"
    if fits 40; then
        HVD_REQUIRE=gpu timeout "$(left 100)" "$PYTHON" -m pytest tests/gpu/test_mps_gpu.py -q -rA \
            -p no:cacheprovider --timeout 90 > "$OUT/tests_mps.log" 2>&1 || rc=1
        grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/tests_mps.log" | tail -10
    fi
fi

step "benchmarks/bench_gpu.py"
if fits 40; then
    timeout "$(left "${BENCH_TIMEOUT:-220}")" "$PYTHON" benchmarks/bench_gpu.py --out "$OUT/bench_gpu.md" \
        --cases "${CASES:-latency,ipc_mps,p2p,pipeline,profile,cpu_latency}" --iters 1000 --steps 30 \
        ${BENCH_ARGS:-} || rc=1
fi

step "done (exit $rc)"
exit "$rc"
