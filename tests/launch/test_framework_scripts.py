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
def _data():
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 2)).astype("float32")
    # noisy: each rank's half alone has another least-squares fit than the whole
    y = x @ np.array([[2.0], [-1.0]], dtype="float32") + rng.normal(size=(32, 1)) * 0.5
    return x, y.astype("float32")


def keras_fit():
    """A notebook's function: Keras 3 on the torch backend, trained on each rank's half."""
    import os
    os.environ["KERAS_BACKEND"] = "torch"
    import keras

    import engine_native.keras as hvd
    hvd.init()
    x, y = _data()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.3)), loss="mse")
    model.fit(x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()], epochs=100,
              batch_size=16, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return keras.ops.convert_to_numpy(model.weights[0]).ravel()


@pytest.mark.keras
def test_run_fn_trains_a_keras_model(no_leaks):
    """The averaged gradients of the two halves are the whole batch's: both ranks reach the
    least-squares fit of all the data, which neither half reaches alone."""
    import numpy as np
    x, y = _data()
    whole = np.linalg.lstsq(x, y, rcond=None)[0].ravel()
    halves = [np.linalg.lstsq(x[r::2], y[r::2], rcond=None)[0].ravel() for r in range(2)]
    assert min(np.abs(h - whole).max() for h in halves) > 0.05  # the check can tell them apart
    weights = run(keras_fit, np=2)
    np.testing.assert_array_equal(weights[0], weights[1])
    np.testing.assert_allclose(weights[0], whole, atol=1e-3)
