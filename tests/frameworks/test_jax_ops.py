"""engine_native.jax collectives by value: every op and dtype (grouped_allgather too), eagerly
and inside jax.jit, every other reduce op (jax_reduce_checks.py), process sets and async
handles, fp16 compression of average_gradients, backward_passes_per_step eagerly,
independent collectives of one jitted program in program order, eager grouped results
adopted by XLA without a copy (and right through the public jax.device_put where jaxlib's
wrap is missing or fails), on 2 and 3 ranks.

One launch of ranks per world size (importing jax costs ~2 s a rank): each rank runs every
check, collects what failed, and returns the list; the test shows every rank's list.
"""
import os

import pytest

from .jax_ranks import DTYPES, run_jax_ranks
from .jax_ranks import expect as _expect
from .jax_reduce_checks import check_reduce_ops

pytestmark = [pytest.mark.multiproc, pytest.mark.jax]

def _all_ops(hvd, ps):
    """Every collective on each dtype's array (and its n-times tiled rows, for alltoall): a
    dict per dtype. Run eagerly, and jitted as ONE program for all dtypes (a compilation per
    dtype would double the test's time)."""
    def ops(inputs):
        out = {}
        for dt, (x, rows) in inputs.items():
            op = hvd.Max if dt == "bool" else hvd.Sum
            out[dt] = {"allreduce": hvd.allreduce(x, op=op, process_set=ps),
                       "broadcast": hvd.broadcast(x, ps.ranks[-1], process_set=ps),
                       "allgather": hvd.allgather(x, process_set=ps),
                       "grouped": hvd.grouped_allreduce([x, x[:1]], op=op, process_set=ps),
                       "gathered": hvd.grouped_allgather([x, x[:1]], process_set=ps),
                       "alltoall": hvd.alltoall(rows, process_set=ps)}
            if dt != "bool":
                out[dt]["reducescatter"] = hvd.reducescatter(x, op=hvd.Sum, process_set=ps)
        return out
    return ops


def _check_collectives(hvd, jax, np, failures, ps, label, dtypes=DTYPES):
    """Every collective in every dtype on ``ps``, eagerly and inside jax.jit."""
    import jax.numpy as jnp
    n, me = ps.size(), ps.rank()
    base = np.arange(6).reshape(3, 2)
    every = {dt: [((base + q) % 2 if dt == "bool" else base * (q + 1)).astype(jnp.dtype(dt))
                  for q in range(n)] for dt in dtypes}
    inputs = {dt: (jnp.asarray(every[dt][me]), jnp.asarray(np.concatenate([every[dt][me]] * n)))
              for dt in dtypes}
    ops = _all_ops(hvd, ps)
    share = [len(c) for c in np.array_split(np.arange(3), n)]
    start = sum(share[:me])
    for mode, results in (("eager", ops(inputs)), ("jit", jax.jit(ops)(inputs))):
        for dt, got in results.items():
            tag = f"{label}.{mode}.{dt}"
            x, every_dt = inputs[dt][0], every[dt]
            reduced = (np.any(every_dt, axis=0) if dt == "bool"
                       else np.sum(every_dt, axis=0).astype(every_dt[0].dtype))
            _expect(failures, f"{tag}.allreduce", got["allreduce"], reduced)
            if got["allreduce"].devices() != x.devices():
                failures.append(f"{tag}: result on {got['allreduce'].devices()}, input on "
                                f"{x.devices()}")
            _expect(failures, f"{tag}.broadcast", got["broadcast"], every_dt[-1])
            _expect(failures, f"{tag}.allgather", got["allgather"], np.concatenate(every_dt))
            _expect(failures, f"{tag}.grouped.0", got["grouped"][0], reduced)
            _expect(failures, f"{tag}.grouped.1", got["grouped"][1], reduced[:1])
            _expect(failures, f"{tag}.grouped_allgather.0", got["gathered"][0],
                    np.concatenate(every_dt))
            _expect(failures, f"{tag}.grouped_allgather.1", got["gathered"][1],
                    np.concatenate([e[:1] for e in every_dt]))
            received, splits = got["alltoall"]
            _expect(failures, f"{tag}.alltoall", received, np.concatenate(every_dt))
            _expect(failures, f"{tag}.alltoall.splits", np.asarray(splits, np.int64),
                    np.full(n, 3, np.int64))
            if "reducescatter" in got:
                _expect(failures, f"{tag}.reducescatter", got["reducescatter"],
                        reduced[start:start + share[me]])


def _check_eager_extras(hvd, jnp, np, failures, n, me):
    """What only the eager path does: ragged allgather, alltoall splits, scaling, handles."""
    ragged = jnp.full((me + 1, 2), me, jnp.float32)
    want = np.concatenate([np.full((q + 1, 2), q, np.float32) for q in range(n)])
    _expect(failures, "eager.allgather.ragged", hvd.allgather(ragged), want)
    splits = [q + 1 for q in range(n)]  # q + 1 rows to rank q
    rows = jnp.full((sum(splits),), me, jnp.int32)
    got, got_splits = hvd.alltoall(rows, splits=splits)
    _expect(failures, "eager.alltoall.splits", got,
            np.repeat(np.arange(n, dtype=np.int32), me + 1))
    _expect(failures, "eager.alltoall.received", np.asarray(got_splits, np.int64),
            np.full(n, me + 1, np.int64))
    got = hvd.allreduce(jnp.ones(4, jnp.float32), op=hvd.Sum, prescale_factor=2.0,
                        postscale_factor=0.5)
    _expect(failures, "eager.allreduce.scaled", got, np.full(4, n, np.float32))
    got = hvd.allreduce(jnp.full(4, me, jnp.float32))  # Average by default
    _expect(failures, "eager.allreduce.average", got, np.full(4, (n - 1) / 2, np.float32))
    handles = [hvd.allreduce_async(jnp.full(8, me + k, jnp.float32), op=hvd.Sum,
                                   name=f"async.{k}") for k in range(3)]
    grouped = hvd.grouped_allreduce_async([jnp.ones(3, jnp.int32), jnp.ones(2, jnp.float32)],
                                          op=hvd.Sum)
    gathered = hvd.allgather_async(jnp.full((1,), me, jnp.int32))
    ragged_group = hvd.grouped_allgather_async([jnp.full((me + 1, 2), me, jnp.float32),
                                                jnp.arange(me + 2, dtype=jnp.int32)])
    while not all(hvd.poll(h) for h in handles):  # poll never blocks; a finished op stays so
        pass
    for k, h in enumerate(handles):
        _expect(failures, f"async.{k}", hvd.synchronize(h),
                np.full(8, sum(q + k for q in range(n)), np.float32))
    got = hvd.synchronize(grouped)
    _expect(failures, "async.grouped.0", got[0], np.full(3, n, np.int32))
    _expect(failures, "async.grouped.1", got[1], np.full(2, n, np.float32))
    _expect(failures, "async.allgather", hvd.synchronize(gathered), np.arange(n, dtype=np.int32))
    got = hvd.synchronize(ragged_group)  # first dimensions differ per rank and per array
    _expect(failures, "async.grouped_allgather.0", got[0], want)
    _expect(failures, "async.grouped_allgather.1", got[1],
            np.concatenate([np.arange(q + 2, dtype=np.int32) for q in range(n)]))
    # Python objects (engine_native.objects, shared with the other bindings)
    got = hvd.broadcast_object({"from": me, "blob": b"x" * (100 * (me + 1))}, root_rank=n - 1)
    if got != {"from": n - 1, "blob": b"x" * (100 * n)}:
        failures.append(f"broadcast_object: got {str(got)[:60]}")
    got = hvd.allgather_object((me, "ab" * me))
    if got != [(q, "ab" * q) for q in range(n)]:
        failures.append(f"allgather_object: got {got}")


def _check_runs_once_per_call(hvd, jax, jnp, failures):
    """Inside jit a collective whose result is unused still runs, once per call: JAX drops an
    unused pure callback, and a rank that skipped an op would leave the others waiting."""
    import engine_native
    unused = jax.jit(lambda v: [hvd.allreduce(v, name="unused.a"),
                                hvd.allreduce(v, name="unused.b"), v][-1])
    before = engine_native.metrics()["ops"]["ALLREDUCE"]
    for _ in range(2):
        unused(jnp.ones(2)).block_until_ready()
    jax.effects_barrier()
    ran = engine_native.metrics()["ops"]["ALLREDUCE"] - before
    if ran != 4:
        failures.append(f"jit: 2 calls of 2 allreduces with unused results ran {ran} ops")


def _check_program_order(hvd, jax, jnp, np, failures, n, me):
    """Independent collectives of one jitted program run in program order on every rank
    (Note [Ordered FFI collectives] in engine_native/jax/xla_ffi.py). The ranks' programs
    differ only in local work (rank r alone computes more before every r-th op, as a rank
    that computes metrics would): without the ordering XLA:CPU scheduled allreduce 1 first on
    rank 0 and allreduce 0 first on rank 1, and both ranks waited forever (the launch's
    timeout ends that)."""
    sizes = [1 << 16, 7, 1 << 12, 3]

    def program(*xs):
        out = []
        for i, x in enumerate(xs):
            if i % n == me:
                for _ in range(3):
                    x = jnp.tanh(x) + jnp.sin(x)
            out.append(hvd.allreduce(x, op=hvd.Sum, name=f"order.{i}"))
        return out
    got = jax.jit(program)(*[jnp.full(s, me + 1.0, jnp.float32) for s in sizes])
    for i, (size, value) in enumerate(zip(sizes, got)):
        parts = [np.float32(q + 1.0) for q in range(n)]
        for q in range(n):
            for _ in range(3 if i % n == q else 0):
                parts[q] = np.tanh(parts[q]) + np.sin(parts[q])
        want = np.full(size, sum(parts), np.float32)
        if not np.allclose(np.asarray(value), want, rtol=1e-5):
            failures.append(f"order.{i}: got {np.asarray(value)[:3]}, want {want[:3]}")


def _check_fp16_compression(hvd, jax, jnp, np, failures, n, me):
    """average_gradients(compression=fp16), eagerly and jitted: the average of the float32
    and float64 leaves within float16's precision, in their dtype, and sent as float16 (the
    core's byte count); the int32 leaf exact and sent as it is."""
    import engine_native
    base = np.linspace(0.1, 3.3, 15).reshape(5, 3) + 1e-4  # not float16 values
    every = [{"w": (base * (q + 1)).astype(np.float32), "d": (base[0] / (q + 1)),
              "i": np.arange(4, dtype=np.int32) * (q + 1) * n} for q in range(n)]
    want = {k: np.mean([e[k] for e in every], axis=0) for k in every[0]}
    grads = jax.tree_util.tree_map(jnp.asarray, every[me])
    tx = hvd.average_gradients(compression=hvd.Compression.fp16)
    for mode, update in (("eager", tx.update), ("jit", jax.jit(tx.update))):
        before = engine_native.metrics()["bytes"]["ALLREDUCE"]
        got, _ = update(grads, tx.init(grads))
        jax.block_until_ready(got)
        jax.effects_barrier()
        sent = engine_native.metrics()["bytes"]["ALLREDUCE"] - before
        if sent != (15 + 3) * 2 + 4 * 4:
            failures.append(f"fp16.{mode}: {sent} bytes allreduced, want 52 (float16)")
        for k in ("w", "d"):
            error = np.abs(np.asarray(got[k], np.float64) - want[k]).max() / np.abs(want[k]).max()
            if got[k].dtype != every[0][k].dtype or not 0 < error < 2e-3:
                failures.append(f"fp16.{mode}.{k}: {got[k].dtype}, relative error {error:.1e}")
        _expect(failures, f"fp16.{mode}.i", got["i"], np.arange(4, dtype=np.int32) * (n + 1)
                * n // 2)


def _check_eager_accumulation(hvd, jnp, np, failures, n, me):
    """DistributedGradientTransformation(backward_passes_per_step=2) eagerly (the jitted one:
    test_jax_training): the first call returns zeros without an allreduce, the second
    applies the inner SGD to the rank average of both calls' sum, with one allreduce."""
    import optax
    import engine_native
    tx = hvd.DistributedGradientTransformation(optax.sgd(1.0), backward_passes_per_step=2)
    params = jnp.zeros(3, jnp.float32)
    state = tx.init(params)
    ran = []
    for k in range(2):
        before = engine_native.metrics()["ops"]["ALLREDUCE"]
        updates, state = tx.update(jnp.full(3, (me + 1) * (k + 1), jnp.float32), state, params)
        ran.append(engine_native.metrics()["ops"]["ALLREDUCE"] - before)
        want = np.zeros(3) if k == 0 else np.full(3, -3 * (n + 1) / 2)
        _expect(failures, f"eager accumulation, call {k}", updates, want.astype(np.float32))
    if ran != [0, 1]:
        failures.append(f"eager accumulation: allreduces per call {ran}, want [0, 1]")


def _check_grouped_results_not_copied(hvd, jnp, np, failures, n):
    """Eager grouped allreduce results are XLA's views of the 64-byte aligned buffer the core
    wrote (engine_native.aligned_buffers), not copies: each starts where the previous one's
    padded bytes end. A copy would put each in its own allocation. They are made by jaxlib's
    one-call wrap, not the public jax.device_put (which aliases them too, ~7x slower an array):
    that one is not called."""
    import jax

    from engine_native.jax import arrays
    xs = [jnp.ones((300, 7), jnp.float32), jnp.ones(5, jnp.int32),
          jnp.ones((2, 3), jnp.float64)]
    public, calls = jax.device_put, []
    jax.device_put = lambda *a, **k: calls.append(1) or public(*a, **k)
    try:
        got = hvd.grouped_allreduce(xs, op=hvd.Sum)
    finally:
        jax.device_put = public
    if arrays._wrap_host is None or calls:
        failures.append(f"eager grouped_allreduce results went through jax.device_put "
                        f"({len(calls)} calls; jaxlib's wrap found: {arrays._wrap_host is not None})")
    for k, (g, x) in enumerate(zip(got, xs)):
        _expect(failures, f"not_copied.{k}", g, np.full(x.shape, n, x.dtype))
    pointers = [g.unsafe_buffer_pointer() for g in got]
    padded = [-(-x.nbytes // 64) * 64 for x in xs]
    want = [pointers[0] + sum(padded[:k]) for k in range(len(xs))]
    if pointers[0] % 64 or pointers != want:
        failures.append(f"eager grouped_allreduce results copied: buffers at offsets "
                        f"{[p - pointers[0] for p in pointers]}, want {[w - want[0] for w in want]}"
                        f", first {pointers[0] % 64} bytes past 64-byte alignment")


def _check_result_wrap_fallback(hvd, jnp, np, failures, n):
    """Where jaxlib's internal wrap is missing (None) or fails (an internal call changed),
    grouped results still come back right, through the public jax.device_put."""
    from engine_native.jax import arrays

    def failing(results, devices):
        raise TypeError("batched_device_put() changed")
    xs = [jnp.ones(5, jnp.float32), jnp.ones((2, 3), jnp.int32)]
    saved = arrays._wrap_host
    for label, stand_in in (("missing", None), ("failing", failing)):
        arrays._wrap_host = stand_in
        try:
            got = hvd.grouped_allreduce(xs, op=hvd.Sum)
        finally:
            arrays._wrap_host = saved
        for k, (g, x) in enumerate(zip(got, xs)):
            _expect(failures, f"wrap {label}.{k}", g, np.full(x.shape, n, x.dtype))


def _check_grouped_c_path(hvd, jnp, np, failures, n):
    """A plain eager group is viewed and submitted by C calls (Note [Host views in C], Note
    [Aligned group path]): with the checked paths' checked_host and enqueue_group made to
    raise, it still comes back right, named or not, waited or async. Groups the C calls must
    decline (a numpy member, an unregistered process set) take the checked paths."""
    from engine_native import numpy_ops
    from engine_native.jax import arrays

    def checked(*args):
        raise AssertionError("the checked Python path ran")
    xs = [jnp.ones((4, 3), jnp.float32), jnp.ones(5, jnp.int32)]
    saved = numpy_ops._core.enqueue_group, arrays.checked_host
    numpy_ops._core.enqueue_group = arrays.checked_host = checked
    try:
        got = {"unnamed": hvd.grouped_allreduce(xs, op=hvd.Sum),
               "named": hvd.grouped_allreduce(xs, op=hvd.Sum, name="c_path"),
               "async": hvd.synchronize(hvd.grouped_allreduce_async(xs, op=hvd.Sum))}
    except AssertionError as exc:
        got = {}
        failures.append(f"grouped C path: {exc}")
    finally:
        numpy_ops._core.enqueue_group, arrays.checked_host = saved
    got["numpy member"] = hvd.grouped_allreduce([xs[0], np.ones(5, np.int32)], op=hvd.Sum)
    # a numpy scalar (what tf.numpy_function passes for a 0-d tensor): the checked path carves
    scalar = numpy_ops.grouped_allreduce([np.ones((4, 3), np.float32), np.int32(1)],
                                         op=hvd.Sum, aligned=True)
    _expect(failures, "carved.0", scalar[0], np.full((4, 3), n, np.float32))
    _expect(failures, "carved.1", scalar[1], np.full((), n, np.int32))
    if any(r.ctypes.data % 64 for r in scalar):
        failures.append("aligned=True checked path: a result not 64-byte aligned")
    for label, results in got.items():
        for k, (g, x) in enumerate(zip(results, xs)):
            _expect(failures, f"c_path {label}.{k}", g, np.full(x.shape, n, x.dtype))
    try:
        hvd.grouped_allreduce(xs, process_set=hvd.ProcessSet([0]))
        failures.append("grouped_allreduce on an unregistered process set raised nothing")
    except ValueError as exc:
        if "grouped_allreduce()" not in str(exc) or "not registered" not in str(exc):
            failures.append(f"unregistered process set: {exc}")


def rank_collectives():
    import jax
    jax.config.update("jax_enable_x64", True)  # float64 and int64 exist only with x64
    import jax.numpy as jnp
    import numpy as np
    import engine_native.jax as hvd

    hvd.init()
    n, me = hvd.size(), hvd.rank()
    failures = []
    # CI installs jaxlib before it builds the core (.ci/run), so its jit ops are FFI calls
    # unless the test asks for the other path
    want = os.environ.get("HVD_JAX_JIT_PATH") or (
        "xla_ffi" if "jax" in os.environ.get("HVD_REQUIRE", "").split(",") else hvd.jit_path())
    if hvd.jit_path() != want:
        failures.append(f"jit_path() is {hvd.jit_path()!r}, not {want!r}: "
                        f"{hvd.jit_path_reason()}")
    _check_collectives(hvd, jax, np, failures, hvd.global_process_set, "global")
    check_reduce_ops(hvd, jax, np, failures, hvd.global_process_set, "global")
    _check_eager_extras(hvd, jnp, np, failures, n, me)
    _check_runs_once_per_call(hvd, jax, jnp, failures)
    _check_program_order(hvd, jax, jnp, np, failures, n, me)
    _check_fp16_compression(hvd, jax, jnp, np, failures, n, me)
    _check_eager_accumulation(hvd, jnp, np, failures, n, me)
    _check_grouped_results_not_copied(hvd, jnp, np, failures, n)
    _check_result_wrap_fallback(hvd, jnp, np, failures, n)
    _check_grouped_c_path(hvd, jnp, np, failures, n)
    if n == 3:  # a process set of ranks 0 and 2; rank 1 runs a global op meanwhile
        pair = hvd.add_process_set([0, 2])
        if me in pair.ranks:
            _check_collectives(hvd, jax, np, failures, pair, "set02",
                               ["float32", "bfloat16", "int64"])
            check_reduce_ops(hvd, jax, np, failures, pair, "set02", ["float32", "bfloat16"])
        got = hvd.allreduce(jnp.full(2, me, jnp.int32), op=hvd.Sum)
        _expect(failures, "after.set", got, np.full(2, 3, np.int32))
        hvd.remove_process_set(pair)
    hvd.shutdown()
    return failures


@pytest.mark.parametrize("np_,path", [(2, None), (3, None), (2, "io_callback")])
def test_collectives_by_value(np_, path):
    """Inside jit: XLA FFI calls where the core has them, and the ordered io_callbacks that a
    core built without jaxlib's headers (a wheel built without jaxlib) takes."""
    results = run_jax_ranks(rank_collectives, np_,
                            env={"HVD_JAX_JIT_PATH": path} if path else None)
    for r in results:
        assert r.value == [], f"rank {r.rank}:\n" + "\n".join(r.value)
