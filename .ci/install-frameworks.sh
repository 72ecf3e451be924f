#!/usr/bin/env bash
# Install what the framework test tiers (jax, keras, tensorflow; tests/tiers.py) need, pinned,
# for .ci/run or a developer machine. Versions are the ones CI tests (HVD_*_VERSION overrides).
# torch is never touched: dev.sh installed it pinned, and none of these depends on it.
# Without this, tests marked jax/keras/tensorflow skip, or fail under HVD_REQUIRE naming them.
set -euo pipefail
PYTHON=${PYTHON:-python3}
JAX_VERSION=${HVD_JAX_VERSION:-0.10.2}
OPTAX_VERSION=${HVD_OPTAX_VERSION:-0.2.8}
KERAS_VERSION=${HVD_KERAS_VERSION:-3.15.1}
TF_VERSION=${HVD_TF_VERSION:-2.21.0}

log() { printf '[install-frameworks] %s\n' "$*" >&2; }

if ! "$PYTHON" - "$JAX_VERSION" "$OPTAX_VERSION" "$KERAS_VERSION" "$TF_VERSION" <<'PY'
import importlib.metadata as md, sys
want = dict(zip(("jax", "optax", "keras", "tensorflow-cpu"), sys.argv[1:]))
want["jaxlib"] = want["jax"]
try:
    sys.exit(0 if all(md.version(p) == v for p, v in want.items()) else 1)
except md.PackageNotFoundError:
    sys.exit(1)
PY
then
    log "pip install jax/jaxlib==$JAX_VERSION optax==$OPTAX_VERSION keras==$KERAS_VERSION tensorflow-cpu==$TF_VERSION"
    "$PYTHON" -m pip install -q "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION" \
        "optax==$OPTAX_VERSION" "keras==$KERAS_VERSION" "tensorflow-cpu==$TF_VERSION"
fi
"$PYTHON" -c 'import jax, keras, optax, tensorflow as tf; print("[install-frameworks] jax", jax.__version__, "optax", optax.__version__, "keras", keras.__version__, "tensorflow", tf.__version__)' 2>&1 | grep install-frameworks
