"""The numpy API's allreduce_async/synchronize (C functions, bindings/numpy_api.cc) and
broadcast_async/broadcast_async_ (bindings/numpy_broadcast.cc) on spawned ranks: every way of calling them a user has, the cases the C path hands to the checked Python
path (lists, subclasses, non-contiguous or byte-swapped arrays, unregistered process sets),
and the errors those raise; and the pools results come from (Note [Output array pools]).
Results are checked against NumPy.
"""
import weakref

import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import Failures
from multiproc.harness import run_ranks


def calls_suite():
    hvd = checks.init("shm")
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    total = n * (n - 1) / 2
    x = np.arange(6, dtype=np.float32) + me
    x_before = x.copy()
    want = np.arange(6, dtype=np.float32) * n + total

    # Positional and keyword forms; op by position; defaults (Average).
    fails.expect("keywords", np.array_equal(
        hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, name="kw")), want))
    fails.expect("positional", np.array_equal(
        hvd.synchronize(hvd.allreduce_async(x, hvd.Sum, "pos", 1.0, 1.0)), want))
    fails.expect("average default", np.allclose(
        hvd.synchronize(hvd.allreduce_async(x, name="avg")), want / n))
    fails.expect("scales", np.allclose(hvd.synchronize(hvd.allreduce_async(
        x, op=hvd.Sum, name="sc", prescale_factor=2, postscale_factor=0.5)), want))
    fails.expect("unnamed", np.array_equal(hvd.allreduce(x, op=hvd.Sum), want))
    fails.expect("non-str name", np.array_equal(hvd.allreduce(x, op=hvd.Sum, name=7), want))

    # Handed to the checked path: it must work with the defaults too.
    out = hvd.synchronize(hvd.allreduce_async([1.0, 2.0, 3.0], name="list"))
    fails.expect("list input", np.allclose(out, [1.0, 2.0, 3.0]), f"{out}")
    # process_set=None is the global set on the C path and on the checked path it hands over to.
    out = hvd.allreduce([1.0, 2.0], op=hvd.Sum, name="none.list", process_set=None)
    fails.expect("None set, checked path", np.allclose(out, [n, 2.0 * n]), f"{out}")
    outs = hvd.grouped_allreduce([x, [1.0]], op=hvd.Sum, name="none.group", process_set=None,
                                 aligned=True)  # a list member: the C path declines the group
    fails.expect("None set, declined group",
                 np.array_equal(outs[0], want) and np.allclose(outs[1], [n]), f"{outs}")
    if n > 1:  # a member failing (shapes differ across ranks) does not stop the others' waits
        bad = np.ones(2 + (me == n - 1), np.float32)
        fails.expect_raises("group member fails", Exception, lambda: hvd.grouped_allreduce(
            [x, bad, x], op=hvd.Sum, name="mismatch", aligned=True), "shape")
        outs = hvd.grouped_allreduce([x, x, x], op=hvd.Sum, name="mismatch", aligned=True)
        fails.expect("failed group's names free", all(np.array_equal(o, want) for o in outs))
    strided = np.arange(12, dtype=np.float64).reshape(3, 4)[:, 1]
    fails.expect_raises("non-contiguous", ValueError,
                        lambda: hvd.allreduce_async(strided, name="strided"), "contiguous")
    fails.expect_raises("byte-swapped", TypeError,
                        lambda: hvd.allreduce(np.ones(3, dtype=">f4"), name="swapped"),
                        "unsupported dtype")
    fails.expect_raises("unregistered set", ValueError,
                        lambda: hvd.allreduce(x, process_set=hvd.ProcessSet([0])), "not registered")
    huge = hvd.ProcessSet([0])
    huge.process_set_id = 2 ** 32  # must never wrap to the global set (0)
    fails.expect_raises("set id out of range", OverflowError,
                        lambda: hvd.allreduce(x, op=hvd.Sum, name="huge", process_set=huge))
    fails.expect_raises("unknown keyword", TypeError,
                        lambda: hvd.allreduce_async(x, bogus=1), "bogus")
    fails.expect_raises("repeated argument", TypeError,
                        lambda: hvd.allreduce_async(x, hvd.Sum, op=hvd.Sum), "op")
    fails.expect_raises("unknown handle", ValueError, lambda: hvd.synchronize(123456789))

    # Outputs are fresh arrays: never the input, never shared between calls.
    a = hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, name="fresh.a"))
    b = hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, name="fresh.b"))
    a[:] = -1
    fails.expect("fresh outputs", np.array_equal(b, want) and np.array_equal(x, x_before))
    fails.expect("output dtype/shape", a.dtype == x.dtype and a.shape == x.shape)

    # A pooled (>= 1 MiB) output and a 2-D array through the fast path.
    big = np.full((512, 1024), me + 1.0, np.float32)
    fails.expect("large", bool(np.all(hvd.allreduce(big, op=hvd.Sum, name="big") == total + n)))
    bf = np.ones(5, dtype=checks.BFLOAT16)
    out = hvd.allreduce(bf, op=hvd.Sum, name="bf16")
    fails.expect("bfloat16", out.dtype == checks.BFLOAT16 and
                 bool(np.all(out.astype(np.float32) == n)), f"{out}")
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_", [1, 2])
def test_numpy_allreduce_calls(np_):
    run_ranks(calls_suite, np_, timeout=120)


def broadcast_calls_suite():
    hvd = checks.init("shm")
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    root = n - 1
    mine = np.arange(6, dtype=np.float32) + 10 * me
    want = np.arange(6, dtype=np.float32) + 10 * root

    # Every form of call, copying and in place; the root's values everywhere.
    fails.expect("keywords", np.array_equal(hvd.synchronize(
        hvd.broadcast_async(mine, root_rank=root, name="kw")), want))
    fails.expect("positional", np.array_equal(hvd.synchronize(
        hvd.broadcast_async(mine, root, "pos", hvd.global_process_set)), want))
    fails.expect("unnamed", np.array_equal(hvd.broadcast(mine, root), want))
    fails.expect("non-str name", np.array_equal(hvd.broadcast(mine, root, name=7), want))
    x = mine.copy()
    y = hvd.broadcast_(x, root_rank=root, name="inplace")
    fails.expect("in place: the array itself", y is x and np.array_equal(x, want), f"{x}")
    x = mine.copy()
    fails.expect("in place, async", hvd.synchronize(hvd.broadcast_async_(x, root)) is x
                 and np.array_equal(x, want))
    two_d = np.full((3, 4), me, np.int64)
    fails.expect("2-D int64 in place", np.all(hvd.broadcast_(two_d, 0, name="2d") == 0))
    bf = np.full(5, me, dtype=checks.BFLOAT16)
    out = hvd.broadcast(bf, root, name="bf16")
    fails.expect("bfloat16", out.dtype == checks.BFLOAT16 and
                 bool(np.all(out.astype(np.float32) == root)), f"{out}")

    # The copying form: fresh outputs, the input untouched; a pooled (>= 1 MiB) one too.
    before = mine.copy()
    a = hvd.broadcast(mine, root, name="fresh.a")
    b = hvd.broadcast(mine, root, name="fresh.b")
    a[:] = -1
    fails.expect("fresh outputs", np.array_equal(b, want) and np.array_equal(mine, before)
                 and a is not mine and b is not mine)
    big = np.full((512, 1024), me, np.float32)
    fails.expect("large copy", bool(np.all(hvd.broadcast(big, root, name="big") == root)))
    fails.expect("large in place", bool(np.all(hvd.broadcast_(big, 0, name="big_") == 0)))

    # Handed to the checked path: it works, or raises what Python raised.
    out = hvd.broadcast([1.0 + me, 2.0], root, name="list")
    fails.expect("list input", np.allclose(out, [1.0 + root, 2.0]), f"{out}")
    strided = np.arange(12, dtype=np.float64).reshape(3, 4)[:, 1]
    fails.expect_raises("copy of a non-contiguous array", ValueError,
                        lambda: hvd.broadcast(strided, 0, name="strided"), "contiguous")
    fails.expect_raises("in place, non-contiguous", ValueError,
                        lambda: hvd.broadcast_(strided, 0, name="strided_"), "contiguous")
    fails.expect_raises("in place, a list", TypeError,
                        lambda: hvd.broadcast_([1.0], 0), "numpy array to overwrite")
    read_only = np.ones(3, np.float32)
    read_only.flags.writeable = False
    fails.expect_raises("in place, read-only", ValueError,
                        lambda: hvd.broadcast_(read_only, 0), "read-only")
    fails.expect("copy of a read-only array", np.array_equal(
        hvd.broadcast(read_only, 0, name="ro"), np.ones(3, np.float32)))
    fails.expect_raises("byte-swapped", TypeError,
                        lambda: hvd.broadcast(np.ones(3, dtype=">f4"), 0, name="swapped"),
                        "unsupported dtype")
    fails.expect_raises("unregistered set", ValueError,
                        lambda: hvd.broadcast_(x, 0, process_set=hvd.ProcessSet([0])),
                        "not registered")
    fails.expect_raises("missing root", TypeError,
                        lambda: hvd.broadcast_async(x), "broadcast_async() missing")
    fails.expect_raises("unknown keyword", TypeError,
                        lambda: hvd.broadcast_async_(x, 0, bogus=1), "bogus")
    fails.expect_raises("root out of range", ValueError,
                        lambda: hvd.broadcast(x, n, name="far"), "root")
    fails.expect_raises("root past int", OverflowError,
                        lambda: hvd.broadcast(x, 2 ** 40, name="farther"))

    # Unnamed ops of both paths count on one counter: a rank passing a list (the checked path)
    # and one passing an array (the C path) name their ops alike and meet.
    for i in range(3):
        arg = [float(me), 1.0] if (me + i) % 2 else np.array([me, 1.0])
        out = hvd.broadcast(arg, root)
        fails.expect(f"unnamed, mixed paths {i}", np.allclose(out, [root, 1.0]), f"{out}")
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_", [1, 3])
def test_numpy_broadcast_calls(np_):
    run_ranks(broadcast_calls_suite, np_, timeout=120)


def output_pools_suite():
    hvd = checks.init("shm")
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    want = n * (n + 1) / 2
    x = np.full(6, me + 1.0, np.float32)

    def allreduce(scale=1.0, array=x):
        return hvd.allreduce(array * scale, op=hvd.Sum, name="one")

    # One tensor at a time: a dropped result comes back; anything still referring to it, or a
    # result changed so that it no longer fits, keeps it from being handed out again.
    out = allreduce()
    first = id(out)
    del out
    out = allreduce(2)
    fails.expect("dropped result reused", id(out) == first and bool(np.all(out == 2 * want)))
    view = out[2:4]
    del out
    out = allreduce(3)
    fails.expect("viewed result kept", id(out) != first and bool(np.all(view == 2 * want)),
                 f"{view}")
    del view
    out.flags.writeable = False
    del out
    out = allreduce(4)
    fails.expect("read-only result not handed out",
                 out.flags.writeable and bool(np.all(out == 4 * want)))
    out.dtype = np.int32
    del out
    out = allreduce(5)
    fails.expect("retyped result not handed out",
                 out.dtype == np.float32 and bool(np.all(out == 5 * want)), f"{out.dtype}")
    probe = weakref.ref(out)
    del out
    out = allreduce(6)
    fails.expect("weakly referenced result not handed out",
                 out is not probe() and bool(np.all(out == 6 * want)))
    del out
    for shape in [(2, 3), (3, 2), (7,)]:  # the same size and rank first, then another size
        out = hvd.allreduce(np.full(shape, me + 1.0, np.float32), op=hvd.Sum, name="shaped")
        fails.expect(f"result of shape {shape}",
                     out.shape == shape and bool(np.all(out == want)), f"{out.shape}")
        del out

    # A step's tensors: results dropped before the next step are reused in place; results
    # held across a step (`outs = step()`) are not, and come back the step after.
    shapes = [(6,), (2, 3), (1024,), (7,), (3, 5, 2)]
    inputs = [np.full(shape, me + 1.0, np.float32) for shape in shapes]

    def step():
        handles = [hvd.allreduce_async(t, op=hvd.Sum, name=f"g{i}") for i, t in enumerate(inputs)]
        return [hvd.synchronize(h) for h in handles]

    ids = [id(o) for o in step()]
    outs = step()
    fails.expect("step: dropped results reused", [id(o) for o in outs] == ids)
    for t in inputs:
        t *= 2
    held = outs
    outs = step()
    fails.expect("step: held results untouched", all(bool(np.all(o == want)) for o in held))
    fails.expect("step: held results not handed out", not {id(o) for o in outs} & set(ids))
    del held
    outs = step()
    fails.expect("step: results come back a step later", [id(o) for o in outs] == ids)
    fails.expect("step: results right", all(
        o.shape == shape and bool(np.all(o == 2 * want)) for o, shape in zip(outs, shapes)))

    # One result kept (a baseline, a logged value) does not stop the results after it from
    # being handed out again: the small pool looks past a held front (and past a free result
    # of another shape behind it, as a metric's allreduce leaves). The pool's counts tell
    # (ids cannot: a new array may land where a dropped one was).
    from engine_native import _core
    del outs
    baseline = allreduce(7)
    hvd.allreduce(np.ones(3, np.float32), name="other")  # a result of another shape behind it
    before = _core.output_pool_counts()
    for _ in range(4):
        allreduce(8)
    made = _core.output_pool_counts()["small_made"] - before["small_made"]
    fails.expect("kept result: later ones reused", made <= 1 and
                 bool(np.all(baseline == 7 * want)), f"{made} new arrays for 4 results")
    del baseline

    # Large results (>= 1 MiB) of two shapes: each finds its own free array whatever the
    # order (a FIFO would drop the other shape's), and a held one is never handed out.

    def big(shape, k):
        before = _core.output_pool_counts()
        out = hvd.allreduce(np.full(shape, (me + 1.0) * k, np.float32), op=hvd.Sum,
                            name=f"big{len(shape)}")
        after = _core.output_pool_counts()
        fails.expect(f"large {shape} result right", bool(np.all(out == k * want)))
        reused = after["large_reused"] - before["large_reused"]
        made = after["large_made"] - before["large_made"]
        return out, ("reused" if (reused, made) == (1, 0) else
                     "new" if (reused, made) == (0, 1) else f"{reused} reused, {made} new")

    for shape in [(1 << 18,), (512, 1024)]:
        how = big(shape, 1)[1]  # the result is dropped at once
        fails.expect(f"large {shape}: first result new", how == "new", how)
    for k, shape in enumerate([(512, 1024), (1 << 18,)], start=2):
        how = big(shape, k)[1]
        fails.expect(f"large {shape} reused in any order", how == "reused", how)
    held = big((1 << 18,), 5)[0]
    out, how = big((1 << 18,), 6)
    fails.expect("large held result not handed out", how == "new" and out is not held and
                 bool(np.all(held == 5 * want)), how)
    hvd.shutdown()
    return fails.raise_if_any()


def test_numpy_output_pools():
    run_ranks(output_pools_suite, 2, timeout=120)
