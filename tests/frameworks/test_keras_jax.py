"""engine_native.keras on the jax backend, at np 2 and 3: model.fit's jit-compiled train step
(Keras's default on jax) reduces the gradients through engine_native.jax's call inside jit,
and training equals single-process training on the global batch; also with
backward_passes_per_step (the allreduce inside a lax.cond) and groups given as lists of
variables, and with Compression.fp16 (float16 crossing the core); an eager allreduce and
reducescatter by value and an allgather inside jax.jit (both through engine_native.jax); and
the checks every backend runs (keras_checks: collectives, callbacks, load_model, bad input,
elastic recovery from a failed collective inside the jitted step)."""
import os

import numpy as np
import pytest

from frameworks import keras_checks as checks
from frameworks import keras_training as kt
from frameworks.jax_ranks import QUICK_XLA
from multiproc.checks import Failures
from multiproc.harness import run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.keras, pytest.mark.jax]


def rank_jax_suite(path):
    """Both sizes: fit against single-process training, and bad input; np=2 also: the fit
    variants, fp16, the eager and jit ops, the callbacks, load_model and elastic (last: it
    re-initializes the core); np=3 also: the value collectives."""
    hvd, keras = kt.start("jax")
    fails = Failures()
    model = kt.fit_matches_single_process(fails, hvd, keras, "jit")
    fails.expect("fit jit-compiled its train step", model.jit_compile is True)
    if hvd.size() == 2:
        # groups as lists: kernel 0, bias 1 and kernel 1 together (one fused op of 3 a
        # step), bias 0 alone; inside jit and the lax.cond of the accumulation
        kt.fit_matches_single_process(fails, hvd, keras, "jit, backward_passes_per_step=2, "
                                      "groups", bpps=2, groups=lambda v: [[v[0], v[3], v[2]]],
                                      fused=(1, 3))
        _eager_and_jit_ops(fails, hvd, keras)
    checks.by_size(fails, hvd, keras, path, "jit")
    return fails.raise_if_any()


def _eager_and_jit_ops(fails, hvd, keras):
    n = hvd.size()
    got = keras.ops.convert_to_numpy(hvd.allreduce(np.arange(3.0) * hvd.rank(), op=hvd.Sum))
    fails.expect("eager allreduce of a jax array",
                 np.allclose(got, np.arange(3.0) * n * (n - 1) / 2), got)
    got = keras.ops.convert_to_numpy(hvd.reducescatter(np.full((n, 2), hvd.rank(), np.float32)))
    fails.expect("eager reducescatter (Average) of a jax array",
                 np.allclose(got, np.full((1, 2), (n - 1) / 2)), str(got))
    import jax
    got = jax.jit(lambda v: hvd.allgather(v))(np.full(2, hvd.rank(), np.float32))
    fails.expect("allgather inside jax.jit (engine_native.jax)",
                 np.array_equal(np.asarray(got), np.repeat(np.arange(n), 2)), got)


@pytest.mark.parametrize("np_", [2, 3])
def test_keras_jax_backend(np_, tmp_path):
    # XLA's quick compilation, as the engine_native.jax tests (jax_ranks): values are checked
    # here, not XLA's code, and each model's train step is compiled on every rank
    results = run_ranks(rank_jax_suite, np_, env={"KERAS_BACKEND": "jax", **QUICK_XLA},
                        args=(os.path.join(tmp_path, "model.keras"),), timeout=120)
    assert all(r.value > 20 for r in results), [r.value for r in results]
