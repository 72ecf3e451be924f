"""Bad input to engine_native.jax: a clear error on every rank, and the next op still works.
A jitted collective whose peer dies, or that abort() or Ctrl-C ends: an error on every rank
within HVD_TIMEOUT, and the next op says what to do (torch's "errors, never hangs").

One launch of 2 ranks runs every bad-input case; each case records (exception type, message)
and whether a collective right after it returned the right value, eagerly and inside jit.
Another launch of 2 ranks runs the interruptions, on both jit paths, the lost rank last.
"""
import os
import signal
import threading
import time

import pytest
from multiproc import faults

from .jax_ranks import on_xla_threads, run_jax_ranks

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
        # run on XLA's threads, its failure stays in JAX's ordered-effect token, which every
        # later jitted collective took (Note [A failed collective and JAX's token])
        "dtype_mismatch_async_jit": lambda: jax.jit(lambda v: hvd.allreduce(
            on_xla_threads(jnp, v).astype(jnp.float32 if me == 0 else jnp.float16),
            name="m.async"))(jnp.ones((8, 8))).block_until_ready(),
        "adasum_int_jit": lambda: jax.jit(lambda v: hvd.allreduce(v, op=hvd.Adasum))(
            jnp.ones(4, jnp.int32)),
        "adasum_reducescatter_jit": lambda: jax.jit(lambda v: hvd.reducescatter(
            v, op=hvd.Adasum))(jnp.ones(4, jnp.float32)),
        "min_reducescatter": lambda: hvd.reducescatter(x, op=hvd.Min),
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
    "dtype_mismatch_async_jit": ("JaxRuntimeError", ["float32", "float16", "rank"]),
    "adasum_int_jit": ("TypeError", ["allreduce", "Adasum", "int32", "op=Average or op=Sum"]),
    "adasum_reducescatter_jit": ("HorovodInternalError", ["reducescatter: op 2 is not "
                                                          "supported", "hvd.Average or hvd.Sum"]),
    "min_reducescatter": ("HorovodInternalError", ["reducescatter: op 3 is not supported"]),
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


# ---- a jitted collective ended by a lost rank, abort() or Ctrl-C ----------------------------

HVD_TIMEOUT = 5.0
NEXT_STEP = "until hvd.shutdown() and hvd.init() on every rank"  # what a failed core says


def _outcome(call, settle=False):
    """(type name, message, seconds) of what ``call()`` raised, or ("returned", value, seconds);
    with ``settle``, a KeyboardInterrupt that Python raises just after the call returned is
    recorded as ("late KeyboardInterrupt", message of the call's own error, seconds)."""
    start = time.monotonic()
    try:
        try:
            got = ("returned", call().tolist())
        except BaseException as exc:  # noqa: BLE001 - the test checks what it was
            got = (type(exc).__name__, str(exc))
        seconds = time.monotonic() - start
        if settle:
            time.sleep(0.1)  # Python raises a pending KeyboardInterrupt here at the latest
    except KeyboardInterrupt:
        got = ("late KeyboardInterrupt", got[1])
    return got + (seconds,)


def _ended(call, settle=False):
    """:func:`_outcome` of ``call`` and when it ended (this process's monotonic clock)."""
    got = _outcome(call, settle)
    return got + (time.monotonic(),)


def _stimulus_once_pending(core, folder, me, case, key, stimulus, out):
    """Each rank's side of an interruption's handshake: once its core lists its own op
    (``allreduce.<case>.<rank>``) as pending, rank 1 notes when (``out[key + ".held"]``) and
    says so in ``folder``; rank 0, whose core knows rank 1 never submits rank 0's op, waits for
    that, notes when, and calls ``stimulus()``."""
    faults.wait_until_pending(core, f"allreduce.{case}.{me}", waits_for=[1] if me == 0 else None,
                              timeout=30)
    if me == 1:
        out[key + ".held"] = time.monotonic()
        faults.announce(folder, key)
        return
    faults.await_event(folder, key, timeout=30)
    out[key + ".held"] = time.monotonic()
    stimulus()


def _announce_once_pending(core, folder, names, out):
    """Rank 0's side of the lost-rank handshake: once its core lists every one of ``names``
    as pending, waiting for rank 1 (``core.metrics()["pending"]``), note when
    (``out["lost.announced"]``) and tell rank 1 to die."""
    for name in names:
        faults.wait_until_pending(core, name, waits_for=[1], timeout=30)
    out["lost.announced"] = time.monotonic()
    faults.announce(folder, "waiting")


def rank_interrupted_jit(folder):
    """Each rank's jitted collective waits for an op the other never starts (each rank names
    its own), until rank 0, once both ops are pending (a handshake in ``folder``), (1) calls
    abort() from another thread, (2) gets a SIGINT, each on both jit paths (shutdown() and
    init() after each); then (3) rank 1 dies once rank 0 waits in one jitted collective per
    path, on two threads (its core lists both as pending, and it says so in ``folder``). The
    io_callback path is traced, where the core has the FFI handler, as a core without it
    traces it."""
    import engine_native
    import jax
    import jax.numpy as jnp
    import numpy as np
    import engine_native.jax as hvd
    from engine_native.jax import xla_ffi

    hvd.init()
    me = hvd.rank()
    x = jnp.ones((8, 8), jnp.float32)
    paths = ["xla_ffi", "io_callback"] if xla_ffi.jit_path() == "xla_ffi" else ["io_callback"]
    compiled = {}

    def jitted(name, path, async_=False):
        """allreduce(x) named ``name`` in a program compiled once (jit(...).lower().compile(),
        called again after init(): Note [Compiled programs with ordered collectives]): on
        ``path``, run on XLA's threads when ``async_`` (else on the caller's thread, as a
        small program is)."""
        key = (name, path, async_)
        if key not in compiled:
            def program(v):
                extra = on_xla_threads(jnp, v)[0, 0] * 0 if async_ else 0
                return hvd.allreduce(v, op=hvd.Sum, name=name) + extra
            saved = xla_ffi._why_not
            if path != xla_ffi.jit_path():
                xla_ffi._why_not = "the test traces the io_callback path"
            try:
                executable = jax.jit(program).lower(x).compile()
            finally:
                xla_ffi._why_not = saved
            compiled[key] = lambda: np.asarray(executable(x))
        return compiled[key]

    out = {"paths": paths, "warm": _outcome(jitted(f"after.{paths[0]}", paths[0]))}
    stimuli = {"abort": lambda: engine_native.abort("the test's abort"),
               "sigint": lambda: os.kill(os.getpid(), signal.SIGINT)}
    for case, stimulus in stimuli.items():
        for path in paths:
            key = f"{case}.{path}"
            # on XLA's threads the failure stays in JAX's token (Note [A failed collective and
            # JAX's token]): the ops after init() show it is dropped
            async_ = case == "sigint" and path == "xla_ffi"
            call = jitted(f"{case}.{me}", path, async_)
            hvd.barrier()  # both compiled
            watcher = threading.Thread(target=_stimulus_once_pending, args=(
                engine_native, folder, me, case, key, stimulus, out))
            watcher.start()
            out[key] = _ended(call, settle=case == "sigint")
            watcher.join()
            out[key + ".next"] = _outcome(jitted(f"next.{path}", path))
            hvd.shutdown()
            hvd.init()
            out[key + ".after_init"] = _outcome(jitted(f"after.{path}", path, async_))
    out["rank 1"] = hvd.allgather_object(out)[1]
    calls = {path: jitted(f"lost.{path}", path) for path in paths}
    hvd.barrier()
    if me == 1:  # leaves once rank 0's core holds both collectives, never before
        faults.await_event(folder, "waiting")
        os._exit(3)
    waiting = [threading.Thread(target=lambda p=p: out.__setitem__(f"lost.{p}",
                                                                   _ended(calls[p])))
               for p in paths[1:]]
    names = [f"allreduce.lost.{p}" for p in paths]
    waiting.append(threading.Thread(target=_announce_once_pending,
                                    args=(engine_native, folder, names, out)))
    for thread in waiting:
        thread.start()
    out[f"lost.{paths[0]}"] = _ended(calls[paths[0]])
    for thread in waiting:
        thread.join()
    out["lost.next"] = _outcome(jitted(f"next.{paths[0]}", paths[0]))
    start = time.monotonic()
    hvd.shutdown()
    out["lost.shutdown_seconds"] = time.monotonic() - start
    return out


def test_lost_rank_abort_or_ctrl_c_end_a_jitted_collective_on_every_rank(tmp_path):
    """Torch's wait ends on each of these (tests/multiproc/test_faults.py,
    test_torch_interrupt.py); inside jax.jit the op cannot stay pending, so Ctrl-C aborts it
    (Note [Ctrl-C inside jax.jit] in bindings/jit_interrupt.h): an error on every rank within
    HVD_TIMEOUT, never the stall shutdown's wait; the next op's error says what to do, and
    after shutdown() and init() jitted collectives work again (on XLA's threads too: Note [A
    failed collective and JAX's token] in engine_native/jax/xla_ffi.py)."""
    results = run_jax_ranks(rank_interrupted_jit, 2, args=(str(tmp_path),), timeout=90,
                            check=False, env={"HVD_TIMEOUT": str(HVD_TIMEOUT)})
    assert results[1].returncode == 3, results[1].describe()
    assert results[0].ok, results[0].describe()
    summed = ("returned", [[2.0] * 8] * 8)
    assert results[0].value["warm"][:2] == summed, results[0].value["warm"]
    for rank, got in enumerate((results[0].value, results[0].value["rank 1"])):
        for path in got["paths"]:
            label = "allreduce (io_callback)" if path == "io_callback" else "allreduce.sigint.0"
            for case, words in (("abort", ["aborted on rank 0: the test's abort"]),
                                ("sigint", ["aborted on rank 0: interrupted (SIGINT, Ctrl-C) "
                                            f"while waiting inside jax.jit for {label}"])):
                key = f"{case}.{path}"
                kind, message, seconds, ended = got[key]
                if case == "sigint" and rank == 0:  # the interrupted rank: KeyboardInterrupt
                    assert "KeyboardInterrupt" in kind or message.endswith(
                        "KeyboardInterrupt: "), (rank, key, got[key])
                else:
                    assert kind == "JaxRuntimeError" and all(w in message for w in words), \
                        (rank, key, got[key])
                # still waiting when its op was seen pending (and, on rank 0, stimulated)
                assert got[key + ".held"] < ended and seconds < HVD_TIMEOUT, \
                    (rank, key, got[key + ".held"], got[key])
                kind, message, _ = got[key + ".next"]
                assert kind == "JaxRuntimeError" and NEXT_STEP in message, \
                    (rank, key, got[key + ".next"])
                assert all(w in message for w in words), (rank, key, got[key + ".next"])
                assert got[key + ".after_init"][:2] == summed, \
                    (rank, key, got[key + ".after_init"])
    got = results[0].value
    assert "lost.announced" in got, "rank 0's core never held both lost collectives " \
        f"(stderr above): {results[0].describe()}"
    for path in got["paths"]:  # pending in rank 0's core when rank 1 left; ended after
        kind, message, seconds, ended = got[f"lost.{path}"]
        assert kind == "JaxRuntimeError" and "rank 1" in message and NEXT_STEP in message, \
            (path, got[f"lost.{path}"])
        assert got["lost.announced"] < ended and seconds < HVD_TIMEOUT, \
            (path, got["lost.announced"], got[f"lost.{path}"])
    kind, message, _ = got["lost.next"]
    assert kind == "JaxRuntimeError" and "rank 1" in message and NEXT_STEP in message, \
        got["lost.next"]
    assert got["lost.shutdown_seconds"] < HVD_TIMEOUT, got["lost.shutdown_seconds"]
