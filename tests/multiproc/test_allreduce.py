"""allreduce / allreduce_async / grouped_allreduce on spawned ranks, checked against NumPy.

One spawn per (world size, transport) runs every dtype x op x size inside the ranks.
"""
import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import ALL_DTYPES, FLOAT_DTYPES, Failures
from multiproc.harness import run_ranks


def _check_one(hvd, fails, dtype, op, shape, name, reference_on_rank0_only=False, **scales):
    prod = op == hvd.Product
    x = checks.make_input(dtype, shape, hvd.rank(), name, prod)
    before = x.copy()
    out = hvd.allreduce(x, op=op, name=name, **scales)
    fails.digest(name, out)
    if not reference_on_rank0_only or hvd.rank() == 0:
        inputs = checks.all_inputs(dtype, shape, hvd.size(), name, prod)
        expected = checks.reference(inputs, op, scales.get("prescale_factor", 1.0),
                                    scales.get("postscale_factor", 1.0))
        fails.check(name, checks.mismatch(out, expected, dtype, op))
    fails.expect(f"{name} input untouched", np.array_equal(x, before))
    fails.expect(f"{name} new array", out is not x and not np.shares_memory(out, x))


def allreduce_suite(transport):
    hvd = checks.init(transport)
    fails = Failures()
    names = checks.op_names()
    for dtype in ALL_DTYPES:
        for op in checks.ops_for(dtype):
            for count in checks.SMALL_COUNTS:
                _check_one(hvd, fails, dtype, op, count, f"{dtype}.{names[op]}.{count}")
    # Larger than a chunk: every dtype once, ops rotating (each op at least twice).
    for i, dtype in enumerate(ALL_DTYPES):
        ops = checks.ops_for(dtype)
        op = ops[i % len(ops)]
        _check_one(hvd, fails, dtype, op, checks.large_count(dtype),
                   f"large.{dtype}.{names[op]}", reference_on_rank0_only=True)
    # Multi-dimensional, scalar, scale factors.
    _check_one(hvd, fails, np.int32, hvd.Sum, (3, 5, 7), "nd.int32")
    _check_one(hvd, fails, np.float64, hvd.Max, (2, 0, 4), "nd.empty")
    _check_one(hvd, fails, np.float64, hvd.Sum, (), "scalar")
    for dtype in FLOAT_DTYPES:
        for op in (hvd.Sum, hvd.Average):
            _check_one(hvd, fails, dtype, op, 257, f"scaled.{dtype}.{names[op]}",
                       prescale_factor=0.5, postscale_factor=3.0)
    _unnamed(hvd, fails)
    _async_many(hvd, fails)
    _grouped(hvd, fails)
    hvd.shutdown()
    return fails.raise_if_any(), fails.digests


def _unnamed(hvd, fails):
    """name=None: every rank generates the same automatic names in call order."""
    for i in range(3):
        x = np.full(10, hvd.rank() + i, dtype=np.int64)
        out = hvd.allreduce(x, op=hvd.Sum)
        expected = sum(r + i for r in range(hvd.size()))
        fails.expect(f"unnamed.{i}", np.all(out == expected), f"got {out[:3]}")
    avg = hvd.allreduce(np.full(4, float(hvd.rank())))  # default op is Average
    fails.check("default op", checks.mismatch(
        avg, np.full(4, (hvd.size() - 1) / 2.0), np.float64))


def _async_many(hvd, fails):
    """Many ops in flight at once (fusion territory); poll never blocks; results in any order."""
    cases = [(f"async.{dtype}.{k}", dtype) for dtype in ALL_DTYPES for k in range(3)]
    names = [name for name, _ in cases]
    arrays, handles = {}, {}
    for name, dtype in cases:
        op = hvd.Max if dtype == checks.BOOL else hvd.Sum
        arrays[name] = (checks.make_input(dtype, 333, hvd.rank(), name), dtype, op)
        handles[name] = hvd.allreduce_async(arrays[name][0], op=op, name=name)
    polled = [hvd.poll(handles[n]) for n in names]
    fails.expect("poll returns bool", all(isinstance(p, bool) for p in polled))
    for name in reversed(names):
        x, dtype, op = arrays[name]
        out = hvd.synchronize(handles[name])
        ref = checks.reference(checks.all_inputs(dtype, 333, hvd.size(), name), op)
        fails.check(name, checks.mismatch(out, ref, dtype, op))


def _grouped(hvd, fails):
    shapes = [(7,), (3, 4), (0,), (1000,), ()]
    dtypes = [np.float32, np.float16, np.float32, np.float64, np.float32]
    names = [f"grouped.{i}" for i in range(len(shapes))]
    xs = [checks.make_input(d, s, hvd.rank(), n) for d, s, n in zip(dtypes, shapes, names)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="grp")
    fails.expect("grouped returns list", isinstance(outs, list) and len(outs) == len(xs))
    for out, d, s, n in zip(outs, dtypes, shapes, names):
        ref = checks.reference(checks.all_inputs(d, s, hvd.size(), n), hvd.Sum)
        fails.check(n, checks.mismatch(out, ref, d, hvd.Sum))
    avg = hvd.grouped_allreduce([np.full(5, hvd.rank(), np.float64)] * 2)
    fails.expect("grouped default Average",
                 all(np.allclose(a, (hvd.size() - 1) / 2.0) for a in avg))


@checks.world_params()
def test_allreduce(np_, transport):
    res = run_ranks(allreduce_suite, np_, args=(transport,), timeout=240,
                    **checks.world_kwargs(np_, transport))
    assert all(r.value[0] > 300 for r in res)  # the checks actually ran
    checks.same_digests(res)


def two_hosts_suite():
    """2 fake hosts x 2 ranks: shm inside a host, tcp across (hierarchical paths)."""
    import engine_native as hvd
    hvd.init()
    fails = Failures()
    transports = hvd.metrics()["transports"]
    same = [r for r in range(4) if r // 2 == hvd.rank() // 2 and r != hvd.rank()]
    other = [r for r in range(4) if r // 2 != hvd.rank() // 2]
    fails.expect("shm within host", all(transports[r] == "shm" for r in same), str(transports))
    fails.expect("tcp across hosts", all(transports[r] == "tcp" for r in other), str(transports))
    fails.expect("topology", (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
                              hvd.cross_size()) == (hvd.rank() % 2, 2, hvd.rank() // 2, 2))
    names = checks.op_names()
    for dtype in (np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.float16)):
        for op in checks.ops_for(dtype):
            for count in (1, 1001, checks.large_count(dtype)):
                _check_one(hvd, fails, dtype, op, count, f"hier.{dtype}.{names[op]}.{count}",
                           reference_on_rank0_only=count > 1001)
    hvd.shutdown()
    return fails.raise_if_any(), fails.digests


def test_allreduce_two_hosts_two_ranks_each():
    res = run_ranks(two_hosts_suite, 4, hosts=["hostA", "hostA", "hostB", "hostB"],
                    timeout=240)
    checks.same_digests(res)


def misuse_suite():
    hvd = checks.init()
    fails = Failures()
    for bad, exc in ((np.zeros(3, dtype=np.complex64), TypeError),
                     (np.zeros(3, dtype=np.uint32), TypeError),
                     (np.zeros((4, 4), np.float32)[:, ::2], ValueError)):
        try:
            hvd.allreduce(bad, op=hvd.Sum, name="bad")
            fails.items.append(f"{bad.dtype}{bad.strides}: no error")
        except exc:
            pass
    out = hvd.allreduce(np.ones(3, np.float32), op=hvd.Sum, name="after-misuse")
    fails.expect("works after misuse", np.all(out == hvd.size()))
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_", [1, 3])
def test_local_misuse_raises_before_any_communication(np_):
    run_ranks(misuse_suite, np_, timeout=60)
