"""engine_native.keras on the torch backend, as a user runs it: one launch of ranks per world
size runs every check (importing keras costs seconds a rank) and reports them all.

Checks: the value collectives (reducescatter included) against NumPy; model.fit with
DistributedOptimizer equals single-process training on the global batch, with one fused
grouped allreduce per update (the core's metrics), also with backward_passes_per_step, with
groups=2 (two per update) and on a process set with gradient_predivide_factor; each callback
by value; load_model wraps the optimizer and keeps its state; wrapping twice and bad groups
fail on every rank and the next op works; KerasState commit/restore/sync, the elastic
callbacks and hvd.elastic.run's retry after a failed collective.
"""
import os

import numpy as np
import pytest

from frameworks import keras_training as kt
from multiproc.checks import Failures
from multiproc.harness import run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.keras]


def _collectives(fails, hvd, keras):
    n, r = hvd.size(), hvd.rank()
    x = np.arange(6, dtype=np.float32) + r
    got = hvd.allreduce(x, name="avg")
    fails.expect("allreduce returns a backend tensor", keras.ops.is_tensor(got), type(got))
    fails.expect("allreduce average", np.allclose(keras.ops.convert_to_numpy(got),
                                                  np.arange(6) + (n - 1) / 2))
    got = keras.ops.convert_to_numpy(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0))
    fails.expect("allreduce sum, prescaled", np.allclose(got, 2 * (np.arange(6) * n
                                                                     + n * (n - 1) / 2)))
    got = hvd.allreduce(x, compression=hvd.Compression.fp16)
    fails.expect("fp16 compression keeps the dtype",
                 keras.backend.standardize_dtype(got.dtype) == "float32", got.dtype)
    fails.expect("fp16 compression values", np.allclose(keras.ops.convert_to_numpy(got),
                                                        np.arange(6) + (n - 1) / 2))
    sent, _ = hvd.Compression.fp16.compress(keras.ops.convert_to_tensor(x))
    fails.expect("fp16 compression sends float16",
                 keras.backend.standardize_dtype(sent.dtype) == "float16", sent.dtype)
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


def _callbacks(fails, hvd, keras):
    n, r = hvd.size(), hvd.rank()
    logs = {"loss": float(r), "acc": 2.0 * r}
    hvd.callbacks.MetricAverageCallback().on_epoch_end(0, logs)
    fails.expect("MetricAverageCallback averages logs",
                 logs == {"loss": (n - 1) / 2, "acc": float(n - 1)}, logs)

    seen = []

    class RecordLR(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    x, y = kt.global_data(1, steps=8)
    m = kt.model(keras, seed=1)
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.3)), loss="mse")
    history = m.fit(x, y, batch_size=kt.BATCH, epochs=2, verbose=0, shuffle=False, callbacks=[
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.3, warmup_epochs=2), RecordLR()])
    steps = 8
    want = [0.3 / n * ((e + b / steps + 1 / steps) * (n - 1) / 2 + 1)
            for e in range(2) for b in range(steps)]
    fails.expect("LearningRateWarmupCallback: lr per batch", np.allclose(seen, want), seen)
    fails.expect("LearningRateWarmupCallback: logs lr", np.allclose(history.history["lr"],
                                                                    [want[7], want[15]]))

    seen.clear()
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.2)), loss="mse")
    m.fit(x, y, batch_size=2 * kt.BATCH, epochs=4, verbose=0, shuffle=False, callbacks=[
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.4, multiplier=0.5,
                                                   start_epoch=1, end_epoch=3), RecordLR()])
    want = [0.2] * 4 + [0.4] * 4 + [0.2] * 8  # epoch 0 untouched, 1: 0.4*0.5^0, 2-3: 0.2
    fails.expect("LearningRateScheduleCallback: staircase", np.allclose(seen, want), seen)


def _load_model(fails, hvd, keras, path):
    n, r = hvd.size(), hvd.rank()
    x, y = kt.global_data(n, steps=2)
    if r == 0:
        m = kt.model(keras, seed=3)
        m.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
        m.fit(x, y, batch_size=kt.BATCH, verbose=0)
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


def _errors(fails, hvd, keras):
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
    got = keras.ops.convert_to_numpy(hvd.allreduce(np.ones(2), op=hvd.Sum, name="after"))
    fails.expect("the next op works", np.allclose(got, hvd.size()), got)


def _elastic(fails, hvd, keras):
    n, r = hvd.size(), hvd.rank()
    m = kt.model(keras, seed=10 + r)
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
              loss="mse")
    state = hvd.elastic.KerasState(m, batch=0, epoch=0)
    state.sync()
    rank0 = kt.model(keras, seed=10).get_weights()
    fails.expect("KerasState.sync: rank 0's weights", kt.relative_error(m.get_weights(),
                                                                         rank0) == 0)
    x, y = kt.global_data(n, steps=3)
    # the updates first: the commit at an epoch's end then records the new epoch
    callbacks = [hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=2)]
    m.fit(kt.rank_shard(x, n, r), kt.rank_shard(y, n, r), batch_size=kt.BATCH, epochs=2,
          verbose=0, shuffle=False, callbacks=callbacks)
    fails.expect("epoch and batch tracked", (state.epoch, state.batch) == (2, 0),
                 (state.epoch, state.batch))
    committed = m.get_weights()
    m.set_weights([w + 1 for w in committed])
    state.epoch = 7
    state.restore()
    fails.expect("KerasState.restore: the last commit", kt.relative_error(
        m.get_weights(), committed) == 0 and state.epoch == 2)

    calls = []

    @hvd.elastic.run
    def train(state):
        calls.append(hvd.rank())
        if len(calls) == 1:
            m.set_weights([w * 0 for w in committed])  # lost by the failure
            raise hvd.HorovodInternalError("a peer was lost (test)")
        return kt.relative_error(m.get_weights(), committed)

    error = train(state)
    fails.expect("elastic.run retries after a failed collective, from the commit",
                 len(calls) == 2 and error == 0, (calls, error))
    got = keras.ops.convert_to_numpy(hvd.allreduce(np.ones(1), op=hvd.Sum, name="reset"))
    fails.expect("collectives work after the reset", got[0] == n, got)


def rank_torch_suite(path):
    """Every check; ``path``: where rank 0 saves the model for load_model, or None to skip
    saving and loading (Keras's serialization imports tensorflow when it is installed:
    seconds a rank)."""
    hvd, keras = kt.start("torch")
    fails = Failures()
    _collectives(fails, hvd, keras)
    kt.fit_matches_single_process(fails, hvd, keras, "fit")
    kt.fit_matches_single_process(fails, hvd, keras, "fit, backward_passes_per_step=2", bpps=2)
    kt.fit_matches_single_process(fails, hvd, keras, "fit, groups=2", groups=2, fused=(2, 4))
    if hvd.size() > 2:  # ranks 0 and 1 train alone; 2 stays out
        pair = hvd.add_process_set([0, 1])
        if hvd.rank() in pair.ranks:
            kt.fit_matches_single_process(fails, hvd, keras, "fit on process set [0, 1], "
                                          "gradient_predivide_factor=2", process_set=pair,
                                          gradient_predivide_factor=2.0)
        hvd.remove_process_set(pair)
    _callbacks(fails, hvd, keras)
    if path is not None:
        _load_model(fails, hvd, keras, path)
    _errors(fails, hvd, keras)
    _elastic(fails, hvd, keras)
    return fails.raise_if_any()


@pytest.mark.parametrize("np_", [2, 3])
def test_keras_torch_backend(np_, tmp_path):
    path = os.path.join(tmp_path, "model.keras") if np_ == 2 else None
    results = run_ranks(rank_torch_suite, np_, env={"KERAS_BACKEND": "torch"}, args=(path,),
                        timeout=120)
    assert all(r.value > 20 for r in results), [r.value for r in results]
