#!/usr/bin/env bash
# Build the Petastorm peer venv (benchmarks/.venv-petastorm, git-ignored) for bench_parquet.py.
# Usage: bash benchmarks/petastorm_venv.sh     (does nothing when the venv already works)
#
# Petastorm 0.13.1 (its last release) imports pyarrow.filesystem, which pyarrow 16 removed,
# and pyarrow 15 removed the legacy ParquetDataset arguments it passes (validate_schema); pyarrow
# < 16 is built against NumPy 1.x: so its own venv with pyarrow 14.0.2 and
# numpy 1.26 — the newest combination it runs on. torch is pinned as everywhere.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${PETASTORM_VENV:-$here/.venv-petastorm}"
python="${PYTHON:-python3}"

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import petastorm.pytorch" 2>/dev/null; then
    echo "petastorm venv already built at $venv"; exit 0
fi
"$python" -m venv "$venv"
"$venv/bin/pip" install -q "numpy==1.26.4" "pyarrow==14.0.2" "pandas==2.2.3" "pyspark==3.5.6" \
    "petastorm==0.13.1"
# A second step: torch 2.13 wants a newer setuptools than Petastorm's metadata allows (<70);
# pip warns about that conflict and Petastorm works regardless.
"$venv/bin/pip" install -q "torch==2.13.0" 2>&1 | grep -v "dependency conflicts\|setuptools<70" || true
"$venv/bin/python" -c "import petastorm.pytorch, pyarrow; print('petastorm venv ready:', pyarrow.__version__)"
