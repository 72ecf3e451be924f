"""Training with engine_native.jax equals single-process training on the global batch.

An MLP on scikit-learn's digits, 20 steps of optax SGD (momentum) and Adam, the update step
jitted with ``hvd.DistributedGradientTransformation`` (plus a few eager steps with
``hvd.average_gradients()`` chained by hand, and 20 jitted steps with
``backward_passes_per_step``, against ``optax.MultiSteps`` on the global batch, counting the
allreduces the core ran). Every rank starts from its own random
parameters, made equal by ``broadcast_parameters`` from rank 0, and also runs the reference
itself (no communication) on the concatenation of all ranks' batches.
"""
import pytest

from .jax_ranks import run_jax_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.jax]

STEPS, BATCH = 20, 8


def _mlp_params(jax, seed):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {"hidden": {"w": jax.random.normal(k1, (64, 32)) * 0.1, "b": jax.numpy.zeros(32)},
            "out": {"w": jax.random.normal(k2, (32, 10)) * 0.1, "b": jax.numpy.zeros(10)}}


def _loss(jnp, optax, params, x, y):
    h = jnp.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
    logits = h @ params["out"]["w"] + params["out"]["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _train(jax, optax, grad_fn, tx, params, batches, jit):
    """``params`` after one update per batch with ``tx``: the whole step jitted, or (jit=False)
    only the gradient, ``tx.update`` then running eagerly."""
    apply = jax.jit(optax.apply_updates)

    def step(params, state, x, y):
        updates, state = tx.update(grad_fn(params, x, y), state, params)
        return apply(params, updates), state
    step = jax.jit(step) if jit else step
    state = tx.init(params)
    for x, y in batches:
        params, state = step(params, state, x, y)
    return params


def _max_relative_error(jax, np, a, b):
    errors = jax.tree_util.tree_map(
        lambda p, q: float(np.max(np.abs(np.asarray(p) - np.asarray(q)))
                           / max(float(np.max(np.abs(np.asarray(q)))), 1e-30)), a, b)
    return max(jax.tree_util.tree_leaves(errors))


OPTIMIZERS = {"sgd": lambda optax: optax.sgd(0.3, momentum=0.9),
              "adam": lambda optax: optax.adam(0.01)}
# backward_passes_per_step per case: (k, average_aggregated_gradients). The sum (Horovod's
# default) with SGD equals optax.MultiSteps's mean at k times the learning rate (SGD with
# momentum is linear in the gradient); the mean with Adam equals MultiSteps itself.
PASSES = {"sgd": (2, False), "adam": (4, True)}


def _accumulated(jax, optax, engine_native, hvd, grad_fn, make, params, mine, everyone,
                 opt_name, me):
    """backward_passes_per_step: (this rank's parameters, allreduces the core ran, rank 0's
    reference: MultiSteps on the global batches)."""
    passes, mean = PASSES[opt_name]
    tx = hvd.DistributedGradientTransformation(make(optax), backward_passes_per_step=passes,
                                               average_aggregated_gradients=mean)
    before = engine_native.metrics()["ops"]["ALLREDUCE"]
    trained = _train(jax, optax, grad_fn, tx, params, mine, jit=True)
    jax.effects_barrier()
    ran = engine_native.metrics()["ops"]["ALLREDUCE"] - before
    reference = None
    if me == 0:
        inner = make(optax) if mean else optax.sgd(0.3 * passes, momentum=0.9)
        reference = _train(jax, optax, grad_fn, optax.MultiSteps(inner, passes).
                           gradient_transformation(), params, everyone, jit=True)
    return trained, ran, reference


def rank_training(opt_name):
    """This rank's trained parameters (jitted step, then eager averaging) and broadcast
    checks; rank 0 also returns the single-process references (the other ranks skip them:
    three ranks share two cores)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from launch import digits  # the CSV read directly: importing sklearn costs seconds a rank
    import engine_native
    import engine_native.jax as hvd

    hvd.init()
    n, me = hvd.size(), hvd.rank()
    x_all, y_all = digits.load()  # sliced in numpy: a jax slice per step compiles per shape
    x_all = x_all.astype(np.float32)
    assert STEPS * n * BATCH <= len(x_all)

    def batch(start, size):
        return jnp.asarray(x_all[start:start + size]), jnp.asarray(y_all[start:start + size])
    mine = [batch(s * n * BATCH + me * BATCH, BATCH) for s in range(STEPS)]
    everyone = [batch(s * n * BATCH, n * BATCH) for s in range(STEPS)]
    grad_fn = jax.jit(jax.grad(lambda p, x, y: _loss(jnp, optax, p, x, y)))
    make = OPTIMIZERS[opt_name]
    eager_steps = 3

    out = {}
    params = hvd.broadcast_parameters(_mlp_params(jax, seed=me), root_rank=0)
    trained = _train(jax, optax, grad_fn, hvd.DistributedGradientTransformation(make(optax)),
                     params, mine, jit=True)
    eager = _train(jax, optax, grad_fn, optax.chain(hvd.average_gradients(), optax.sgd(0.3)),
                   params, mine[:eager_steps], jit=False)
    accumulated, out["allreduces"], accumulated_reference = _accumulated(
        jax, optax, engine_native, hvd, grad_fn, make, params, mine, everyone, opt_name, me)
    out["params"] = jax.tree_util.tree_map(np.asarray, (params, trained, eager, accumulated))
    if me == 0:
        reference = (params,
                     _train(jax, optax, grad_fn, make(optax), params, everyone, jit=True),
                     _train(jax, optax, grad_fn, optax.sgd(0.3), params,
                            everyone[:eager_steps], jit=False), accumulated_reference)
        out["reference"] = jax.tree_util.tree_map(np.asarray, reference)

    # An optax state broadcast as a pytree: rank 0's Adam moments on every rank.
    tx = optax.adam(0.01)
    update = jax.jit(tx.update)
    state = update(jax.tree_util.tree_map(lambda p: p * (me + 1), params), tx.init(params),
                   params)[1]
    root_state = update(params, tx.init(params), params)[1]
    out["opt_state"] = _max_relative_error(jax, np, hvd.broadcast_parameters(state, 0),
                                           root_state)
    hvd.shutdown()
    return out


@pytest.mark.parametrize("np_, opt_name", [(2, "sgd"), (3, "adam")])
def test_training_equals_single_process_on_global_batch(np_, opt_name):
    import jax
    import numpy as np

    results = run_jax_ranks(rank_training, np_, args=(opt_name,))
    reference = results[0].value["reference"]
    init = jax.tree_util.tree_leaves(reference[0])
    for r in results:
        assert r.value["opt_state"] == 0, (r.rank, "optimizer state not broadcast")
        got = r.value["params"]
        for leaf, want in zip(jax.tree_util.tree_leaves(got[0]), init):
            assert np.array_equal(leaf, want), (r.rank, "parameters not broadcast from rank 0")
        passes = PASSES[opt_name][0]
        for case, index in (("jitted " + opt_name, 1), ("eager sgd", 2),
                            (f"{opt_name}, backward_passes_per_step={passes}", 3)):
            error = _max_relative_error(jax, np, got[index], reference[index])
            assert error <= 1e-5, (r.rank, case, error)
        leaves = len(init)  # one grouped allreduce of every leaf per k steps, none between
        assert r.value["allreduces"] == STEPS // passes * leaves, (r.rank, r.value["allreduces"])
