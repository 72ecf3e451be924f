"""allgather on spawned ranks: first dimension differs per rank (zero rows included)."""
import numpy as np

from multiproc import checks
from multiproc.checks import ALL_DTYPES, Failures
from multiproc.harness import run_ranks


def _rows(rank, k):
    return (rank * 3 + k) % 4  # 0..3 rows; some rank has 0 rows for most k


def _check(hvd, fails, dtype, shape_of_rank, name, async_=False):
    x = checks.make_input(dtype, shape_of_rank(hvd.rank()), hvd.rank(), name)
    before = x.copy()
    if async_:
        out = hvd.synchronize(hvd.allgather_async(x, name=name))
    else:
        out = hvd.allgather(x, name=name)
    parts = [checks.make_input(dtype, shape_of_rank(r), r, name) for r in range(hvd.size())]
    fails.check(name, checks.mismatch(out, np.concatenate(parts), dtype))
    fails.expect(f"{name} input untouched", np.array_equal(x, before))


def allgather_suite(transport):
    hvd = checks.init(transport)
    fails = Failures()
    n = hvd.size()
    for dtype in ALL_DTYPES:
        for k in range(3):
            _check(hvd, fails, dtype, lambda r, k=k: (_rows(r, k),), f"{dtype}.1d.{k}")
        _check(hvd, fails, dtype, lambda r: (_rows(r, 1), 3), f"{dtype}.2d")
        _check(hvd, fails, dtype, lambda r: (r + 1, 2, 5), f"{dtype}.3d")
        _check(hvd, fails, dtype, lambda r: (1001 + r,), f"{dtype}.odd")
        # Together larger than a chunk, every rank a different size.
        per_rank = checks.CHUNK_BYTES // dtype.itemsize // n
        _check(hvd, fails, dtype, lambda r, p=per_rank: (p + 17 * r + 1,), f"{dtype}.large",
               async_=True)
    _check(hvd, fails, np.float32, lambda r: (0, 4), "all-empty")
    _check(hvd, fails, np.int64, lambda r: (1,), "one-each")
    # name=None, several in flight at once.
    xs = [np.full((hvd.rank() + 1, 2), 10 * i + hvd.rank(), np.int32) for i in range(4)]
    handles = [hvd.allgather_async(x) for x in xs]
    for i, h in enumerate(handles):
        expected = np.concatenate([np.full((r + 1, 2), 10 * i + r, np.int32) for r in range(n)])
        fails.check(f"unnamed.{i}", checks.mismatch(hvd.synchronize(h), expected, np.int32))
    hvd.shutdown()
    return fails.raise_if_any()


@checks.world_params()
def test_allgather(np_, transport):
    res = run_ranks(allgather_suite, np_, args=(transport,), timeout=240,
                    **checks.world_kwargs(np_, transport))
    assert all(r.value > 100 for r in res)
