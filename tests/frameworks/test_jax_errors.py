"""Bad input to engine_native.jax: a clear error on every rank, and the next op still works.

One launch of 2 ranks runs every case; each case records (exception type, message) and
whether a collective right after it returned the right value, eagerly and inside jit.
"""
import pytest

from .jax_ranks import run_jax_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.jax]


def _deleted(jnp):
    y = jnp.ones(4, jnp.float32)
    y.delete()
    return y


def _cases(hvd, jax, jnp, optax, me):
    """name -> a call that must raise."""
    x = jnp.ones(4, jnp.float32)
    shape = jax.ShapeDtypeStruct((4,), jnp.float32)
    ragged = jnp.ones((me + 1, 2), jnp.float32)
    mismatched = {"w": jnp.ones((2, 3) if me == 0 else (3, 2), jnp.float32)}
    tx = hvd.DistributedGradientTransformation(optax.sgd(0.1))
    return {
        "non_array": lambda: hvd.allreduce([1.0, 2.0]),
        "non_array_grouped": lambda: hvd.grouped_allreduce([x, "grad"]),
        # a second dtype in a group is checked too (Note [Group checks]), before any naming
        "unsupported_dtype_grouped": lambda: hvd.grouped_allreduce(
            [x, x, jnp.ones(4, jnp.uint32)]),
        "deleted_grouped": lambda: hvd.grouped_allreduce([x, _deleted(jnp)]),
        "unsupported_dtype": lambda: hvd.allreduce(jnp.ones(4, jnp.uint32)),
        "unsupported_dtype_jit": lambda: jax.jit(hvd.allreduce)(jnp.ones(4, jnp.uint32)),
        "dtype_mismatch": lambda: hvd.allreduce(
            jnp.ones(4, jnp.float32 if me == 0 else jnp.int32), name="m.dtype"),
        "dtype_mismatch_jit": lambda: jax.jit(hvd.allreduce)(
            jnp.ones(4, jnp.float32 if me == 0 else jnp.int32)).block_until_ready(),
        "shape_mismatch_optax_jit": lambda: jax.block_until_ready(
            jax.jit(tx.update)(mismatched, tx.init(mismatched), mismatched)),
        "pure_callback": lambda: jax.pure_callback(lambda a: hvd.allreduce(a), shape, x),
        "pure_callback_jit": lambda: jax.jit(lambda v: jax.pure_callback(
            lambda a: hvd.allreduce(a), shape, v))(x).block_until_ready(),
        "vmap": lambda: jax.vmap(hvd.allreduce)(jnp.ones((2, 4))),
        "grad": lambda: jax.grad(lambda v: hvd.allreduce(v).sum())(x),
        "async_in_jit": lambda: jax.jit(hvd.allreduce_async)(x),
        "ragged_allgather_jit": lambda: jax.jit(hvd.allgather)(ragged).block_until_ready(),
        "alltoall_splits_jit": lambda: jax.jit(lambda v: hvd.alltoall(v, splits=[1, 1]))(
            jnp.ones(2)),
        "grouped_allgather_not_a_list": lambda: hvd.grouped_allgather(x),
        "grouped_allgather_async_in_jit": lambda: jax.jit(
            lambda v: hvd.grouped_allgather_async([v]))(x),
        "ragged_grouped_allgather_jit": lambda: jax.jit(lambda v, w: hvd.grouped_allgather(
            [v, w]))(x[:2], ragged).block_until_ready(),
        "passes_zero": lambda: hvd.DistributedGradientTransformation(
            optax.sgd(0.1), backward_passes_per_step=0),
        "passes_not_int": lambda: hvd.DistributedGradientTransformation(
            optax.sgd(0.1), backward_passes_per_step=2.5),
        "compression_not_a_compressor": lambda: hvd.average_gradients(compression="fp16"),
    }


def rank_bad_inputs():
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import engine_native.jax as hvd

    hvd.init()
    n, me = hvd.size(), hvd.rank()
    jitted_sum = jax.jit(lambda v: hvd.allreduce(v, op=hvd.Sum))
    outcome = {}
    for case, call in _cases(hvd, jax, jnp, optax, me).items():
        try:
            call()
            outcome[case] = None
        except Exception as exc:  # noqa: BLE001 -- the test checks type and message
            outcome[case] = (type(exc).__name__, str(exc))
        value = jnp.full(3, me + 1, jnp.int32)
        after = (hvd.allreduce(value, op=hvd.Sum), jitted_sum(value))
        outcome[case + ".next"] = all(np.array_equal(a, np.full(3, n * (n + 1) // 2))
                                      for a in after)
    hvd.shutdown()
    return outcome


# case -> (exception type, words the message must hold)
EXPECTED = {
    "non_array": ("TypeError", ["allreduce", "jax.Array", "list"]),
    "non_array_grouped": ("TypeError", ["grouped_allreduce", "jax.Array", "str"]),
    "unsupported_dtype": ("TypeError", ["unsupported dtype uint32"]),
    "unsupported_dtype_jit": ("TypeError", ["unsupported dtype uint32"]),
    "unsupported_dtype_grouped": ("TypeError", ["grouped_allreduce('unnamed')",
                                                "unsupported dtype uint32"]),
    "deleted_grouped": ("RuntimeError", ["deleted"]),
    "dtype_mismatch": ("HorovodInternalError", ["float32", "int32", "rank"]),
    "dtype_mismatch_jit": ("JaxRuntimeError", ["float32", "int32", "rank"]),
    "shape_mismatch_optax_jit": ("JaxRuntimeError", ["shape", "rank"]),
    "pure_callback": ("JaxRuntimeError", ["inside jax.pure_callback"]),
    "pure_callback_jit": ("JaxRuntimeError", ["inside jax.pure_callback"]),
    "vmap": ("ValueError", ["jax.vmap"]),
    "grad": ("ValueError", ["cannot be differentiated", "compute the gradients first"]),
    "async_in_jit": ("ValueError", ["handles exist only eagerly"]),
    "ragged_allgather_jit": ("JaxRuntimeError", ["first dimensions differ"]),
    "alltoall_splits_jit": ("ValueError", ["splits=None"]),
    "grouped_allgather_not_a_list": ("TypeError", ["grouped_allgather", "list", "ArrayImpl"]),
    "grouped_allgather_async_in_jit": ("ValueError", ["grouped_allgather_async",
                                                       "handles exist only eagerly"]),
    "ragged_grouped_allgather_jit": ("JaxRuntimeError", ["grouped_allgather.jit.",
                                                         "_1of2", "first dimensions differ"]),
    "passes_zero": ("ValueError", ["backward_passes_per_step must be an integer >= 1", "0"]),
    "passes_not_int": ("ValueError", ["backward_passes_per_step", "2.5"]),
    "compression_not_a_compressor": ("TypeError", ["average_gradients", "Compression.fp16",
                                                   "'fp16'"]),
}


def test_bad_input_fails_on_every_rank_and_the_next_op_works():
    results = run_jax_ranks(rank_bad_inputs, 2)
    for r in results:
        for case, (kind, words) in EXPECTED.items():
            got = r.value[case]
            assert got is not None, f"rank {r.rank}: {case} raised nothing"
            assert got[0] == kind, f"rank {r.rank}: {case}: {got}"
            for word in words:
                assert word in got[1], f"rank {r.rank}: {case}: {word!r} not in {got[1]!r}"
            assert r.value[case + ".next"], f"rank {r.rank}: the op after {case} failed"
