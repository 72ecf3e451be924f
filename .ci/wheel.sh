#!/usr/bin/env bash
# CI's wheel job: the wheel a user installs, tried the way a user would try it.
#
# A. Build it once: .ci/build-wheel.sh (manylinux_2_28, auditwheel-checked, no test switches).
# B. A fresh venv whose PATH has no compiler (only the venv and a few shell tools), checked.
# C. pip installs torch (pinned, never chosen by pip) and the wheel with its `demo` extra,
#    under a constraints file that pins torch: not editable, not the source tree.
# D. The doctor, then the quickstart notebook (`python -m hvd_magic.demo`), from the installed
#    package's own copy of it; B to D is timed ("fresh venv -> demo finished").
# E. A smoke tier of the tests, from a copy of tests/ outside the checkout, so only the
#    installed engine_native can be imported (its path is printed and checked).
#
#   bash .ci/wheel.sh        (.ci/run calls it after the tests; HVD_CI_WHEEL=0 skips it there)
#
# Exits non-zero on any failure. Ranks and clusters stop with the demo and the tests; .ci/run's
# trap kills any marked leftover. The scratch folder (mktemp) is removed at exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
TORCH_PIN=${HVD_TORCH_VERSION:-2.13.0}
# Quick tests that need nothing the demo extra lacks (no compiler: not tests/native's hooks):
# the doctor, the demo's kernel, dtypes, and the real core across ranks (numpy and torch).
SMOKE=(tests/unit/test_doctor.py tests/unit/test_demo.py tests/unit/test_dtypes.py
       tests/multiproc/test_allreduce.py tests/multiproc/test_numpy_api.py
       tests/multiproc/test_host_collectives.py)
SHELL_TOOLS=(sh bash env cat ls mkdir rm cp mv ln sleep kill ps uname hostname id whoami nproc
             grep sed head tail tr cut sort wc date dirname basename readlink mktemp which)

log() { printf '\033[1m[wheel]\033[0m %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

# A.
started=$SECONDS
bash .ci/build-wheel.sh
log "wheel built in $((SECONDS - started))s"
python=$(python3 -c 'import os, sys; print(os.path.realpath(sys.executable))')
tag=$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
version=$("$python" -c 'exec(open("engine_native/_version.py").read()); print(__version__)')
wheel=$ROOT/dist/hvd_magic-$version-$tag-$tag-manylinux_2_28_x86_64.whl
[ -f "$wheel" ] || fail "no $wheel"

work=$(mktemp -d "${TMPDIR:-/tmp}/hvd-wheel-ci.XXXXXX")
trap 'rm -rf -- "$work"' EXIT

# B.
timed=$SECONDS
"$python" -m venv "$work/venv"
mkdir "$work/bin"
for tool in "${SHELL_TOOLS[@]}"; do
    found=$(command -v "$tool" || true)
    if [ -n "$found" ]; then ln -s "$found" "$work/bin/$tool"; fi
done
export PATH="$work/venv/bin:$work/bin"
hash -r
for compiler in gcc g++ cc c++ clang clang++ zig x86_64-linux-gnu-gcc; do
    if command -v "$compiler" >/dev/null; then fail "$compiler is on PATH"; fi
done
log "fresh venv $work/venv; no compiler on PATH ($PATH)"

# C.
echo "torch==$TORCH_PIN" > "$work/constraints.txt"
python -m pip install -q -c "$work/constraints.txt" "torch==$TORCH_PIN"
python -m pip install -q -c "$work/constraints.txt" "$wheel[demo]"

# D.
cd "$work"
python -m hvd_magic.doctor
python -m hvd_magic.demo
log "fresh venv -> pip install -> demo finished: $((SECONDS - timed))s (target 120s)"

# E.
python -m pip install -q -c "$work/constraints.txt" pytest pytest-timeout ml_dtypes
mkdir "$work/smoke"
cp -r "$ROOT/tests" "$ROOT/pyproject.toml" "$work/smoke/"  # pyproject: pytest's settings
cd "$work/smoke"
python - <<'PY'
import sys, engine_native, hvd_magic
where = engine_native.__file__
print(f"[wheel] smoke tier imports {where}, hvd-magic {hvd_magic.__version__}", file=sys.stderr)
assert where.startswith(sys.prefix + "/"), f"{where} is not the venv's installed copy"
PY
unset HVD_REQUIRE  # the tiers .ci/run requires are not installed in this venv
python -m pytest -p no:cacheprovider -q --timeout 300 "${SMOKE[@]}"
log "all done in $((SECONDS - started))s"
