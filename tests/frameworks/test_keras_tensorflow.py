"""engine_native.keras on the tensorflow backend: model.fit's tf.function train step (Keras's
default on a CPU) reduces the gradients through tf.numpy_function, and training equals
single-process training on the global batch, also with backward_passes_per_step and with
DistributedOptimizer's groups (an int, lists of variables, the deprecated num_groups; in the
tf.function step, inside the accumulation's cond, and eagerly), each group one fused
allreduce; hvd.reducescatter eagerly and in tf.function; engine_native.tensorflow's
DistributedOptimizer of a Keras optimizer is engine_native.keras's; an XLA-compiled step
(jit_compile=True) fails on every rank with the fix in the message, and the next op works; a
broadcast inside tf.function works; Compression.fp16 in fit (float16 crossing the core); and
the checks every backend runs (keras_checks: collectives, callbacks, load_model, bad input,
elastic recovery from a failed collective inside the tf.function step). At np 2 and 3."""
import os
import warnings

import numpy as np
import pytest

from frameworks import keras_checks as checks
from frameworks import keras_training as kt
from multiproc.checks import Failures
from multiproc.harness import run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.keras, pytest.mark.tensorflow]


def _reducescatter(fails, hvd, keras, tf):
    """hvd.reducescatter (Horovod's keras name): eagerly and inside tf.function, an uneven
    split; an op other than Average/Sum is a ValueError before anything is submitted."""
    n, r = hvd.size(), hvd.rank()
    x = np.arange((2 * n + 1) * 2, dtype=np.float32).reshape(-1, 2) * (r + 1)
    rows = [2 + (q < 1) for q in range(n)]
    first = sum(rows[:r])
    total = np.arange((2 * n + 1) * 2, dtype=np.float32).reshape(-1, 2) * n * (n + 1) / 2
    for label, fn in (("eager", hvd.reducescatter),
                      ("tf.function", tf.function(hvd.reducescatter, autograph=False))):
        got = fn(x)  # Average
        fails.expect(f"reducescatter {label}: a backend tensor", keras.ops.is_tensor(got))
        got = keras.ops.convert_to_numpy(got)
        fails.expect(f"reducescatter {label}: this rank's rows, averaged",
                     np.allclose(got, total[first:first + rows[r]] / n), str(got))
    got = keras.ops.convert_to_numpy(hvd.reducescatter(x, op=hvd.Sum, name="rs.sum"))
    fails.expect("reducescatter Sum", np.allclose(got, total[first:first + rows[r]]), str(got))
    fails.expect_raises("reducescatter op=Max", ValueError,
                        lambda: hvd.reducescatter(x, op=hvd.Max), "hvd.Average or hvd.Sum")


def rank_tensorflow_suite(path):
    """Both sizes: fit against single-process training, and bad input; np=2 also: the fit
    variants, XLA refused, the tf.function ops, fp16, the callbacks, load_model and elastic
    (last: it re-initializes the core); np=3 also: the value collectives."""
    hvd, keras = kt.start("tensorflow")
    fails = Failures()
    model = kt.fit_matches_single_process(fails, hvd, keras, "tf.function")
    fails.expect("fit compiled its train step without XLA",
                 not model.run_eagerly and model.jit_compile is False)
    if hvd.size() == 2:
        _variants(fails, hvd, keras)
    checks.by_size(fails, hvd, keras, path, "tf.function")
    return fails.raise_if_any()


def _variants(fails, hvd, keras):
    kt.fit_matches_single_process(fails, hvd, keras, "tf.function, backward_passes_per_step=2",
                                  bpps=2)
    kt.fit_matches_single_process(fails, hvd, keras, "tf.function, groups=2", groups=2,
                                  fused=(2, 4))
    # kernel 0, bias 1 and kernel 1 together (one fused op of 3), bias 0 alone
    kt.fit_matches_single_process(fails, hvd, keras, "tf.function, backward_passes_per_step=2, "
                                  "groups of variables", bpps=2,
                                  groups=lambda v: [[v[0], v[3], v[2]]], fused=(1, 3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kt.fit_matches_single_process(fails, hvd, keras, "eager, num_groups=3", num_groups=3,
                                      compile_kwargs={"run_eagerly": True}, fused=(1, 2))
    fails.expect("num_groups warns that it is deprecated",
                 any(issubclass(w.category, DeprecationWarning) and "num_groups" in
                     str(w.message) for w in caught), [str(w.message) for w in caught])
    try:
        kt.fit_matches_single_process(fails, hvd, keras, "xla",
                                      compile_kwargs={"jit_compile": True})
        fails.expect("jit_compile=True raises", False, "nothing raised")
    except ValueError as exc:
        fails.expect("jit_compile=True: the message names the fix",
                     "jit_compile=False" in str(exc), str(exc))
    got = keras.ops.convert_to_numpy(hvd.allreduce(np.ones(2), op=hvd.Sum, name="after"))
    fails.expect("the next op works", np.allclose(got, hvd.size()), got)
    import tensorflow as tf
    got = tf.function(lambda v: hvd.broadcast(v, root_rank=1))(tf.fill([2], float(hvd.rank())))
    fails.expect("broadcast inside tf.function (engine_native.tensorflow)",
                 np.allclose(keras.ops.convert_to_numpy(got), 1.0), got)
    _reducescatter(fails, hvd, keras, tf)
    # horovod.tensorflow's DistributedOptimizer hands a Keras optimizer to the Keras binding
    import engine_native.tensorflow as hvd_tf
    from engine_native.keras.optimizer import _DistributedOptimizerMixin
    opt = hvd_tf.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Sum,
                                      compression=hvd_tf.Compression.fp16)
    fails.expect("engine_native.tensorflow.DistributedOptimizer(a Keras optimizer) is "
                 "engine_native.keras's", isinstance(opt, _DistributedOptimizerMixin) and
                 opt._hvd_settings.op == hvd.Sum and
                 opt._hvd_settings.compression is hvd.Compression.fp16, str(type(opt)))


@pytest.mark.parametrize("np_", [2, 3])
def test_keras_tensorflow_backend(np_, tmp_path):
    results = run_ranks(rank_tensorflow_suite, np_, env={"KERAS_BACKEND": "tensorflow"},
                        args=(os.path.join(tmp_path, "model.keras"),), timeout=120)
    assert all(r.value > 20 for r in results), [r.value for r in results]
