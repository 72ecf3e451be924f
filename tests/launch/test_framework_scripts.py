"""Scripts and functions written for the Keras 3 and JAX bindings run unchanged through
``hvdrun`` and ``hvd_magic.run(fn)`` (issue #37 item 4), as torch ones do."""
import re

import pytest

from hvd_magic.launch import run

from .conftest import hvdrun, script

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(240)]


def _data():
    """The data of keras_fit and scripts/keras_train.py."""
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 2)).astype("float32")
    # noisy: each rank's half alone has another least-squares fit than the whole
    y = x @ np.array([[2.0], [-1.0]], dtype="float32") + rng.normal(size=(32, 1)) * 0.5
    return x, y.astype("float32")


def _least_squares():
    """The fit of the whole data, after checking it is not the fit of either half (so a
    rank that trained on its half alone would fail the check)."""
    import numpy as np
    x, y = _data()
    whole = np.linalg.lstsq(x, y, rcond=None)[0].ravel()
    halves = [np.linalg.lstsq(x[r::2], y[r::2], rcond=None)[0].ravel() for r in range(2)]
    assert min(np.abs(h - whole).max() for h in halves) > 0.05
    return whole


@pytest.mark.jax
def test_hvdrun_runs_a_jax_script(no_leaks):
    done = hvdrun("-np", "2", "python", script("jax_train.py"), timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    for r in range(2):  # the same weights on both ranks: the averaged gradients of the whole
        assert f"rank {r} of 2: weights [1.0, -2.0, 0.5]" in done.stdout, done.stdout


@pytest.mark.keras
@pytest.mark.jax  # KERAS_BACKEND=jax: its import costs half the torch backend's CPU time
def test_hvdrun_runs_a_keras_script(no_leaks):
    """scripts/keras_train.py as a Horovod Keras user writes it (hvd.init, DistributedOptimizer,
    BroadcastGlobalVariablesCallback, model.fit on the rank's half) runs unchanged under
    ``hvdrun -np 2``, its backend chosen the Keras way (KERAS_BACKEND; the torch backend is
    keras_fit's below). The ranks start from different random weights, which the same averaged
    gradients would keep apart: equal final weights need the broadcast, and the fit of the
    whole data needs the averaging."""
    import numpy as np
    whole = _least_squares()
    done = hvdrun("-np", "2", "python", script("keras_train.py"), timeout=180,
                  env={"KERAS_BACKEND": "jax"})
    assert done.returncode == 0, done.stdout + done.stderr

    def printed(what):
        found = [re.search(rf"rank {r} of 2: {what} \[(.*)\]", done.stdout) for r in range(2)]
        assert all(found), done.stdout
        return [[float(w) for w in m[1].split(",")] for m in found]

    start, end = printed("initial weights"), printed("weights")
    assert start[0] != start[1], done.stdout
    assert end[0] == end[1], done.stdout
    np.testing.assert_allclose(end[0], whole, atol=1e-3)


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
    whole = _least_squares()
    weights = run(keras_fit, np=2)
    np.testing.assert_array_equal(weights[0], weights[1])
    np.testing.assert_allclose(weights[0], whole, atol=1e-3)


def jax_steps():
    """A notebook's function for engine_native.jax: collectives on jax.Arrays, eagerly and
    inside jax.jit, and an optax step whose gradients are averaged across the ranks."""
    import jax
    import jax.numpy as jnp
    import optax

    import engine_native.jax as hvd
    hvd.init()
    mine = jnp.arange(3.0) + hvd.rank()
    eager = hvd.allreduce(mine, op=hvd.Sum)
    in_jit = jax.jit(lambda v: hvd.allreduce(v * v))(mine)  # averaged
    gathered = hvd.allgather(mine[None])
    params = hvd.broadcast_parameters(jnp.full(3, 10.0 * hvd.rank()), root_rank=1)
    tx = hvd.DistributedGradientTransformation(optax.sgd(0.5))

    @jax.jit
    def step(params, state):  # the gradient of 0.5 * |p - mine|^2 is p - mine
        grads = jax.grad(lambda p: 0.5 * jnp.sum((p - mine) ** 2))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    params, _ = step(params, tx.init(params))
    return (hvd.rank(), hvd.size(), mine.tolist(), eager.tolist(), in_jit.tolist(),
            gathered.tolist(), params.tolist())


@pytest.mark.jax
def test_run_fn_runs_a_jax_function(no_leaks):
    """run(fn, np=2) of a JAX function returns each rank's values, by rank: its own array,
    then the collectives' results (exact in float32). The step starts from rank 1's
    parameters (10.0 each) and moves halfway to the ranks' mean, [0.5, 1.5, 2.5]."""
    results = run(jax_steps, np=2)
    same = ([1.0, 3.0, 5.0], [0.5, 2.5, 6.5], [[0.0, 1.0, 2.0], [1.0, 2.0, 3.0]],
            [5.25, 5.75, 6.25])
    assert results == [(0, 2, [0.0, 1.0, 2.0], *same), (1, 2, [1.0, 2.0, 3.0], *same)]
