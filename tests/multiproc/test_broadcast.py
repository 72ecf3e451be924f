"""broadcast from every root on spawned ranks."""
import numpy as np

from multiproc import checks
from multiproc.checks import ALL_DTYPES, Failures
from multiproc.harness import run_ranks


def _check(hvd, fails, dtype, shape, root, name, async_=False):
    x = checks.make_input(dtype, shape, hvd.rank(), name)
    before = x.copy()
    if async_:
        out = hvd.synchronize(hvd.broadcast_async(x, root, name=name))
    else:
        out = hvd.broadcast(x, root, name=name)
    fails.check(name, checks.mismatch(out, checks.make_input(dtype, shape, root, name), dtype))
    fails.expect(f"{name} input untouched", np.array_equal(x, before))
    fails.expect(f"{name} new array", not np.shares_memory(out, x))
    # In place: the same array comes back holding the root's values.
    y = x.copy()
    if async_:
        back = hvd.synchronize(hvd.broadcast_async_(y, root, name=name + ".inplace"))
    else:
        back = hvd.broadcast_(y, root, name=name + ".inplace")
    fails.expect(f"{name} in place returns its array", back is y)
    fails.check(name + ".inplace", checks.mismatch(y, checks.make_input(dtype, shape, root, name),
                                                   dtype))


def broadcast_suite(transport):
    hvd = checks.init(transport)
    fails = Failures()
    n = hvd.size()
    for root in range(n):
        for dtype in ALL_DTYPES:
            for count in checks.SMALL_COUNTS:
                _check(hvd, fails, dtype, count, root, f"{dtype}.{count}.root{root}")
            _check(hvd, fails, dtype, (3, 4, 5), root, f"{dtype}.3d.root{root}")
        _check(hvd, fails, np.float32, (), root, f"scalar.root{root}")
    # Larger than a chunk, every dtype, the root rotating over the ranks.
    for i, dtype in enumerate(ALL_DTYPES):
        _check(hvd, fails, dtype, checks.large_count(dtype), i % n, f"large.{dtype}",
               async_=True)
    # name=None and several in flight with different roots.
    handles = [hvd.broadcast_async(np.full(5, hvd.rank() * 10 + i), i % n) for i in range(6)]
    for i, h in enumerate(handles):
        out = hvd.synchronize(h)
        fails.expect(f"unnamed.{i}", np.all(out == (i % n) * 10 + i), f"got {out}")
    # Root out of range: a local ValueError, and the next op still works.
    for bad in (-1, n):
        try:
            hvd.broadcast(np.zeros(2), bad, name=f"bad-root.{bad}")
            fails.items.append(f"root {bad}: no error")
        except ValueError:
            pass
    fails.expect("after bad root", np.all(hvd.broadcast(np.full(2, hvd.rank()), 0) == 0))
    # broadcast_ needs an array it may overwrite; the error loses nothing and the next op works.
    frozen = np.full(3, hvd.rank(), np.float32)
    frozen.flags.writeable = False
    strided = np.zeros(8, np.float32)[::2]
    for bad, error in (([1.0, 2.0], TypeError), (frozen, ValueError), (strided, ValueError)):
        try:
            hvd.broadcast_(bad, 0, name="bad-inplace")
            fails.items.append(f"broadcast_({type(bad).__name__}): no error")
        except error:
            pass
    fails.expect("read-only input untouched", np.all(frozen == hvd.rank()))
    for bad_root in (-1, n):
        try:
            hvd.broadcast_(np.zeros(2), bad_root, name=f"bad-inplace-root.{bad_root}")
            fails.items.append(f"broadcast_ root {bad_root}: no error")
        except ValueError:
            pass
    z = np.full(4, hvd.rank(), np.int64)
    fails.expect("after bad in-place", np.all(hvd.broadcast_(z, n - 1) == n - 1))
    hvd.shutdown()
    return fails.raise_if_any()


@checks.world_params()
def test_broadcast(np_, transport):
    res = run_ranks(broadcast_suite, np_, args=(transport,), timeout=240,
                    **checks.world_kwargs(np_, transport))
    assert all(r.value > 100 for r in res)
