#!/usr/bin/env bash
# Prepares NCCL 2.30+ for a GPU machine that has an older one and no registry (issue #39 item 1):
# downloads the nvidia-nccl-cu13 wheel, xz-compresses its libnccl.so.2 (344 MB for 2.32.3) and
# splits it into parts that fit one device call each (a call carries at most 64 MiB, the
# checkout included), into .nccl_parts/ (ignored by git), with the library's sha256.
#
#   bash benchmarks/nccl_parts.sh [VERSION]          # default 2.32.3; prints what to run
#
# Then, one call per part while the machine stays warm (it is given back after ~30 s idle):
# carry ".nccl_parts/partK" and run `mkdir -p /tmp/nccl_parts && cp .nccl_parts/part* /tmp/nccl_parts/`;
# the last call also runs `NCCL_PARTS=/tmp/nccl_parts NCCL_SHA256=<sum> bash benchmarks/gpu_check.sh`,
# which joins them, checks the sum and runs the NCCL steps on that library.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VERSION=${1:-2.32.3}
PART_MIB=${PART_MIB:-57}  # 64 MiB a call, less the checkout (~6 MB)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_27_x86_64 --platform manylinux_2_18_x86_64 \
    --platform manylinux2014_x86_64 -d "$work" "nvidia-nccl-cu13==$VERSION"
python3 -m zipfile -e "$work"/nvidia_nccl_cu13-*.whl "$work/wheel"
library="$work/wheel/nvidia/nccl/lib/libnccl.so.2"
sum=$(sha256sum "$library" | cut -d' ' -f1)
mkdir -p .nccl_parts
exclude=$(git rev-parse --git-path info/exclude)  # a worktree's .git is a file
mkdir -p "$(dirname "$exclude")"
grep -qx "/.nccl_parts/" "$exclude" 2>/dev/null || echo "/.nccl_parts/" >> "$exclude"
rm -f .nccl_parts/part* .nccl_parts/SHA256
xz -T0 -6 -c "$library" | split -b "${PART_MIB}M" -d -a 1 - .nccl_parts/part
echo "$sum" > .nccl_parts/SHA256
ls -l .nccl_parts
echo "NCCL $VERSION: $(ls .nccl_parts/part* | wc -l) parts; NCCL_SHA256=$sum"
