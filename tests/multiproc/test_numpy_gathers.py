"""The numpy API's allgather_async, alltoall_async and reducescatter_async (C functions,
bindings/numpy_gathers.cc) on spawned ranks: every way of calling them a user has, the result
arrays the core's outputs become, the cases the C path hands to the checked Python path
(lists, non-contiguous or byte-swapped arrays, alltoall's splits, unregistered process sets)
and the errors those raise. Results are checked against NumPy.
"""
import gc
import sys

import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import Failures
from multiproc.harness import run_ranks


def _rows(rank: int, cols: int = 3, dtype=np.float32) -> np.ndarray:
    """rank + 1 rows of `cols` values naming their rank and row."""
    return (np.arange((rank + 1) * cols, dtype=np.float64).reshape(rank + 1, cols)
            + 100 * rank).astype(dtype)


def allgather_checks(hvd, fails: Failures) -> None:
    n, me = hvd.size(), hvd.rank()
    want = np.concatenate([_rows(r) for r in range(n)])
    got = hvd.synchronize(hvd.allgather_async(_rows(me), name="kw"))
    fails.expect("allgather: keywords, uneven rows", got.shape == want.shape and
                 got.dtype == np.float32 and np.array_equal(got, want), f"{got}")
    got = hvd.synchronize(hvd.allgather_async(_rows(me), "pos", hvd.global_process_set))
    fails.expect("allgather: positional", np.array_equal(got, want))
    fails.expect("allgather: unnamed", np.array_equal(hvd.allgather(_rows(me)), want))
    fails.expect("allgather: non-str name", np.array_equal(hvd.allgather(_rows(me), name=7), want))
    ints = hvd.allgather(np.full((2, 2), me, np.int64), name="int64")
    fails.expect("allgather: int64", ints.dtype == np.int64 and
                 np.array_equal(ints[::2, 0], np.arange(n)), f"{ints}")
    bf = hvd.allgather(np.full(2, me, dtype=checks.BFLOAT16), name="bf16")
    fails.expect("allgather: bfloat16", bf.dtype == checks.BFLOAT16 and
                 np.array_equal(bf.astype(np.float32), np.repeat(np.arange(n), 2)), f"{bf}")
    empty = hvd.allgather(np.zeros((0, 3), np.float32), name="empty")
    fails.expect("allgather: no rows anywhere", empty.shape == (0, 3), f"{empty.shape}")
    if n > 1:  # Note [Output guesses]: rows alike on every rank fill a pooled array (no base)
        fails.expect("allgather: the guessed output filled", ints.base is None)
        fails.expect("allgather: uneven rows in the core's output",
                     isinstance(got, np.ndarray) and got.base is not None)

    # Results are the caller's: writable, distinct, and valid after everything else is gone.
    a = hvd.allgather(_rows(me), name="own.a")
    b = hvd.allgather(_rows(me), name="own.b")
    a[:] = -1
    fails.expect("allgather: results distinct and writable",
                 a.flags.writeable and np.array_equal(b, want))
    view = hvd.allgather(_rows(me), name="own.c")[1:]
    gc.collect()
    fails.expect("allgather: a view keeps the core's output", np.array_equal(view, want[1:]))

    # Handed to the checked path: it works, or raises what Python raised.
    got = hvd.allgather([float(me)], name="list")
    fails.expect("allgather: list input", np.allclose(got, np.arange(n)), f"{got}")
    strided = np.arange(12, dtype=np.float64).reshape(3, 4)[:, 1]
    fails.expect_raises("allgather: non-contiguous", ValueError,
                        lambda: hvd.allgather(strided, name="strided"), "contiguous")
    fails.expect_raises("allgather: byte-swapped", TypeError,
                        lambda: hvd.allgather(np.ones(3, dtype=">f4"), name="swapped"),
                        "unsupported dtype")
    fails.expect_raises("allgather: unregistered set", ValueError,
                        lambda: hvd.allgather(_rows(me), process_set=hvd.ProcessSet([0])),
                        "not registered")
    fails.expect_raises("allgather: unknown keyword", TypeError,
                        lambda: hvd.allgather_async(_rows(me), bogus=1), "bogus")
    fails.expect_raises("allgather: scalar", ValueError,
                        lambda: hvd.allgather(np.array(3.0), name="scalar"), "scalar")
    # Unnamed ops of both paths count on one counter: they meet whichever path each rank took.
    for i in range(3):
        arg = [float(me)] if (me + i) % 2 else np.array([float(me)])
        got = hvd.allgather(arg)
        fails.expect(f"allgather: unnamed, mixed paths {i}", np.allclose(got, np.arange(n)))


def alltoall_checks(hvd, fails: Failures) -> None:
    n, me = hvd.size(), hvd.rank()
    mine = np.arange(2 * n, dtype=np.float32) + 100 * me  # two rows for each rank
    want = np.concatenate([np.arange(2 * me, 2 * me + 2) + 100 * r for r in range(n)])
    rows, splits = hvd.synchronize(hvd.alltoall_async(mine, name="kw"))
    fails.expect("alltoall: even splits", np.array_equal(rows, want) and
                 rows.dtype == np.float32, f"{rows}")
    fails.expect("alltoall: received splits", splits.dtype == np.int64 and
                 np.array_equal(splits, np.full(n, 2)), f"{splits!r}")
    rows, splits = hvd.alltoall(mine, None, "pos", hvd.global_process_set)
    fails.expect("alltoall: positional", np.array_equal(rows, want))
    rows, _ = hvd.alltoall(mine)
    fails.expect("alltoall: unnamed", np.array_equal(rows, want))
    if n > 1:
        fails.expect("alltoall: the guessed output filled", rows.base is None)
    # Splits go to the checked path: rank r sends r + 1 rows to each... of what it has.
    send = [1] * n
    rows, splits = hvd.alltoall(np.full((n, 2), me, np.int32), splits=send, name="splits")
    fails.expect("alltoall: splits (checked path)", rows.shape == (n, 2) and
                 np.array_equal(rows[:, 0], np.arange(n)) and np.array_equal(splits, send),
                 f"{rows} {splits}")
    fails.expect_raises("alltoall: unregistered set", ValueError,
                        lambda: hvd.alltoall(mine, process_set=hvd.ProcessSet([0])),
                        "not registered")


def reducescatter_checks(hvd, fails: Failures) -> None:
    n, me = hvd.size(), hvd.rank()
    rows = 2 * n + 1  # uneven: the first rank gets one more row
    mine = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + me
    total = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) * n + n * (n - 1) / 2
    first = 0 if me == 0 else 3 + 2 * (me - 1)
    part = total[first:first + (3 if me == 0 else 2)]
    got = hvd.synchronize(hvd.reducescatter_async(mine, op=hvd.Sum, name="kw"))
    fails.expect("reducescatter: Sum, uneven rows", np.array_equal(got, part), f"{got}")
    got = hvd.reducescatter(mine, name="avg")
    fails.expect("reducescatter: Average default", np.allclose(got, part / n), f"{got}")
    if n > 1:
        fails.expect("reducescatter: the guessed output filled", got.base is None)
    got = hvd.synchronize(hvd.reducescatter_async(mine, hvd.Sum, "pos", hvd.global_process_set,
                                                  2.0, 0.25))
    fails.expect("reducescatter: positional, scales", np.allclose(got, part / 2), f"{got}")
    got = hvd.reducescatter(mine.tolist(), op=hvd.Sum, name="list")
    fails.expect("reducescatter: list input (checked path)", np.allclose(got, part), f"{got}")
    fails.expect_raises("reducescatter: repeated argument", TypeError,
                        lambda: hvd.reducescatter_async(mine, hvd.Sum, op=hvd.Sum), "op")
    few = np.full((n - 1, 2), me + 1, np.int32)  # fewer rows than ranks: the last gets none
    got = hvd.reducescatter(few, op=hvd.Sum, name="few")
    rows_here = 1 if me < n - 1 else 0
    fails.expect("reducescatter: a rank with no rows", got.shape == (rows_here, 2) and
                 np.all(got == n * (n + 1) // 2), f"{got!r}")


def failure_checks(hvd, fails: Failures) -> None:
    """A failed op through the C path raises on every rank and keeps nothing; the next op
    works; repeated calls hold no reference to their inputs."""
    n, me = hvd.size(), hvd.rank()
    if n > 1:
        odd = np.ones((1, 2 + (me == n - 1)), np.float32)  # trailing dims differ on one rank
        fails.expect_raises("allgather: mismatched trailing dims", Exception,
                            lambda: hvd.allgather(odd, name="odd"), "shape")
        fails.expect("allgather: the name is free again",
                     np.array_equal(hvd.allgather(np.ones(1, np.float32), name="odd"),
                                    np.ones(n, np.float32)))
    x = np.ones(3, np.float32)
    before = sys.getrefcount(x)
    for _ in range(20):
        hvd.allgather(x, name="refs")
        hvd.reducescatter(x, name="refs")
        hvd.alltoall(np.ones(n, np.float32), name="refs")
    fails.expect("inputs not kept", sys.getrefcount(x) == before,
                 f"{sys.getrefcount(x)} references, {before} before")


def gathers_suite():
    hvd = checks.init("shm")
    fails = Failures()
    allgather_checks(hvd, fails)
    alltoall_checks(hvd, fails)
    reducescatter_checks(hvd, fails)
    failure_checks(hvd, fails)
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_", [1, 3])
def test_numpy_gathers_calls(np_):
    run_ranks(gathers_suite, np_, timeout=120)
