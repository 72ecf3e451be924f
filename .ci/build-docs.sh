#!/usr/bin/env bash
# Build the documentation site (docs/mkdocs.yml, pages in docs/pages/) with MkDocs in strict
# mode: a broken link, a missing page or any other warning fails the build. Installs
# mkdocs==1.6.1 with pip when it is not importable. The site goes to a fresh temporary folder.
#
#   bash .ci/build-docs.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! python3 -c "import mkdocs" >/dev/null 2>&1; then
    echo "[docs] installing mkdocs==1.6.1" >&2
    python3 -m pip install "mkdocs==1.6.1"
fi

site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
python3 -m mkdocs build --strict -f docs/mkdocs.yml -d "$site"
echo "[docs] built with mkdocs --strict" >&2
