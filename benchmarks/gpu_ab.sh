#!/usr/bin/env bash
# A before/after comparison on a lent GPU machine, in one run (machines differ from one loan to
# the next, so a change is measured against its parent on the same machine): the checkout is
# "after", an earlier tree carried with the call is "before". Both are built at once, then each
# case of bench_gpu.py runs from the before tree, then from the after tree. A case listed in
# AFTER_ONLY runs from the after tree alone. Reports land under $OUT as <case>_<side>.md.
#
#   mkdir -p .before && git archive <commit> | tar -x -C .before     # here (ignore .before)
#   CASES=p2p AFTER_ONLY=pipeline OUT=$OUT bash benchmarks/gpu_ab.sh .before   # there, carried
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BEFORE=${1:?usage: gpu_ab.sh BEFORE_TREE}
OUT=${OUT:-/tmp/gpu_ab}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)  # absolute: each case runs inside its tree
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

build() {  # build DIR SIDE
    if ! (cd "$1" && "$PYTHON" setup.py build_ext --inplace > "$OUT/build_$2.log" 2>&1); then
        echo "the $2 tree did not build:"
        tail -20 "$OUT/build_$2.log"
        return 1
    fi
}
build "$BEFORE" before & before_build=$!
build . after & after_build=$!
wait "$before_build" || exit 1
wait "$after_build" || exit 1

bench() {  # bench CASE SIDE DIR
    echo "=== $1, $2 ($(date +%T)) ==="
    (cd "$3" && PYTHONPATH="$PWD" "$PYTHON" benchmarks/bench_gpu.py --cases "$1" --iters 1000 \
        --steps 30 --out "$OUT/$1_$2.md")
}
rc=0
IFS=", " read -r -a cases <<< "${CASES:-}"
IFS=", " read -r -a after_only <<< "${AFTER_ONLY:-}"
for case in ${cases[@]+"${cases[@]}"}; do
    bench "$case" before "$BEFORE" || rc=1
    bench "$case" after . || rc=1
done
for case in ${after_only[@]+"${after_only[@]}"}; do
    bench "$case" after . || rc=1
done
exit "$rc"
