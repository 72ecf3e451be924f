#!/usr/bin/env bash
# Build Horovod 0.28.1 in its own venv (benchmarks/.venv-horovod, git-ignored) for the
# Horovod peer figures. Takes ~4 min on 2 idle cores (25 min when they are busy).
# Usage: bash benchmarks/horovod_venv.sh      (does nothing when the venv already works)
#
# Horovod's CMake forces -std=c++14 but torch 2.13's headers need C++17, so CXX points at a
# tiny wrapper that rewrites the flag. Its bundled gloo asks for a CMake minimum that CMake 4
# rejects, hence "cmake<4" and CMAKE_POLICY_VERSION_MINIMUM. The venv is not
# --system-site-packages, so Horovod's build sees only this venv's torch, mpi4py and mpich.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${HOROVOD_VENV:-$here/.venv-horovod}"
python="${PYTHON:-python3}"

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import horovod.torch" 2>/dev/null; then
    echo "horovod venv already built at $venv"; exit 0
fi
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip setuptools wheel
"$venv/bin/pip" install -q "torch==2.13.0" numpy mpi4py mpich "cmake<4" packaging psutil \
    pyyaml cloudpickle

wrap="$venv/bin/cxx17"
cat > "$wrap" <<'WRAP'
#!/usr/bin/env bash
args=()
for a in "$@"; do
    if [ "$a" = "-std=c++14" ]; then args+=("-std=c++17"); else args+=("$a"); fi
done
exec "${REAL_CXX:-g++}" "${args[@]}"
WRAP
chmod +x "$wrap"

export PATH="$venv/bin:$PATH"
CXX="$wrap" MAKEFLAGS="-j2" CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
    "$venv/bin/pip" install --no-build-isolation --no-cache-dir "horovod==0.28.1"
"$venv/bin/python" -c "import horovod, horovod.torch as hvd; print('horovod', horovod.__version__, \
'mpi', hvd.mpi_built(), 'gloo', hvd.gloo_built())"
