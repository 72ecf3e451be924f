"""Gradients through every engine_native.torch collective on 2 and 3 ranks, checked against
Horovod's backward rules evaluated locally from every rank's (deterministic) upstream
gradient."""
import pytest
import torch

from .harness import run_ranks

pytestmark = pytest.mark.multiproc


def _hvd():
    import engine_native.torch as hvd
    hvd.init()
    return hvd


def _g(q, shape, salt=0):
    """Rank q's upstream gradient."""
    gen = torch.Generator().manual_seed(1000 * salt + q)
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def _grad(fn, x, g):
    x = x.detach().clone().requires_grad_()
    out = fn(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    out.backward(g)
    return x.grad


def _close(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, rtol=1e-10, atol=1e-10), (a, b)


def rank_gradients():
    hvd = _hvd()
    r, n = hvd.rank(), hvd.size()
    x = torch.randn(2 * n, 3, dtype=torch.float64)

    # allreduce: allreduce of the gradient with the same op and scales
    gs = [_g(q, x.shape, 1) for q in range(n)]
    grad = _grad(lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5,
                                         postscale_factor=3.0), x, gs[r])
    _close(grad, 1.5 * sum(gs))
    grad = _grad(lambda t: hvd.allreduce(t, name='avg'), x, gs[r])
    _close(grad, sum(gs) / n)
    grad = _grad(lambda t: hvd.allreduce(t, average=False), x, gs[r])
    _close(grad, sum(gs))

    # grouped allreduce
    grads = []
    xs = [x.detach().clone().requires_grad_(), x[:1].detach().clone().requires_grad_()]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum)
    torch.autograd.backward(outs, [gs[r], gs[r][:1]])
    grads = [t.grad for t in xs]
    _close(grads[0], sum(gs))
    _close(grads[1], sum(gs)[:1])

    # allgather (uneven rows): average-allreduce, then this rank's rows
    rows = [q + 1 for q in range(n)]
    xr = torch.randn(rows[r], 3, dtype=torch.float64)
    gs = [_g(q, (sum(rows), 3), 2) for q in range(n)]
    grad = _grad(lambda t: hvd.allgather(t), xr, gs[r])
    start = sum(rows[:r])
    _close(grad, (sum(gs) / n)[start:start + rows[r]])
    grad = _grad(lambda t: hvd.grouped_allgather([t])[0], xr, gs[r])
    _close(grad, (sum(gs) / n)[start:start + rows[r]])

    # broadcast: average-allreduce on the root, zeros elsewhere
    for root in range(n):
        gs = [_g(q, x.shape, 3 + root) for q in range(n)]
        grad = _grad(lambda t: hvd.broadcast(t, root), x, gs[r])
        _close(grad, sum(gs) / n if r == root else torch.zeros_like(x))

    # alltoall: the gradient goes back along the received splits (exact transpose)
    def rows_to(src, dst):
        return (src + dst) % 3

    splits = [rows_to(r, d) for d in range(n)]
    xa = torch.randn(sum(splits), 2, dtype=torch.float64)
    recv = [rows_to(s, r) for s in range(n)]
    gs = [_g(q, (sum(rows_to(s, q) for s in range(n)), 2), 4) for q in range(n)]
    grad = _grad(lambda t: hvd.alltoall(t, splits=splits), xa, gs[r])
    assert sum(recv) == gs[r].shape[0]
    # rows of gs[d] that came from rank r: after those from ranks < r
    expected = torch.cat([gs[d][sum(rows_to(s, d) for s in range(r)):][:rows_to(r, d)]
                          for d in range(n)])
    _close(grad, expected)
    grad = _grad(lambda t: hvd.alltoall(t), x, _g(r, x.shape, 5))
    even = [_g(q, x.shape, 5) for q in range(n)]
    _close(grad, torch.cat([even[d][2 * r:2 * r + 2] for d in range(n)]))

    # reducescatter: allgather of the gradient (times size for Sum, times the scales)
    counts = [2] * n
    gs = [_g(q, (counts[q], 3), 6) for q in range(n)]
    gathered = torch.cat(gs)
    grad = _grad(lambda t: hvd.reducescatter(t, op=hvd.Sum), x, gs[r])
    _close(grad, gathered * n)
    grad = _grad(lambda t: hvd.reducescatter(t, op=hvd.Average, prescale_factor=2.0), x, gs[r])
    _close(grad, gathered * 2.0)
    grad = _grad(lambda t: hvd.grouped_reducescatter([t], op=hvd.Sum)[0], x, gs[r])
    _close(grad, gathered * n)
    hvd.shutdown()


def rank_process_set_gradients():
    hvd = _hvd()
    r = hvd.rank()
    ps = hvd.add_process_set([0, 2])
    if r in (0, 2):
        x = torch.randn(2, 2, dtype=torch.float64)
        gs = {q: _g(q, (2, 2), 7) for q in (0, 2)}
        grad = _grad(lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=ps), x, gs[r])
        _close(grad, gs[0] + gs[2])
        grad = _grad(lambda t: hvd.allgather(t, process_set=ps), x,
                     _g(r, (4, 2), 8))
        me = ps.rank()
        _close(grad, ((_g(0, (4, 2), 8) + _g(2, (4, 2), 8)) / 2)[2 * me:2 * me + 2])
    hvd.barrier()
    hvd.shutdown()


@pytest.mark.parametrize('np', [2, 3])
def test_gradients(np):
    run_ranks(rank_gradients, np, timeout=120)


def test_process_set_gradients():
    run_ranks(rank_process_set_gradients, 3, timeout=120)
