"""alltoall with explicit and default splits on spawned ranks."""
import numpy as np

from multiproc import checks
from multiproc.checks import ALL_DTYPES, Failures
from multiproc.harness import run_ranks


def _splits(sender, n, k):
    """Rows ``sender`` sends to each rank; zeros included, different per sender."""
    return [(sender + 2 * dest + k) % 3 for dest in range(n)]


def _expected(dtype, n, me, name, splits_of, tail):
    parts = []
    for sender in range(n):
        s = splits_of(sender)
        x = checks.make_input(dtype, (sum(s),) + tail, sender, name)
        start = sum(s[:me])
        parts.append(x[start:start + s[me]])
    return np.concatenate(parts), [splits_of(sender)[me] for sender in range(n)]


def _check(hvd, fails, dtype, name, splits_of, tail=(), explicit=True, async_=False):
    n, me = hvd.size(), hvd.rank()
    mine = splits_of(me)
    x = checks.make_input(dtype, (sum(mine),) + tail, me, name)
    before = x.copy()
    args = dict(splits=mine if explicit else None, name=name)
    if async_:
        out, received = hvd.synchronize(hvd.alltoall_async(x, **args))
    else:
        out, received = hvd.alltoall(x, **args)
    expected, expected_splits = _expected(dtype, n, me, name, splits_of, tail)
    fails.check(name, checks.mismatch(out, expected, dtype))
    fails.expect(f"{name} received splits", list(np.asarray(received)) == expected_splits,
                 f"got {list(received)}, expected {expected_splits}")
    fails.expect(f"{name} input untouched", np.array_equal(x, before))


def alltoall_suite(transport):
    hvd = checks.init(transport)
    fails = Failures()
    n = hvd.size()
    for dtype in ALL_DTYPES:
        for k in range(3):
            _check(hvd, fails, dtype, f"{dtype}.1d.{k}", lambda s, k=k: _splits(s, n, k))
        _check(hvd, fails, dtype, f"{dtype}.2d", lambda s: _splits(s, n, 1), tail=(3,))
        # splits=None: dim 0 divided evenly.
        _check(hvd, fails, dtype, f"{dtype}.even", lambda s: [2] * n, tail=(5,),
               explicit=False)
        _check(hvd, fails, dtype, f"{dtype}.odd", lambda s: [(s + d) % 2 + 333 for d in
                                                                range(n)])
        # Larger than a chunk in total.
        rows = checks.CHUNK_BYTES // dtype.itemsize // n // n + 1
        _check(hvd, fails, dtype, f"{dtype}.large",
               lambda s, rows=rows: [rows + s + d for d in range(n)], async_=True)
    _check(hvd, fails, np.float32, "nothing", lambda s: [0] * n, tail=(2,))
    hvd.shutdown()
    return fails.raise_if_any()


@checks.world_params()
def test_alltoall(np_, transport):
    res = run_ranks(alltoall_suite, np_, args=(transport,), timeout=240,
                    **checks.world_kwargs(np_, transport))
    assert all(r.value > 100 for r in res)
