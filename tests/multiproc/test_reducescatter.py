"""reducescatter (Sum, Average) on spawned ranks: Horovod's split of dimension 0, where the
first ``dim0 % size`` ranks get one extra row; grouped_reducescatter (one core group of mixed
dtypes and shapes, synchronous and async) gives each member what reducescatter would."""
import numpy as np

from multiproc import checks
from multiproc.checks import Failures
from multiproc.harness import run_ranks

DTYPES = checks.INT_DTYPES + checks.FLOAT_DTYPES  # bool is not reducible by Sum/Average


def _slice(dim0, n, r):
    base, extra = divmod(dim0, n)
    start = r * base + min(r, extra)
    return start, start + base + (1 if r < extra else 0)


def _check(hvd, fails, dtype, shape, op, name, async_=False, **scales):
    n, me = hvd.size(), hvd.rank()
    x = checks.make_input(dtype, shape, me, name)
    before = x.copy()
    if async_:
        out = hvd.synchronize(hvd.reducescatter_async(x, op=op, name=name, **scales))
    else:
        out = hvd.reducescatter(x, op=op, name=name, **scales)
    lo, hi = _slice(shape[0], n, me)
    mine = checks.reference(checks.all_inputs(dtype, shape, n, name, rows=(lo, hi)), op,
                            scales.get("prescale_factor", 1.0),
                            scales.get("postscale_factor", 1.0))
    fails.check(name, checks.mismatch(out, mine, dtype, op))
    fails.expect(f"{name} input untouched", np.array_equal(x, before))


def _check_grouped(hvd, fails):
    n, me = hvd.size(), hvd.rank()
    floats = [("float32", (2 * n + 1, 3)), ("float64", (n, 2)), ("float16", (0, 4))]
    scales = {"prescale_factor": 0.5, "postscale_factor": 4.0}  # floats: ints would round
    for op, async_, scales, members in ((hvd.Sum, False, {}, floats + [("int64", (1,))]),
                                        (hvd.Average, True, scales, floats)):
        tag = f"grouped.{checks.op_names()[op]}"
        names = [f"{tag}.{i}" for i in range(len(members))]
        xs = [checks.make_input(d, shape, me, nm) for (d, shape), nm in zip(members, names)]
        if async_:
            outs = [hvd.synchronize(h) for h in hvd.grouped_reducescatter_async(
                xs, op=op, name=tag, **scales)]
        else:
            outs = hvd.grouped_reducescatter(xs, op=op, name=tag, **scales)
        fails.expect(f"{tag}: one result per array", len(outs) == len(xs))
        for (d, shape), nm, out in zip(members, names, outs):
            lo, hi = _slice(shape[0], n, me)
            want = checks.reference(checks.all_inputs(d, shape, n, nm, rows=(lo, hi)), op,
                                    scales.get("prescale_factor", 1.0),
                                    scales.get("postscale_factor", 1.0))
            fails.check(nm, checks.mismatch(out, want, d, op))
    try:
        hvd.grouped_reducescatter([])
        fails.expect("grouped_reducescatter([]) raises", False)
    except ValueError as exc:
        fails.expect("grouped_reducescatter([]): the message", "non-empty" in str(exc), exc)


def reducescatter_suite(transport):
    hvd = checks.init(transport)
    fails = Failures()
    n = hvd.size()
    names = checks.op_names()
    for dtype in DTYPES:
        for op in (hvd.Sum, hvd.Average):
            tag = f"{dtype}.{names[op]}"
            for dim0 in (0, 1, n, 2 * n + 1, 1001):
                _check(hvd, fails, dtype, (dim0,), op, f"{tag}.{dim0}")
            _check(hvd, fails, dtype, (2 * n + 1, 3, 2), op, f"{tag}.3d")
        rows = checks.large_count(dtype)
        _check(hvd, fails, dtype, (rows,), hvd.Sum, f"{dtype}.large", async_=True)
    for dtype in checks.FLOAT_DTYPES:
        _check(hvd, fails, dtype, (3 * n + 2, 4), hvd.Sum, f"{dtype}.scaled",
               prescale_factor=0.5, postscale_factor=3.0)
    _check_grouped(hvd, fails)
    default = hvd.reducescatter(np.full((n, 2), float(hvd.rank())))  # default op: Average
    fails.check("default op", checks.mismatch(default, np.full((1, 2), (n - 1) / 2.0),
                                              np.float64))
    hvd.shutdown()
    return fails.raise_if_any()


@checks.world_params()
def test_reducescatter(np_, transport):
    res = run_ranks(reducescatter_suite, np_, args=(transport,), timeout=240,
                    **checks.world_kwargs(np_, transport))
    assert all(r.value > 100 for r in res)
