"""engine_native.torch collectives on 2, 3 and 4 spawned ranks, checked against values each
rank computes itself from the same deterministic, rank-dependent inputs."""
import pytest
import torch

from .harness import run_ranks

pytestmark = pytest.mark.multiproc

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _hvd():
    import engine_native.torch as hvd
    hvd.init()
    return hvd


def _x(r, shape, dtype):
    """Rank r's input: small integers (exact in every dtype), depending on r and position."""
    n = 1
    for d in shape:
        n *= d
    base = (torch.arange(n, dtype=torch.int64) + 3 * r) % 5 + 1
    if dtype == torch.bool:
        return ((base + r) % 2 == 0).reshape(shape)
    return base.reshape(shape).to(dtype)


def _reduce(xs, op, hvd, dtype):
    if dtype == torch.bool:
        stack = torch.stack([x.to(torch.int64) for x in xs])
        fn = {hvd.Sum: stack.amax, hvd.Max: stack.amax, hvd.Min: stack.amin,
              hvd.Product: stack.amin}[op]
        return fn(0).to(torch.bool)
    stack = torch.stack([x.double() for x in xs])
    if op in (hvd.Sum, hvd.Average):
        out = stack.sum(0)
        if op == hvd.Average:
            out = out / len(xs)
            if not dtype.is_floating_point:
                out = out.trunc()
    elif op == hvd.Min:
        out = stack.amin(0)
    elif op == hvd.Max:
        out = stack.amax(0)
    else:
        out = stack.prod(0)
    return out.to(dtype)


def _close(a, b, dtype):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-6)
    if dtype.is_floating_point:
        assert torch.allclose(a.double(), b.double(), rtol=tol, atol=tol), (a, b)
    else:
        assert torch.equal(a, b), (a, b)


def rank_allreduce():
    hvd = _hvd()
    r, n = hvd.rank(), hvd.size()
    ops = [hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product]
    for dtype in DTYPES:
        for op in ops:
            if dtype == torch.bool and op == hvd.Average:
                continue
            for shape in [(0,), (1,), (3, 5), (2, 3, 4)]:
                xs = [_x(q, shape, dtype) for q in range(n)]
                if op == hvd.Product and dtype != torch.bool:  # keep products in range
                    xs = [(x.to(torch.int64) % 2 + 1).to(dtype) for x in xs]
                name = 'ar.%s.%d.%s' % (dtype, op, shape)
                _close(hvd.allreduce(xs[r], name=name, op=op), _reduce(xs, op, hvd, dtype), dtype)
    # scales, in place, async, grouped, deprecated average=
    x = _x(r, (4, 4), torch.float64)
    total = sum(_x(q, (4, 4), torch.float64) for q in range(n))
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    _close(out, total * 1.5, torch.float64)
    y = x.clone()
    assert hvd.allreduce_(y, op=hvd.Average, postscale_factor=2.0) is y
    _close(y, total / n * 2, torch.float64)
    handles = [hvd.allreduce_async(x * k, name='async.%d' % k) for k in range(5)]
    for k, h in enumerate(handles):
        _close(hvd.synchronize(h), total / n * k, torch.float64)
    outs = hvd.grouped_allreduce([x, x.float(), x.int()], name='grp', op=hvd.Sum)
    _close(outs[1], total.float(), torch.float32)
    _close(outs[2], total.int(), torch.int32)
    ys = [x.clone(), x.clone()]
    hvd.grouped_allreduce_(ys, average=False)
    _close(ys[0], total, torch.float64)
    out = hvd.allreduce(x, average=True, compression=hvd.Compression.fp16)
    assert out.dtype == torch.float64 and torch.allclose(out, total / n, atol=1e-2)
    hvd.shutdown()


def rank_allgather():
    hvd = _hvd()
    r, n = hvd.rank(), hvd.size()
    for dtype in DTYPES:
        for rows in (lambda q: q + 1, lambda q: 0 if q == 1 else 2, lambda q: 3):
            xs = [_x(q, (rows(q), 2, 3), dtype) for q in range(n)]
            _close(hvd.allgather(xs[r], name='ag.%s.%d' % (dtype, rows(0))), torch.cat(xs), dtype)
    a = [_x(q, (q + 1,), torch.float32) for q in range(n)]
    b = [_x(q, (2, q + 2), torch.int64).t().contiguous() for q in range(n)]
    outs = hvd.grouped_allgather([a[r], b[r]], name='gag')
    _close(outs[0], torch.cat(a), torch.float32)
    _close(outs[1], torch.cat(b), torch.int64)
    _close(hvd.synchronize(hvd.allgather_async(a[r])), torch.cat(a), torch.float32)
    hvd.shutdown()


def rank_broadcast():
    hvd = _hvd()
    r, n = hvd.rank(), hvd.size()
    for dtype in DTYPES:
        for root in range(n):
            xs = [_x(q, (3, 2), dtype) for q in range(n)]
            out = hvd.broadcast(xs[r], root_rank=root, name='bc.%s.%d' % (dtype, root))
            _close(out, xs[root], dtype)
            _close(xs[r], _x(r, (3, 2), dtype), dtype)  # input untouched
            y = xs[r].clone()
            assert hvd.broadcast_(y, root) is y
            _close(y, xs[root], dtype)
    hvd.shutdown()


def rank_alltoall():
    hvd = _hvd()
    r, n = hvd.rank(), hvd.size()

    def rows_to(src, dst):  # rows src sends to dst
        return (src + 2 * dst) % 3

    for dtype in DTYPES:
        # even split
        x = torch.stack([torch.full((2,), float(10 * r + d)) for d in range(n)]).to(dtype)
        out = hvd.alltoall(x, name='a2a.even.%s' % dtype)
        expected = torch.stack([torch.full((2,), float(10 * s + r)) for s in range(n)]).to(dtype)
        _close(out, expected, dtype)
        # uneven splits (some zero)
        splits = [rows_to(r, d) for d in range(n)]
        parts = [torch.full((rows_to(r, d), 3), float(r * 10 + d)) for d in range(n)]
        x = torch.cat(parts).to(dtype)
        out, received = hvd.alltoall(x, splits=splits, name='a2a.%s' % dtype)
        expected = torch.cat([torch.full((rows_to(s, r), 3), float(s * 10 + r))
                              for s in range(n)]).to(dtype)
        _close(out, expected, dtype)
        assert received.dtype == torch.int32
        assert received.tolist() == [rows_to(s, r) for s in range(n)]
    out, received = hvd.synchronize(hvd.alltoall_async(
        torch.zeros(n, 1), splits=torch.ones(n, dtype=torch.int32)))
    assert received.tolist() == [1] * n
    hvd.shutdown()


def rank_reducescatter():
    hvd = _hvd()
    r, n = hvd.rank(), hvd.size()
    for dtype in [d for d in DTYPES if d != torch.bool]:
        for rows in (n, 2 * n + 1, n - 1):
            xs = [_x(q, (rows, 3), dtype) for q in range(n)]
            for op in (hvd.Sum, hvd.Average):
                full = _reduce(xs, op, hvd, dtype)
                counts = [rows // n + (1 if q < rows % n else 0) for q in range(n)]
                start = sum(counts[:r])
                out = hvd.reducescatter(xs[r], op=op, name='rs.%s.%d.%d' % (dtype, rows, op))
                _close(out, full[start:start + counts[r]], dtype)
    x = [_x(q, (2 * n, 2), torch.float32) for q in range(n)]
    outs = hvd.grouped_reducescatter([x[r], x[r].double()], op=hvd.Sum, prescale_factor=2.0)
    full = 2 * sum(x)
    _close(outs[0], full[2 * r:2 * r + 2], torch.float32)
    _close(outs[1], full[2 * r:2 * r + 2].double(), torch.float64)
    hvd.shutdown()


def rank_poll_join_barrier():
    hvd = _hvd()
    r, n = hvd.rank(), hvd.size()
    big = torch.ones(8 << 20)  # 32 MiB
    if r == 0:
        h = hvd.allreduce_async(big, name='big', op=hvd.Sum)
        assert hvd.poll(h) is False  # the others have not even submitted it yet
        hvd.barrier()
    else:
        hvd.barrier()
        h = hvd.allreduce_async(big, name='big', op=hvd.Sum)
    out = hvd.synchronize(h)
    assert float(out[0]) == n and float(out[-1]) == n
    # join with uneven data: rank q runs q + 1 steps, then joins (zeros from joined ranks,
    # Average still divides by the full size).
    for step in range(r + 1):
        x = torch.full((3,), float(step + 1))
        out = hvd.allreduce(x, name='step.%d' % step)
        active = sum(1 for q in range(n) if q + 1 > step)
        assert torch.allclose(out, x * active / n), (step, out)
    assert hvd.join() == n - 1
    out = hvd.allreduce(torch.ones(2), name='after.join', op=hvd.Sum)
    assert torch.equal(out, torch.full((2,), float(n)))
    hvd.shutdown()


def rank_process_sets():
    import engine_native.torch as hvd
    evens_init = hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[evens_init])
    r, n = hvd.rank(), hvd.size()
    odd = hvd.add_process_set([q for q in range(n) if q % 2 == 1])
    for ps, members in ((evens_init, [0, 2]), (odd, [q for q in range(n) if q % 2 == 1])):
        assert ps.included() == (r in members)
        if r not in members:
            continue
        me = members.index(r)
        assert ps.size() == len(members) and ps.rank() == me
        x = _x(r, (3,), torch.float32)
        total = sum(_x(q, (3,), torch.float32) for q in members)
        _close(hvd.allreduce(x, op=hvd.Sum, process_set=ps), total, torch.float32)
        gathered = hvd.allgather(x.unsqueeze(0), process_set=ps)
        _close(gathered, torch.stack([_x(q, (3,), torch.float32) for q in members]),
               torch.float32)
        root = members[-1]
        _close(hvd.broadcast(x, root, process_set=ps), _x(root, (3,), torch.float32),
               torch.float32)
        y = torch.arange(len(members), dtype=torch.float32) + 10 * r
        out = hvd.alltoall(y, process_set=ps)
        assert out.tolist() == [float(me + 10 * q) for q in members]
        hvd.barrier(process_set=ps)
        assert hvd.broadcast_object({'r': r}, root_rank=root, process_set=ps) == {'r': root}
    assert hvd.remove_process_set(odd)
    hvd.shutdown()
    hvd.init()  # re-init in the same process
    assert hvd.size() == n and float(hvd.allreduce(torch.ones(1), op=hvd.Sum)) == n
    hvd.shutdown()


@pytest.mark.parametrize('np', [2, 3, 4])
@pytest.mark.parametrize('fn', [rank_allreduce, rank_allgather, rank_broadcast, rank_alltoall,
                                rank_reducescatter, rank_poll_join_barrier],
                         ids=lambda f: f.__name__)
def test_collectives(fn, np):
    run_ranks(fn, np, timeout=240)


@pytest.mark.parametrize('np', [3, 4])
def test_process_sets(np):
    run_ranks(rank_process_sets, np, timeout=120)
