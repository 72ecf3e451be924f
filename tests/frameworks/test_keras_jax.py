"""engine_native.keras on the jax backend: model.fit's jit-compiled train step (Keras's default
on jax) reduces the gradients through an ordered io_callback, and training equals
single-process training on the global batch; also with backward_passes_per_step (the
allreduce inside a lax.cond) and groups given as lists of variables; an eager allreduce and
reducescatter by value and an allgather inside jax.jit (both through engine_native.jax)."""
import numpy as np
import pytest

from frameworks import keras_training as kt
from multiproc.checks import Failures
from multiproc.harness import run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.keras, pytest.mark.jax]


def rank_jax_suite():
    hvd, keras = kt.start("jax")
    fails = Failures()
    model = kt.fit_matches_single_process(fails, hvd, keras, "jit")
    fails.expect("fit jit-compiled its train step", model.jit_compile is True)
    # groups as lists: kernel 0, bias 1 and kernel 1 together (one fused op of 3 a
    # step), bias 0 alone; inside jit and the lax.cond of the accumulation
    kt.fit_matches_single_process(fails, hvd, keras, "jit, backward_passes_per_step=2, groups",
                                  bpps=2, groups=lambda v: [[v[0], v[3], v[2]]], fused=(1, 3))
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
    return fails.raise_if_any()


def test_keras_jax_backend():
    run_ranks(rank_jax_suite, 2, env={"KERAS_BACKEND": "jax"}, timeout=120)
