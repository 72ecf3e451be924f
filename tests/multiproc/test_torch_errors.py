"""Errors of engine_native.torch across ranks: mismatches raise on every rank (RuntimeError,
Horovod's HorovodInternalError), local misuse raises ValueError, and the job stays usable."""
import pytest
import torch

from .harness import run_ranks

pytestmark = pytest.mark.multiproc


def _hvd():
    import engine_native.torch as hvd
    hvd.init()
    return hvd


def _expect_everywhere(hvd, fn, exc=RuntimeError, match=None):
    """``fn`` must raise ``exc`` on this rank; returns the message."""
    try:
        fn()
    except exc as e:
        if match is not None:
            assert match in str(e), str(e)
        if exc is RuntimeError:
            assert isinstance(e, hvd.HorovodInternalError), type(e)
        return str(e)
    raise AssertionError('%s did not raise %s on rank %d' % (fn, exc.__name__, hvd.rank()))


def rank_mismatches():
    hvd = _hvd()
    r, n = hvd.rank(), hvd.size()
    last = n - 1
    # shape
    msg = _expect_everywhere(hvd, lambda: hvd.allreduce(torch.ones(2 + (r == last)),
                                                        name='shape'))
    assert 'shape' in msg.lower()
    # dtype
    dtype = torch.float64 if r == last else torch.float32
    msg = _expect_everywhere(hvd, lambda: hvd.allreduce(torch.ones(3, dtype=dtype), name='dt'))
    assert 'type' in msg.lower()
    # op
    op = hvd.Max if r == last else hvd.Sum
    _expect_everywhere(hvd, lambda: hvd.allreduce(torch.ones(3), name='op', op=op))
    # broadcast root
    root = 1 if r == last else 0
    msg = _expect_everywhere(hvd, lambda: hvd.broadcast(torch.ones(3), root, name='root'))
    assert 'root' in msg.lower()
    # allgather: trailing dims differ
    cols = 3 if r == last else 2
    _expect_everywhere(hvd, lambda: hvd.allgather(torch.ones(2, cols), name='ag'))
    # reducescatter shape
    _expect_everywhere(hvd, lambda: hvd.reducescatter(torch.ones(2 * n + (r == last), 2),
                                                      name='rs'))
    # the job is still usable afterwards
    assert float(hvd.allreduce(torch.ones(1), name='ok', op=hvd.Sum)) == n
    hvd.shutdown()


def rank_local_errors():
    hvd = _hvd()
    r, n = hvd.rank(), hvd.size()
    for checker in range(n):  # the others submit only after the barrier: still in flight
        name = 'dup.%d' % checker
        if r == checker:
            h = hvd.allreduce_async(torch.ones(4), name=name)
            with pytest.raises(ValueError):
                hvd.allreduce_async(torch.ones(4), name=name)
            hvd.barrier()
        else:
            hvd.barrier()
            h = hvd.allreduce_async(torch.ones(4), name=name)
        hvd.synchronize(h)
    with pytest.raises(ValueError):
        hvd.alltoall(torch.ones(n + 1), splits=[1] * (n + 1))  # wrong length
    with pytest.raises(ValueError):
        hvd.alltoall(torch.ones(n), splits=[2] * n)  # sum differs from rows
    with pytest.raises(ValueError):
        hvd.alltoall(torch.ones(n + 1, 2))  # uneven default split
    with pytest.raises(ValueError):
        hvd.broadcast(torch.ones(2), root_rank=n)  # root out of range
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(2, 2).t())
    ps = hvd.add_process_set([0, 1])
    if r >= 2:
        with pytest.raises(ValueError):
            hvd.allreduce(torch.ones(2), process_set=ps)
    else:
        assert float(hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps)) == 2
    assert float(hvd.allreduce(torch.ones(1), name='ok', op=hvd.Sum)) == n
    hvd.shutdown()


def rank_autograd_errors_propagate():
    hvd = _hvd()
    r = hvd.rank()
    x = torch.ones(3 + r, requires_grad=True)
    try:
        hvd.allreduce(x, name='grad.shape').sum().backward()
    except RuntimeError as e:
        assert isinstance(e, hvd.HorovodInternalError)
    else:
        raise AssertionError('no error')
    hvd.shutdown()


@pytest.mark.parametrize('np', [2, 3])
def test_mismatches_raise_on_every_rank(np):
    run_ranks(rank_mismatches, np, timeout=120)


@pytest.mark.parametrize('np', [3, 4])
def test_local_errors(np):
    run_ranks(rank_local_errors, np, timeout=120)


def test_autograd_errors():
    run_ranks(rank_autograd_errors_propagate, 2, timeout=60)
