"""Scripts and functions written for the Keras 3 and JAX bindings run unchanged through
``hvdrun`` and ``hvd_magic.run(fn)`` (issue #37 item 4), as torch ones do."""
import pytest

from hvd_magic.launch import run

from .conftest import hvdrun, script

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(240)]


@pytest.mark.jax
def test_hvdrun_runs_a_jax_script(no_leaks):
    done = hvdrun("-np", "2", "python", script("jax_train.py"), timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    for r in range(2):  # the same weights on both ranks: the averaged gradients of the whole
        assert f"rank {r} of 2: weights [1.0, -2.0, 0.5]" in done.stdout, done.stdout
