#!/usr/bin/env bash
# Install what the `browser` test tier (tests/browser) needs, for .ci/run or a developer machine:
#   - Debian's chromium (apt-get), if /usr/bin/chromium is missing;
#   - JupyterLab and Playwright's Python package from PyPI, pinned, if not importable
#     (HVD_JUPYTERLAB_VERSION / HVD_PLAYWRIGHT_VERSION override the pins).
# Pins: the versions tests/browser was verified with (Debian bookworm chromium 156, Python 3.11).
# Playwright drives the system chromium through `executable_path` (tests/browser/conftest.py),
# so its own browser download (`playwright install`) is never run: it needs a CDN beyond the
# package registries. Without this, tests marked `browser` skip with the reason, or fail under
# HVD_REQUIRE=browser (as .ci/run sets it).
set -euo pipefail
PYTHON=${PYTHON:-python3}
PLAYWRIGHT_VERSION=${HVD_PLAYWRIGHT_VERSION:-1.65.2}
JUPYTERLAB_VERSION=${HVD_JUPYTERLAB_VERSION:-4.6.6}

log() { printf '[install-browser] %s\n' "$*" >&2; }

if [ -z "${HVD_CHROMIUM:-}" ] && [ ! -x /usr/bin/chromium ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        log "no /usr/bin/chromium and no apt-get: install Chromium, then set HVD_CHROMIUM"; exit 1
    fi
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    log "installing chromium (apt-get)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        chromium fonts-dejavu-core >/dev/null
fi
CHROMIUM=${HVD_CHROMIUM:-/usr/bin/chromium}
if ! version=$("$CHROMIUM" --version 2>/dev/null); then
    log "$CHROMIUM does not run (HVD_CHROMIUM names the browser to use): the browser tier cannot run"
    exit 1
fi
log "chromium: $version"

pins=()
"$PYTHON" -c "import playwright.sync_api" >/dev/null 2>&1 ||
    pins+=("playwright==$PLAYWRIGHT_VERSION")
"$PYTHON" -c "import jupyterlab" >/dev/null 2>&1 ||
    pins+=("jupyterlab==$JUPYTERLAB_VERSION")
if [ ${#pins[@]} -gt 0 ]; then
    log "pip install ${pins[*]}"
    "$PYTHON" -m pip install -q "${pins[@]}"
fi
log "playwright: $("$PYTHON" -c 'import importlib.metadata as m; print(m.version("playwright"))')"
log "jupyterlab: $("$PYTHON" -c 'import jupyterlab; print(jupyterlab.__version__)')"
