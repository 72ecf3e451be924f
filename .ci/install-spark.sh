#!/usr/bin/env bash
# Install what the `spark` test tier needs, for .ci/run or a developer machine:
#   - a Java runtime: Debian's default-jre-headless (OpenJDK 17 on bookworm), if no `java`;
#   - pyspark from PyPI, pinned (HVD_PYSPARK_VERSION overrides), if not importable.
# pyspark 3.5.x: the Spark LTS line (what Databricks 14.x/15.x LTS runtimes ship), supports
# Python 3.8-3.12 and Java 8/11/17; tested here with Python 3.11 and OpenJDK 17.
# Without this, tests marked `spark` skip (tests/tiers.py), or fail under HVD_REQUIRE=spark
# (as .ci/run sets it).
set -euo pipefail
PYTHON=${PYTHON:-python3}
PYSPARK_VERSION=${HVD_PYSPARK_VERSION:-3.5.6}

log() { printf '[install-spark] %s\n' "$*" >&2; }

if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        log "no java and no apt-get: install a Java 17 runtime and set JAVA_HOME"; exit 1
    fi
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    log "installing default-jre-headless (apt-get)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        default-jre-headless >/dev/null
fi
JAVA=java
[ -n "${JAVA_HOME:-}" ] && JAVA="$JAVA_HOME/bin/java"
if ! version=$("$JAVA" -version 2>&1); then
    log "$JAVA does not run: the spark tier cannot run (fix JAVA_HOME, or unset it)"
    exit 1
fi
log "java: $(head -1 <<<"$version")"

if ! "$PYTHON" -c "import pyspark" >/dev/null 2>&1; then
    log "pip install pyspark==$PYSPARK_VERSION"
    "$PYTHON" -m pip install -q "pyspark==$PYSPARK_VERSION"
fi
log "pyspark: $("$PYTHON" -c 'import pyspark; print(pyspark.__version__)')"
