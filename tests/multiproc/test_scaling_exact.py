"""Scale factors round exactly as Horovod's (issue #18): bit-identical results against a NumPy
model of Horovod 0.28.1's CPU ScaleBuffer (checks.horovod_scale), for prescale, postscale and
Average (sum, then postscale / size) of allreduce, and for reducescatter, whose prescale
multiplies each rank's input before the sum.

Inputs are chosen so that the sum itself is exact in every dtype (or, after a prescale, the
same on every rank, so that any reduction order gives the same bits); what remains to round is
the scaling, and that is compared bit for bit.
"""
import numpy as np
import pytest
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import checks, device_ops
from multiproc.checks import FLOAT_DTYPES, INT_DTYPES, Failures
from multiproc.harness import run_ranks

# Factors whose float32 rounding differs from double's for some of the inputs (k/8, |k| <= 8),
# one that makes half-type subnormals, and Horovod's own Average factor shapes.
FACTORS = (0.1, 1.0 / 3.0, 3.7, -2.5, 1e-3, 6e-8)
INT_FACTORS = (0.5, 2.5, -1.5, 1.0 / 3.0)
COUNTS = (1, 1001)
WORLDS = [(n, t) for t in ("shm", "tcp") for n in (1, 2, 3)]
fake_cuda = _fake_cuda  # the session fixture, under its name


def _sum_of_copies(p, n):
    """n identical addends: every summation order gives fl(n * p) (2p is exact)."""
    if p.dtype == np.float64:
        return np.float64(n) * p
    return (np.float64(n) * p.astype(np.float64)).astype(p.dtype)


def _exact_sum(inputs):
    """Sum of the k/8 inputs: exact in float64 and representable in every dtype here."""
    wide = np.int64 if inputs[0].dtype.kind in "iu" else np.float64
    total = inputs[0].astype(wide)
    for x in inputs[1:]:
        total = total + x.astype(wide)
    return total.astype(inputs[0].dtype)


def _postscale_cases(hvd, fails, dtype, n):
    """Rank-dependent inputs summing exactly: only the postscale (or 1/size) rounds."""
    for count in COUNTS:
        for i, factor in enumerate(FACTORS):
            name = f"post.{dtype}.{count}.{i}"
            x = checks.make_input(dtype, count, hvd.rank(), name)
            total = _exact_sum(checks.all_inputs(dtype, count, n, name))
            out = hvd.allreduce(x, op=hvd.Sum, name=name, postscale_factor=factor)
            fails.check(name, checks.exact_mismatch(out, checks.horovod_scale(total, factor)))
            # Average: Horovod divides the postscale by the set size in double, then scales.
            avg = hvd.allreduce(x, op=hvd.Average, name=name + ".avg", postscale_factor=factor)
            want = checks.horovod_scale(total, factor / n)
            fails.check(name + ".avg", checks.exact_mismatch(avg, want))


def _prescale_cases(hvd, fails, dtype, n):
    """The same input on every rank: the prescaled addends are equal, so the sum's rounding
    does not depend on the algorithm's order, and the prescale's rounding shows."""
    for count in COUNTS:
        for i, factor in enumerate(FACTORS):
            name = f"pre.{dtype}.{count}.{i}"
            x = checks.make_input(dtype, count, 0, name)
            p = checks.horovod_scale(x, factor)
            out = hvd.allreduce(x, op=hvd.Sum, name=name, prescale_factor=factor)
            fails.check(name, checks.exact_mismatch(out, _sum_of_copies(p, n)))
            both = hvd.allreduce(x, op=hvd.Average, name=name + ".avg", prescale_factor=factor,
                                 postscale_factor=3.0)
            want = checks.horovod_scale(_sum_of_copies(p, n), 3.0 / n)
            fails.check(name + ".avg", checks.exact_mismatch(both, want))


def _integer_cases(hvd, fails, dtype, n):
    """Integers: each factor multiplies in double and truncates, before (prescale) or after
    (postscale, Average's 1/size) the sum."""
    for i, factor in enumerate(INT_FACTORS):
        if factor < 0 and dtype.kind == "u":
            continue  # out of range: undefined in Horovod's cast (saturated here)
        name = f"int.{dtype}.{i}"
        x = checks.make_input(dtype, 1001, hvd.rank(), name)
        inputs = checks.all_inputs(dtype, 1001, n, name)
        pre = _exact_sum([checks.horovod_scale(v, factor) for v in inputs])
        out = hvd.allreduce(x, op=hvd.Sum, name=name, prescale_factor=factor)
        fails.check(name, checks.exact_mismatch(out, pre))
        avg = hvd.allreduce(x, op=hvd.Average, name=name + ".avg", postscale_factor=factor)
        want = checks.horovod_scale(_exact_sum(inputs), factor / n)
        fails.check(name + ".avg", checks.exact_mismatch(avg, want))


def _fused_and_large(hvd, fails, n):
    """A fused batch (grouped) and a tensor above a pipeline chunk scale like a lone one."""
    names = [f"fused.{i}" for i in range(4)]
    xs = [checks.make_input(np.float32, 97 + i, hvd.rank(), nm) for i, nm in enumerate(names)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Average, name="fused", postscale_factor=0.1)
    for nm, out, i in zip(names, outs, range(4)):
        total = _exact_sum(checks.all_inputs(np.float32, 97 + i, n, nm))
        fails.check(nm, checks.exact_mismatch(out, checks.horovod_scale(total, 0.1 / n)))
    count = checks.large_count(np.dtype(np.float32))
    x = checks.make_input(np.float32, count, hvd.rank(), "large")
    out = hvd.allreduce(x, op=hvd.Average, name="large", postscale_factor=0.1)
    if hvd.rank() == 0:
        total = _exact_sum(checks.all_inputs(np.float32, count, n, "large"))
        fails.check("large", checks.exact_mismatch(out, checks.horovod_scale(total, 0.1 / n)))
    fails.digest("large", out)


def _rows(dim0, n, r):
    base, extra = divmod(dim0, n)
    start = r * base + min(r, extra)
    return start, start + base + (1 if r < extra else 0)


def _reducescatter_cases(hvd, fails, n):
    """Prescale before the sum, on a copy; postscale (and 1/size) after it. Odd integers under
    a prescale of 0.5 tell the two orders apart: trunc(0.5 * 3) + ... != trunc(0.5 * sum)."""
    me = hvd.rank()
    dim0 = 2 * n + 1
    lo, hi = _rows(dim0, n, me)
    odd = np.full((dim0, 3), 2 * me + 3, dtype=np.int32)
    before = odd.copy()
    out = hvd.reducescatter(odd, op=hvd.Sum, name="rs.odd", prescale_factor=0.5)
    want = np.full((hi - lo, 3), sum((2 * r + 3) // 2 for r in range(n)), dtype=np.int32)
    fails.check("rs.odd", checks.exact_mismatch(out, want))
    fails.expect("rs.odd input untouched", np.array_equal(odd, before))
    for dtype in INT_DTYPES + FLOAT_DTYPES:
        for op in (hvd.Sum, hvd.Average):
            name = f"rs.{dtype}.{op}"
            x = checks.make_input(dtype, (dim0, 5), me, name)
            before = x.copy()
            out = hvd.reducescatter(x, op=op, name=name, prescale_factor=0.5,
                                    postscale_factor=3.0)
            inputs = checks.all_inputs(dtype, (dim0, 5), n, name, rows=(lo, hi))
            total = _exact_sum([checks.horovod_scale(v, 0.5) for v in inputs])
            post = 3.0 / n if op == hvd.Average else 3.0
            fails.check(name, checks.exact_mismatch(out, checks.horovod_scale(total, post)))
            fails.expect(f"{name} input untouched", np.array_equal(x, before))


def scaling_suite(transport):
    hvd = checks.init(transport)
    fails = Failures()
    n = hvd.size()
    for dtype in FLOAT_DTYPES:
        _postscale_cases(hvd, fails, dtype, n)
        _prescale_cases(hvd, fails, dtype, n)
    for dtype in INT_DTYPES:
        _integer_cases(hvd, fails, dtype, n)
    _fused_and_large(hvd, fails, n)
    _reducescatter_cases(hvd, fails, n)
    hvd.shutdown()
    return fails.raise_if_any(), fails.digests


@pytest.mark.parametrize("np_, transport", WORLDS, ids=[f"{t}-np{n}" for n, t in WORLDS])
def test_scaling_is_bit_exact(np_, transport):
    res = run_ranks(scaling_suite, np_, args=(transport,), timeout=240,
                    **checks.world_kwargs(np_, transport))
    assert all(r.value[0] > 250 for r in res)
    checks.same_digests(res)


def device_suite(staged):
    """CUDA tensors (fake CUDA, tests/fakecuda) on the staged path through host memory scale
    as host tensors do, bit for bit. Where every rank has a GPU of its own, scaled integers
    are staged too (NCCL cannot scale them); scaled floats ride on NCCL's pre-multiplied sum
    there (Note [Scaling without kernels]), which rounds otherwise, so they are left out."""
    hvd = device_ops.init()
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    dim0 = 2 * n + 1
    lo, hi = _rows(dim0, n, me)
    odd = np.full((dim0, 2), 2 * me + 3, dtype=np.int32)
    got = device_ops.reducescatter(odd, hvd.Sum, "dev.rs.odd", pre=0.5)
    want = np.full((hi - lo, 2), sum((2 * r + 3) // 2 for r in range(n)), dtype=np.int32)
    fails.check("dev.rs.odd", checks.exact_mismatch(got, want))
    dtypes = [np.dtype(np.int64), np.dtype(np.int8)]
    if staged:
        dtypes += [np.dtype(np.float32), checks.BFLOAT16, np.dtype(np.float16)]
    for dtype in dtypes:
        pre = 0.5 if dtype.kind == "f" or dtype == checks.BFLOAT16 else 1.0 / 3.0
        name = f"dev.rs.{dtype}"
        x = checks.make_input(dtype, (dim0, 3), me, name)
        got = device_ops.reducescatter(x, hvd.Average, name, pre=pre, post=0.1)
        inputs = checks.all_inputs(dtype, (dim0, 3), n, name, rows=(lo, hi))
        total = _exact_sum([checks.horovod_scale(v, pre) for v in inputs])
        fails.check(name, checks.exact_mismatch(got, checks.horovod_scale(total, 0.1 / n)))
        name = f"dev.ar.{dtype}"
        x = checks.make_input(dtype, 1001, me, name)
        got = device_ops.allreduce(x, hvd.Average, name, post=0.1)
        total = _exact_sum(checks.all_inputs(dtype, 1001, n, name))
        fails.check(name, checks.exact_mismatch(got, checks.horovod_scale(total, 0.1 / n)))
    fails.raise_if_any()
    return device_ops.gpu_path()


@pytest.mark.parametrize("shared, path", [(True, "staged"), (False, "nccl")],
                         ids=["shared-gpu", "own-gpu"])
def test_device_scaling_is_bit_exact(fake_cuda, shared, path):
    results = run_ranks(device_suite, 3, args=(shared,), timeout=120,
                        **device_ops.rank_envs(fake_cuda, 3, shared))
    assert [r.value for r in results] == [path] * 3


def test_reference_models_horovod_rounding():
    """The model itself: float32 scaling rounds differently from double's, and half types go
    through float32 (so the reference can tell the two implementations apart)."""
    x = np.arange(-8, 9, dtype=np.float32) / np.float32(8)
    in_float = checks.horovod_scale(x, 1.0 / 3.0)
    in_double = (x.astype(np.float64) / 3.0).astype(np.float32)
    assert not np.array_equal(in_float.view(np.uint32), in_double.view(np.uint32))
    assert checks.horovod_scale(np.array([7], np.int32), -0.5)[0] == -3  # truncation
    h = checks.horovod_scale(np.array([1.0], np.float16), 6e-8)
    assert h.dtype == np.float16 and h[0] == np.float16(np.float32(6e-8))
