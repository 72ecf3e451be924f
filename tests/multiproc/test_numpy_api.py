"""The numpy API's allreduce_async/synchronize (C functions, bindings/numpy_api.cc) on spawned
ranks: every way of calling them a user has, the cases the C path hands to the checked Python
path (lists, subclasses, non-contiguous or byte-swapped arrays, unregistered process sets),
and the errors those raise. Results are checked against NumPy.
"""
import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import Failures
from multiproc.harness import run_ranks


def _expect_raises(fails, label, exc_type, fn, text=""):
    try:
        fn()
    except exc_type as exc:
        fails.expect(f"{label}: message", text in str(exc), str(exc))
        return
    except Exception as exc:  # noqa: BLE001 - the wrong type is the failure
        fails.expect(f"{label}: raises {exc_type.__name__}", False, repr(exc))
        return
    fails.expect(f"{label}: raises {exc_type.__name__}", False, "nothing raised")


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
    strided = np.arange(12, dtype=np.float64).reshape(3, 4)[:, 1]
    _expect_raises(fails, "non-contiguous", ValueError,
                   lambda: hvd.allreduce_async(strided, name="strided"), "contiguous")
    _expect_raises(fails, "byte-swapped", TypeError,
                   lambda: hvd.allreduce(np.ones(3, dtype=">f4"), name="swapped"),
                   "unsupported dtype")
    _expect_raises(fails, "unregistered set", ValueError,
                   lambda: hvd.allreduce(x, process_set=hvd.ProcessSet([0])), "not registered")
    huge = hvd.ProcessSet([0])
    huge.process_set_id = 2 ** 32  # must never wrap to the global set (0)
    _expect_raises(fails, "set id out of range", OverflowError,
                   lambda: hvd.allreduce(x, op=hvd.Sum, name="huge", process_set=huge))
    _expect_raises(fails, "unknown keyword", TypeError,
                   lambda: hvd.allreduce_async(x, bogus=1), "bogus")
    _expect_raises(fails, "repeated argument", TypeError,
                   lambda: hvd.allreduce_async(x, hvd.Sum, op=hvd.Sum), "op")
    _expect_raises(fails, "unknown handle", ValueError, lambda: hvd.synchronize(123456789))

    # Outputs are fresh arrays: never the input, never shared between calls.
    a = hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, name="fresh.a"))
    b = hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, name="fresh.b"))
    a[:] = -1
    fails.expect("fresh outputs", np.array_equal(b, want) and np.array_equal(x, x_before))
    fails.expect("output dtype/shape", a.dtype == x.dtype and a.shape == x.shape)

    # A pooled (>= 1 MiB) output and a 2-D array through the fast path.
    big = np.full((512, 1024), me + 1.0, np.float32)
    fails.expect("large", bool(np.all(hvd.allreduce(big, op=hvd.Sum, name="big") == total + n)))
    if checks.BFLOAT16 is not None:
        bf = np.ones(5, dtype=checks.BFLOAT16)
        out = hvd.allreduce(bf, op=hvd.Sum, name="bf16")
        fails.expect("bfloat16", out.dtype == checks.BFLOAT16 and
                     bool(np.all(out.astype(np.float32) == n)), f"{out}")
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_", [1, 2])
def test_numpy_allreduce_calls(np_):
    run_ranks(calls_suite, np_, timeout=120)
