"""``%hvd_start --framework``: the binding each rank imports as ``hvd`` (hvd_magic.frameworks),
refused on the notebook's side when it cannot run, before any engine starts."""
import importlib.util
import types

import pytest
from IPython.core.error import UsageError

from hvd_magic import engine_side, frameworks, magics
from hvd_magic.launch import hvdrun


@pytest.fixture
def without(monkeypatch):
    """without(*packages): find_spec answers None for them, as if they were not installed."""
    real = importlib.util.find_spec

    def hide(*packages):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name in packages else real(name, *a))
    return hide


def test_the_default_is_torch_and_numpy_without_it(without):
    assert frameworks.check(None) == "torch"
    without("torch")
    assert frameworks.check(None) == "numpy"


def test_an_unknown_or_missing_framework_says_what_to_do(without):
    with pytest.raises(ValueError, match="unknown framework 'mxnet'; choose one of jax, keras"):
        frameworks.check("mxnet")
    without("optax")
    with pytest.raises(ValueError, match=r'--framework jax: optax is not installed '
                                         r'\(pip install "hvd-magic\[jax\]"\)'):
        frameworks.check("jax")


def test_hvd_start_refuses_a_framework_that_cannot_run_before_starting_anything(
        monkeypatch, without):
    started = []
    monkeypatch.setattr(magics, "HvdCluster", lambda *a, **k: started.append(k))
    without("tensorflow")
    stub = types.SimpleNamespace(cluster=None, hvd_start=magics.HvdMagics.hvd_start)
    with pytest.raises(UsageError, match="%hvd_start: --framework tensorflow: tensorflow is "
                                         "not installed"):
        magics.HvdMagics.hvd_start(stub, "-n 2 --framework tensorflow")
    assert started == []


def test_an_engine_gets_the_framework_s_modules_and_nothing_else(monkeypatch):
    shell = types.SimpleNamespace(user_ns={})
    monkeypatch.setattr(engine_side, "_shell", lambda: shell)
    monkeypatch.setattr(engine_side, "RANK", None)
    imported = []
    monkeypatch.setattr(engine_side, "_import",
                        lambda name: imported.append(name) or types.SimpleNamespace(name=name))
    engine_side.init_engine(0, {}, "none", 0, with_core=False, framework="jax")
    assert imported == ["jax", "jax.numpy", "optax"]  # torch is not imported for a JAX cluster
    assert {k: v.name for k, v in shell.user_ns.items()} == {
        "jax": "jax", "jnp": "jax.numpy", "optax": "optax"}


def test_check_build_lists_every_binding(without):
    without("keras")
    lines = hvdrun.check_build().splitlines()
    assert "    [X] PyTorch (engine_native.torch)" in lines
    assert "    [ ] Keras 3 (engine_native.keras)" in lines
    assert "    [X] NumPy (engine_native)" in lines
