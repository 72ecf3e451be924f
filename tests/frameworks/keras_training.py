"""Rank-side checks of engine_native.keras shared by the backend tests: training with
DistributedOptimizer equals single-process training on the global batch.

Every rank also trains the single-process reference itself (no communication) on the
concatenation of all ranks' batches, once per setting, and compares its distributed weights
with it. Imported in the ranks only (keras is imported after KERAS_BACKEND is set by the
harness's environment).
"""
import numpy as np

STEPS, BATCH, FEATURES = 20, 4, 8


def start(backend):
    import keras

    import engine_native.keras as hvd
    assert keras.backend.backend() == backend, (keras.backend.backend(), backend)
    hvd.init()
    return hvd, keras


def global_data(n, steps=STEPS, b=BATCH):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((steps * n * b, FEATURES)).astype("float32")
    y = (x[:, :3].sum(axis=1, keepdims=True) ** 2 * 0.1).astype("float32")
    return x, y


def rank_shard(array, n, r, b=BATCH):
    """This rank's rows: its b rows of every step's global batch of n*b, in step order."""
    steps = len(array) // (n * b)
    return np.concatenate([array[s * n * b + r * b: s * n * b + (r + 1) * b]
                           for s in range(steps)])


def model(keras, seed):
    """A small MLP whose initial weights depend on ``seed`` only (seeded initializers:
    keras.utils.set_random_seed would import tensorflow, seconds a rank)."""
    def init(offset):
        return keras.initializers.GlorotUniform(seed=seed * 10 + offset)
    return keras.Sequential([keras.Input((FEATURES,)),
                             keras.layers.Dense(16, activation="tanh", kernel_initializer=init(0),
                                                bias_initializer=keras.initializers.RandomNormal(
                                                    stddev=0.1, seed=seed * 10 + 1)),
                             keras.layers.Dense(1, kernel_initializer=init(2))])


def allreduce_bytes():
    """Bytes the core's allreduces were given so far on this rank (in their wire dtype)."""
    import engine_native
    return engine_native.metrics()["bytes"]["ALLREDUCE"]


def _core_counts():
    """The core's (fused batches, fused tensors, allreduce bytes submitted) so far."""
    import engine_native
    metrics = engine_native.metrics()
    return metrics["fused_batches"], metrics["fused_tensors"], allreduce_bytes()


def relative_error(a_weights, b_weights):
    return max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))
               for a, b in zip(a_weights, b_weights))


_references: dict = {}  # (n, lr, bpps, compile arguments) -> the reference's weights


def _reference(keras, n, x, y, lr, bpps, compile_kwargs):
    """The weights of single-process training on the global batch, trained once per rank run
    for each (n, lr, bpps, compile arguments): variants that train the same way (groups,
    compression) reuse it, which saves a compile of the train step (seconds on jax)."""
    key = (n, lr, bpps, repr(sorted(compile_kwargs.items())))
    if key not in _references:
        ref = model(keras, seed=100)
        ref.compile(optimizer=keras.optimizers.SGD(
            lr * bpps, momentum=0.9, gradient_accumulation_steps=bpps if bpps > 1 else None),
            loss="mse", **compile_kwargs)
        ref.fit(x, y, batch_size=n * BATCH, shuffle=False, epochs=1, verbose=0)
        _references[key] = ref.get_weights()
    return _references[key]


def fit_matches_single_process(fails, hvd, keras, label, *, bpps=1, lr=0.05,
                               compile_kwargs=None, process_set=None, fused=None,
                               groups=None, tol=1e-5, wire_dtype="float32",
                               **optimizer_kwargs):
    """Fit STEPS steps on np ranks (rank-dependent init, BroadcastGlobalVariablesCallback) and
    compare with one process on the global batch; bpps > 1 sums the micro-steps' gradients,
    which the reference gets from Keras's own accumulation (their mean) at bpps times the
    learning rate (SGD is linear in the gradient). With ``process_set`` only its members call
    this; they start from the same weights (the callback broadcasts over every rank).
    ``groups``: DistributedOptimizer's, or a function of the model's trainable variables
    returning it; ``fused``: the core's (fused batches, fused tensors) per update that it
    must give (default: one batch of every gradient); ``wire_dtype``: the dtype the gradients
    cross the core in (the allreduce bytes it counts: float16 with Compression.fp16);
    ``tol``: the relative error allowed against the reference."""
    in_set = process_set is not None
    n, r = (process_set.size(), process_set.rank()) if in_set else (hvd.size(), hvd.rank())
    x, y = global_data(n)
    compile_kwargs = compile_kwargs or {}

    dist = model(keras, seed=100 if in_set else 100 + r)
    if in_set:
        optimizer_kwargs["process_set"] = process_set
    if groups is not None:
        optimizer_kwargs["groups"] = groups(dist.trainable_variables) if callable(groups) \
            else groups
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9),
                                   backward_passes_per_step=bpps, **optimizer_kwargs)
    dist.compile(optimizer=opt, loss="mse", **compile_kwargs)
    callbacks = [] if in_set else [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    before = _core_counts()
    dist.fit(rank_shard(x, n, r), rank_shard(y, n, r), batch_size=BATCH, shuffle=False,
             epochs=1, verbose=0, callbacks=callbacks)
    batches, tensors, sent = (a - b for a, b in zip(_core_counts(), before))
    updates, variables = STEPS // bpps, len(dist.trainable_variables)
    want = updates * sum(int(np.prod(v.shape)) for v in dist.trainable_variables) \
        * np.dtype(wire_dtype).itemsize
    fails.expect(f"{label}: the gradients crossed the core as {wire_dtype}", sent == want,
                 f"{sent} allreduce bytes for {updates} updates, {want} expected")
    per_update = fused or (1, variables)
    fails.expect(f"{label}: {per_update[0]} fused allreduce(s) of {per_update[1]} gradients "
                 f"per update", (batches, tensors) == (updates * per_update[0],
                                                       updates * per_update[1]),
                 f"{batches} fused batches of {tensors} tensors for {updates} updates of "
                 f"{variables} gradients")

    error = relative_error(dist.get_weights(),
                           _reference(keras, n, x, y, lr, bpps, compile_kwargs))
    fails.expect(f"{label}: fit equals single-process training (relative error {error:.2e})",
                 error <= tol)
    moved = relative_error(dist.get_weights(), model(keras, seed=100).get_weights())
    fails.expect(f"{label}: the weights changed", moved > 1e-3, f"{moved:.2e}")
    return dist
