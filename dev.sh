#!/usr/bin/env bash
# hvd-magic developer entry point. Two commands:
#
#   ./dev.sh test   set up (if needed) and run every test tier with pytest (2 workers;
#                   HVD_TEST_WORKERS=1 for one)
#   ./dev.sh demo   set up (if needed) and run the quickstart notebook headless
#
# Set-up installs into the *active* Python environment (a venv, conda env or pyenv version);
# a fresh machine needs only Python >= 3.10 and a C++17 compiler:
#   1. torch: kept if importable (your CPU or GPU build stays); otherwise torch==2.13.0 is
#      installed, pinned -- pip is never allowed to resolve an unpinned torch.
#   2. pip install -e ".[test,mpi]" with a constraints file pinning torch to the installed
#      version, so nothing can replace it. This builds the C++ core (incrementally on re-runs).
#      MPI: the `mpi` extra brings MPICH's mpiexec from PyPI (the `mpich` wheel). If a system
#      mpiexec is on PATH and no mpich wheel is installed, the system MPI is used instead and the
#      wheel is not installed (HVD_MPI=wheel or HVD_MPI=system forces a choice).
#
# Extra arguments after `test` go to pytest, e.g. ./dev.sh test tests/unit -k rendezvous
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
PYTHON=${PYTHON:-python3}
# The core dev.sh builds reads the tests' HVD_TEST_* fault switches (common/test_switch.h);
# a plain `pip install .` and every wheel leave them out.
export HVD_TEST_SWITCHES=${HVD_TEST_SWITCHES:-1}
TORCH_PIN=${HVD_TORCH_VERSION:-2.13.0}
TEST_TIMEOUT=${HVD_TEST_TIMEOUT:-600}   # seconds per test (pytest-timeout), a hard upper bound

log() { printf '\033[1m[dev.sh]\033[0m %s\n' "$*" >&2; }

check_python() {
    "$PYTHON" - <<'PY' || { log "need Python >= 3.10 (PYTHON=$PYTHON)"; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 10) else 1)
PY
    if ! command -v "${CXX:-c++}" >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1; then
        log "need a C++17 compiler (g++ or clang++); e.g. apt-get install g++"
        exit 1
    fi
}

ensure_build_deps() {
    # With --no-build-isolation (below) pip does not install pyproject's build requirements:
    # the C++ core compiles against numpy's headers, so numpy must be there first.
    if ! "$PYTHON" -c "import numpy" >/dev/null 2>&1; then
        log "numpy not importable: installing it (needed to build the core)"
        "$PYTHON" -m pip install "numpy>=1.23"
    fi
}

ensure_torch() {
    if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
        return
    fi
    log "torch not importable: installing torch==$TORCH_PIN (pinned)"
    "$PYTHON" -m pip install "torch==$TORCH_PIN"
}

mpi_choice() {
    # Prints "wheel" or "system".
    case "${HVD_MPI:-}" in wheel|system) echo "$HVD_MPI"; return ;; esac
    "$PYTHON" - <<'PY'
import importlib.metadata as md, os, shutil, subprocess, sys
try:
    md.distribution("mpich")
    print("wheel")  # already installed: keep using it
    sys.exit(0)
except md.PackageNotFoundError:
    pass
exe = shutil.which("mpiexec")
real = os.path.realpath(exe) if exe else ""
# Not a system MPI: this environment's own, a pyenv shim, or another Python env's mpich wheel.
foreign = (real.startswith(os.path.realpath(sys.prefix) + os.sep) or "/shims/" in (exe or "")
           or any(os.path.exists(os.path.join(os.path.dirname(real), p))
                  for p in ("python", "python3")))
if exe and not foreign:
    try:
        ok = subprocess.run([exe, "--version"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    print("system" if ok else "wheel")
else:
    print("wheel")
PY
}

install_project() {
    local constraints extras mpi rc=0
    constraints=$(mktemp "${TMPDIR:-/tmp}/hvd-constraints.XXXXXX")
    "$PYTHON" -c "import importlib.metadata as m; print('torch==' + m.version('torch'))" \
        > "$constraints"
    mpi=$(mpi_choice)
    if [ "$mpi" = wheel ]; then extras="test,mpi"; else extras="test"; fi
    log "MPI: $mpi ($( [ "$mpi" = wheel ] && echo "PyPI mpich wheel" || command -v mpiexec ))"
    local isolation=()
    if "$PYTHON" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 71)" \
            >/dev/null 2>&1; then
        isolation=(--no-build-isolation)  # reuse the env's setuptools: faster, works offline
    fi
    log "pip install -e \".[$extras]\" (torch pinned: $(cat "$constraints")); the first build" \
        "of the C++ core takes a few minutes, later ones recompile only what changed"
    "$PYTHON" -m pip install ${isolation[@]+"${isolation[@]}"} -c "$constraints" -e ".[$extras]" \
        || rc=$?
    rm -f "$constraints"
    return "$rc"
}

setup() {
    check_python
    ensure_torch
    ensure_build_deps
    install_project
    # The mpich wheel puts mpiexec next to python; make sure the tests and demo find it.
    PATH="$("$PYTHON" -c 'import os, sys; print(os.path.dirname(sys.executable))'):$PATH"
    export PATH
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    test)
        setup
        # Most tests wait (for ranks to start, a peer's answer, a kernel) more than they
        # compute: two workers (pytest-xdist) keep both cores busy. tests/conftest.py decides
        # which tests must share a worker. HVD_TEST_WORKERS=1 runs them one at a time.
        workers=${HVD_TEST_WORKERS:-2}
        parallel=()
        [ "$workers" -gt 1 ] && parallel=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
        log "pytest (per-test timeout ${TEST_TIMEOUT}s, $workers worker(s))"
        exec "$PYTHON" -m pytest --timeout="$TEST_TIMEOUT" "${parallel[@]}" "$@"
        ;;
    demo)
        setup
        exec "$PYTHON" -m hvd_magic.demo "$@"
        ;;
    *)
        echo "usage: ./dev.sh test [pytest args...] | ./dev.sh demo" >&2
        exit 2
        ;;
esac
