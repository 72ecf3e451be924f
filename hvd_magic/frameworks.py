"""Which binding a cluster's ranks import as ``hvd`` (``%hvd_start --framework``).

One table, read by the magic (checked on the notebook's side before any engine starts), by
the engines (``engine_side.init_engine`` imports the binding and fills the namespace) and by
``hvdrun --check-build``. Light on purpose: the engines import it with nothing but the
standard library; no framework is imported here.
"""
from __future__ import annotations

import dataclasses
import importlib.util


@dataclasses.dataclass(frozen=True)
class Framework:
    binding: str                 # the module a rank gets as ``hvd``
    packages: tuple[str, ...]    # what must be importable for it
    namespace: tuple[tuple[str, str], ...]  # (name in the user's namespace, module)
    extra: str                   # ``pip install "hvd-magic[<extra>]"`` brings the packages
    label: str                   # what hvdrun --check-build calls it


FRAMEWORKS = {
    "torch": Framework("engine_native.torch", ("torch",), (("torch", "torch"),), "torch",
                       "PyTorch"),
    "keras": Framework("engine_native.keras", ("keras",), (("keras", "keras"),), "keras",
                       "Keras 3"),
    "jax": Framework("engine_native.jax", ("jax", "optax"),
                     (("jax", "jax"), ("jnp", "jax.numpy"), ("optax", "optax")), "jax", "JAX"),
    "tensorflow": Framework("engine_native.tensorflow", ("tensorflow",),
                            (("tf", "tensorflow"),), "tensorflow", "TensorFlow"),
    "numpy": Framework("engine_native", ("numpy",), (), "", "NumPy"),
}


def missing(name: str) -> str | None:
    """Why framework ``name`` cannot run in this environment, or None when it can."""
    framework = FRAMEWORKS[name]
    for package in framework.packages:
        if importlib.util.find_spec(package) is None:
            fix = f'pip install "hvd-magic[{framework.extra}]"' if framework.extra else ""
            return f"{package} is not installed" + (f" ({fix})" if fix else "")
    return None


def default() -> str:
    """torch when it is installed (the product's first binding), else the NumPy API."""
    return "torch" if missing("torch") is None else "numpy"


def check(name: str | None) -> str:
    """``name`` (or the default) when it can run here; a ValueError saying what to do when
    it is unknown or not installed."""
    if name is None:
        return default()
    if name not in FRAMEWORKS:
        raise ValueError(f"unknown framework {name!r}; choose one of "
                         f"{', '.join(sorted(FRAMEWORKS))}")
    why = missing(name)
    if why:
        raise ValueError(f"--framework {name}: {why}")
    return name
