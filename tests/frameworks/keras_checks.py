"""Rank-side checks of engine_native.keras that every Keras backend runs (test_keras_torch,
test_keras_jax, test_keras_tensorflow), each appending what failed to ``fails``: the value
collectives by value; the callbacks by value; load_model; bad input (a non-array argument, a
dtype that differs across ranks, a second DistributedOptimizer, bad groups: an error on every
rank, and the next op works); DistributedOptimizer(compression=fp16) in fit; KerasState and
the elastic callbacks, and hvd.elastic.run recovering from a real failure of a collective
inside model.fit's (compiled) train step.

Imported in the ranks only (keras is imported after KERAS_BACKEND is set). :func:`elastic`
re-initializes the core: run it last (process sets are gone afterwards).
"""
import contextlib
import sys

import numpy as np

from frameworks import keras_training as kt


def collectives(fails, hvd, keras):
    """allreduce (Average, Sum with a prescale, fp16 compression), allgather with differing
    first dimensions, a broadcast of a scalar, reducescatter of uneven rows: by value."""
    n, r = hvd.size(), hvd.rank()
    x = np.arange(6, dtype=np.float32) + r
    got = hvd.allreduce(x, name="avg")
    fails.expect("allreduce returns a backend tensor", keras.ops.is_tensor(got), type(got))
    fails.expect("allreduce average", np.allclose(keras.ops.convert_to_numpy(got),
                                                  np.arange(6) + (n - 1) / 2))
    got = keras.ops.convert_to_numpy(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0))
    fails.expect("allreduce sum, prescaled", np.allclose(got, 2 * (np.arange(6) * n
                                                                     + n * (n - 1) / 2)))
    before = kt.allreduce_bytes()
    got = hvd.allreduce(x, compression=hvd.Compression.fp16)
    fails.expect("fp16 compression keeps the dtype",
                 keras.backend.standardize_dtype(got.dtype) == "float32", got.dtype)
    fails.expect("fp16 compression values", np.allclose(keras.ops.convert_to_numpy(got),
                                                        np.arange(6) + (n - 1) / 2))
    sent = kt.allreduce_bytes() - before
    fails.expect("fp16 compression: float16 crossed the core", sent == 6 * 2,
                 f"{sent} bytes for 6 elements")
    got = keras.ops.convert_to_numpy(hvd.allgather(np.full((r + 1, 2), r, np.int32)))
    want = np.concatenate([np.full((q + 1, 2), q, np.int32) for q in range(n)])
    fails.expect("allgather, first dimensions differ", np.array_equal(got, want), got)
    got = keras.ops.convert_to_numpy(hvd.broadcast(np.float64(r + 5), root_rank=n - 1))
    fails.expect("broadcast of a scalar", got.shape == () and got == n + 4, got)
    rows = np.arange(2 * n + 1, dtype=np.float32)[:, None] * (r + 1)  # uneven: rank 0 has 3
    got = keras.ops.convert_to_numpy(hvd.reducescatter(rows, op=hvd.Sum))
    first = 0 if r == 0 else 1 + 2 * r
    want = np.arange(first, first + (3 if r == 0 else 2), dtype=np.float32)[:, None]
    fails.expect("reducescatter, uneven rows", np.allclose(got, want * n * (n + 1) / 2),
                 str(got))


def callbacks(fails, hvd, keras):
    """MetricAverageCallback averages logs; the warmup's and then the schedule's learning
    rate per batch (read by a callback after them, as the next step gets it) and in the
    logs. One model and optimizer for both fits (one compile of the train step)."""
    n, r = hvd.size(), hvd.rank()
    logs = {"loss": float(r), "acc": 2.0 * r}
    hvd.callbacks.MetricAverageCallback().on_epoch_end(0, logs)
    fails.expect("MetricAverageCallback averages logs",
                 logs == {"loss": (n - 1) / 2, "acc": float(n - 1)}, logs)

    seen = []

    class RecordLR(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            hvd.callbacks.sync_backend_state(self.model)  # jax: the variables are current
            seen.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    steps = 4
    x, y = kt.global_data(1, steps=steps)
    m = kt.model(keras, seed=1)
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.3)), loss="mse")
    history = m.fit(x, y, batch_size=kt.BATCH, epochs=2, verbose=0, shuffle=False, callbacks=[
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.3, warmup_epochs=2), RecordLR()])
    warmup = [0.3 / n * ((e + b / steps + 1 / steps) * (n - 1) / 2 + 1)
              for e in range(2) for b in range(steps)]
    fails.expect("LearningRateWarmupCallback: lr per batch", np.allclose(seen, warmup), seen)
    fails.expect("LearningRateWarmupCallback: logs lr", np.allclose(
        history.history["lr"], [warmup[steps - 1], warmup[-1]]), history.history["lr"])

    seen.clear()  # the warmup ends at initial_lr, 0.3, which epoch 0 keeps
    m.fit(x, y, batch_size=kt.BATCH, epochs=4, verbose=0, shuffle=False, callbacks=[
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.4, multiplier=0.5,
                                                   start_epoch=1, end_epoch=3), RecordLR()])
    want = [0.3] * steps + [0.4] * steps + [0.2] * 2 * steps  # 1: 0.4*0.5^0, 2: 0.4*0.5^1
    fails.expect("LearningRateScheduleCallback: staircase", np.allclose(seen, want), seen)


def load_model(fails, hvd, keras, path):
    """Rank 0 saves a trained model to ``path`` (a directory every rank can read); every rank
    loads it with hvd.load_model: the optimizer wrapped, its state kept, training in step."""
    n, r = hvd.size(), hvd.rank()
    x, y = kt.global_data(n, steps=2)
    if r == 0:
        m = kt.model(keras, seed=3)
        m.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
        m.fit(x, y, batch_size=kt.BATCH, verbose=0)
        with _without_importing_tensorflow():
            m.save(path)
    hvd.allreduce(np.zeros(1), name="saved")  # the file exists before anybody loads it
    loaded = hvd.load_model(path)
    opt = loaded.optimizer
    fails.expect("load_model wraps the optimizer",
                 isinstance(opt, hvd.optimizer._DistributedOptimizerMixin)
                 and type(opt).__name__ == "SGD", type(opt).__mro__)
    fails.expect("load_model keeps the optimizer's state", int(opt.iterations) == 2 * n,
                 int(opt.iterations))
    loaded.fit(kt.rank_shard(x, n, r) * (r + 1), kt.rank_shard(y, n, r), batch_size=kt.BATCH,
               verbose=0, shuffle=False)  # rank-dependent data: only the allreduce agrees
    mine = np.concatenate([w.ravel() for w in loaded.get_weights()])
    everyone = keras.ops.convert_to_numpy(hvd.allgather(mine[None]))
    fails.expect("the loaded model trains in step on every rank",
                 np.allclose(everyone, everyone[0]), np.abs(everyone - everyone[0]).max())
    # a mixed-precision model's optimizer: a LossScaleOptimizer, which hands its gradients to
    # the inner one; that one must be wrapped, or no rank's gradients are averaged
    lso_path = path.replace(".keras", "-lso.keras")
    if r == 0:
        m = kt.model(keras, seed=3)
        m.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
                  loss="mse")
        m.fit(x, y, batch_size=kt.BATCH, verbose=0)
        with _without_importing_tensorflow():
            m.save(lso_path)
    hvd.allreduce(np.zeros(1), name="saved.lso")
    opt = hvd.load_model(lso_path).optimizer
    fails.expect("load_model wraps a LossScaleOptimizer's inner optimizer",
                 isinstance(opt.inner_optimizer, hvd.optimizer._DistributedOptimizerMixin)
                 and not isinstance(opt, hvd.optimizer._DistributedOptimizerMixin),
                 type(opt).__mro__)


@contextlib.contextmanager
def _without_importing_tensorflow():
    """Keras's save imports tensorflow, when installed, to test whether objects are its
    TensorShape, DType or TypeSpec (seconds on rank 0 while the others wait, on the torch and
    jax backends); nothing can be one while tensorflow is not imported, so Keras's lazy
    module is told it is unavailable for the save. Without that attribute (another keras)
    the save imports it."""
    from keras.src.utils import module_utils
    lazy = getattr(module_utils, "tensorflow", None)
    if "tensorflow" in sys.modules or getattr(lazy, "_available", True) is not None:
        yield
        return
    lazy._available = False
    try:
        yield
    finally:
        lazy._available = None


def _next_op_works(fails, hvd, keras, label):
    got = keras.ops.convert_to_numpy(hvd.allreduce(np.ones(2), op=hvd.Sum, name="after"))
    fails.expect(f"{label}: the next op works", np.allclose(got, hvd.size()), got)


def errors(fails, hvd, keras):
    """Bad input on every rank: a clear error on each, and the next collective works."""
    _optimizer_errors(fails, hvd, keras)
    _next_op_works(fails, hvd, keras, "after the optimizer's errors")
    _not_an_array(fails, hvd, keras)
    _next_op_works(fails, hvd, keras, "after a non-array argument")
    _mismatched_dtypes(fails, hvd, keras)
    _next_op_works(fails, hvd, keras, "after mismatched dtypes")


def _optimizer_errors(fails, hvd, keras):
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam())
    fails.expect_raises("wrapped twice", ValueError, lambda: hvd.DistributedOptimizer(opt),
                        "already a DistributedOptimizer")
    fails.expect_raises("op=Max", ValueError,
                        lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Max),
                        "Average")
    variables = kt.model(keras, seed=5).trainable_variables
    for bad, words in ((0, "positive int"), (-2, "positive int"), (2.5, "got float 2.5"),
                       ("2", "got str"), ([variables[0]], "not a list"),
                       ([[variables[0], "bias"]], "holds str"),
                       ([[variables[0]], [variables[0]]], "in more than one group")):
        fails.expect_raises(f"groups={bad!r}", ValueError, lambda bad=bad: (
            hvd.DistributedOptimizer(keras.optimizers.SGD(), groups=bad)), words)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(), groups=[[variables[0]]])
    trained = kt.model(keras, seed=6).trainable_variables  # not the listed variable's model
    fails.expect_raises("groups of another model's variables", ValueError, lambda: opt.apply(
        [keras.ops.zeros(v.shape) for v in trained], trained), "does not train")


def _not_an_array(fails, hvd, keras):
    """A dict or an arbitrary object to each collective: a TypeError naming the call and what
    it got, before anything is submitted."""
    class Opaque:
        def __repr__(self):
            return "Opaque()"

    for value, shown in (({"w": np.ones(2)}, "got dict"), (Opaque(), "got Opaque Opaque()")):
        for op, call in (("allreduce", lambda v: hvd.allreduce(v, name="bad")),
                         ("allgather", lambda v: hvd.allgather(v, name="bad")),
                         ("broadcast", lambda v: hvd.broadcast(v, 0, name="bad")),
                         ("reducescatter", lambda v: hvd.reducescatter(v, name="bad"))):
            fails.expect_raises(f"{op} of {type(value).__name__}", TypeError,
                                lambda call=call, value=value: call(value),
                                f"{op}(): expected a tensor, a NumPy array or a number, {shown}")


def _mismatched_dtypes(fails, hvd, keras):
    """Rank 0 float32, the others a wider float (float64; jax without x64 makes it float32,
    so int32 there) under one name: the core's error on every rank, naming both."""
    wide = np.float64
    if keras.backend.standardize_dtype(keras.ops.convert_to_tensor(np.zeros(1, wide)).dtype) \
            != "float64":
        wide = np.int32
    x = np.ones(3, np.float32 if hvd.rank() == 0 else wide)
    fails.expect_raises(f"float32 on rank 0, {np.dtype(wide).name} on rank 1",
                        hvd.HorovodInternalError, lambda: hvd.allreduce(x, name="mixed"),
                        f"Mismatched data types: rank 0 had type float32, rank 1 had type "
                        f"{np.dtype(wide).name}")


def fp16_fit(fails, hvd, keras, label):
    """DistributedOptimizer(compression=fp16) in fit: the gradients cross the core as
    float16, and training stays within float16's precision of single-process training (its
    unit roundoff is 4.9e-4; measured 0.7-1.3e-3 after the 20 steps, on every backend)."""
    kt.fit_matches_single_process(fails, hvd, keras, f"{label}, compression=fp16",
                                  compression=hvd.Compression.fp16, wire_dtype="float16",
                                  tol=3e-3)


def elastic(fails, hvd, keras):
    """KerasState and the elastic callbacks on one model (one compile of the train step):
    hvd.elastic.run's first sync, its retry after a real failure of a collective in fit,
    restore by value, and a commit every 2 batches. Run last: the retry re-initializes the
    core.

    Three epochs of fit in hvd.elastic.run, committed at each epoch's end; in the second
    epoch's second step the last rank aborts the core (basics.abort: every rank's collective
    in that step fails, inside the backend's compiled step). The retry restores the commit of
    epoch 1 and trains epochs 1-2 again: the result equals single-process training for three
    epochs, each step counted once."""
    from engine_native import basics
    n, r = hvd.size(), hvd.rank()
    x, y = kt.global_data(n, steps=3)
    xs, ys = kt.rank_shard(x, n, r), kt.rank_shard(y, n, r)
    m = kt.model(keras, seed=20 + r)  # rank-dependent: the first sync makes them rank 0's
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
              loss="mse")
    state = hvd.elastic.KerasState(m, batch=0, epoch=0)
    rank0 = kt.model(keras, seed=20).get_weights()
    attempts, synced = [], []

    class FailOnce(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if len(attempts) == 1 and state.epoch == 1 and batch == 1 and r == n - 1:
                basics.abort("a peer was lost (test)")

    @hvd.elastic.run
    def train(state):
        attempts.append((state.epoch, state.batch))
        if len(attempts) == 1:
            synced.append(kt.relative_error(m.get_weights(), rank0))
        # the updates first: the commit at an epoch's end then records the new epoch
        m.fit(xs, ys, batch_size=kt.BATCH, epochs=3 - state.epoch, verbose=0, shuffle=False,
              callbacks=[hvd.elastic.UpdateBatchStateCallback(state),
                         hvd.elastic.UpdateEpochStateCallback(state),
                         hvd.elastic.CommitStateCallback(state, batches_per_commit=100),
                         FailOnce()])
        return state.epoch

    try:
        epochs = train(state)
    except Exception as exc:  # noqa: BLE001 - any escape is the failure reported
        fails.expect("elastic.run recovers from a failed collective in fit", False,
                     f"{type(exc).__name__}: {exc}"[:800])
        return
    fails.expect("elastic.run's first sync: rank 0's weights", synced == [0], synced)
    fails.expect("elastic.run retried once, from the commit of epoch 1",
                 attempts == [(0, 0), (1, 0)] and (epochs, state.batch) == (3, 0),
                 (attempts, epochs, state.batch))
    ref = kt.model(keras, seed=20)
    ref.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    ref.fit(x, y, batch_size=n * kt.BATCH, epochs=3, verbose=0, shuffle=False)
    error = kt.relative_error(m.get_weights(), ref.get_weights())
    fails.expect(f"after the retry, fit equals single-process training (relative error "
                 f"{error:.2e})", error <= 1e-5)
    _next_op_works(fails, hvd, keras, "after the elastic reset")

    committed = m.get_weights()
    m.set_weights([w + 1 for w in committed])
    state.epoch = 7
    state.restore()
    fails.expect("KerasState.restore: the last commit", kt.relative_error(
        m.get_weights(), committed) == 0 and state.epoch == 3, state.epoch)

    commits = []  # (epoch, batch) at each commit
    save = state.save
    state.save = lambda: (commits.append((state.epoch, state.batch)), save())
    m.fit(xs, ys, batch_size=kt.BATCH, epochs=2, verbose=0, shuffle=False, callbacks=[
        hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=2)])
    # 3 batches an epoch from epoch 3: a commit after every 2nd batch and at each epoch's end
    fails.expect("CommitStateCallback(batches_per_commit=2): commits by value",
                 commits == [(3, 1), (4, 0), (4, 0), (4, 2), (5, 0)], commits)


def by_size(fails, hvd, keras, path, label):
    """What a compiled backend (jax, tensorflow) checks after its own variants: at np=2 fp16 in
    fit, the callbacks, load_model, bad input and elastic (last: it re-initializes the core);
    at np=3, lean (every train step's compile costs three ranks' CPU on two cores), the value
    collectives and bad input."""
    if hvd.size() == 2:
        fp16_fit(fails, hvd, keras, label)
        callbacks(fails, hvd, keras)
        load_model(fails, hvd, keras, path)
        errors(fails, hvd, keras)
        elastic(fails, hvd, keras)
    else:
        collectives(fails, hvd, keras)
        errors(fails, hvd, keras)
