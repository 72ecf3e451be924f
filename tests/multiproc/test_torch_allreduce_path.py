"""engine_native.torch's allreduce on its C path (bindings/torch_api.cc) on spawned ranks.

What it takes (exact CPU Tensors and Parameters, strided and contiguous, a supported dtype) is
checked to run there (``_core.torch_kept``); everything else must still reach the checked
Python path and behave as before: Horovod's errors, or the right result. The handle contract
(poll, synchronize once, unknown afterwards), the shared noname counter and the tensors' life
(kept until synchronize, kept across a Ctrl-C, released by a failure and by shutdown) are
checked with real tensors and weak references.
"""
import gc
import os
import signal
import time
import weakref

import pytest
import torch

from .harness import run_ranks

pytestmark = pytest.mark.multiproc


def _raises(exc_type, fn, text):
    try:
        fn()
    except exc_type as exc:
        assert text in str(exc), str(exc)
        return
    raise AssertionError('%s did not raise %s' % (fn, exc_type.__name__))


class _Tagged(torch.Tensor):
    """A tensor subclass: __torch_function__ may change any attribute, so C declines it."""


def calls_and_declines():
    import engine_native.torch as hvd
    from engine_native import _core
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    x = torch.arange(6, dtype=torch.float32) + me
    want = torch.arange(6, dtype=torch.float32) * n + n * (n - 1) / 2

    # Out of place: a fresh contiguous tensor; the handle is the C path's until synchronize.
    h = hvd.allreduce_async(x, op=hvd.Sum, name='oop')
    assert _core.torch_kept(h)
    out = hvd.synchronize(h)
    assert torch.equal(out, want) and out.data_ptr() != x.data_ptr(), out
    assert not _core.torch_kept(h) and hvd.synchronize(h) is None
    _raises(ValueError, lambda: hvd.poll(h), 'not created or has been cleared')

    # In place returns the tensor itself; poll() turns True and synchronize() then returns.
    y = x.clone()
    h = hvd.allreduce_async_(y, op=hvd.Sum, name='ip')
    deadline = time.monotonic() + 30
    while not hvd.poll(h):
        assert time.monotonic() < deadline, 'poll() never turned True'
        time.sleep(0.001)
    assert hvd.synchronize(h) is y and torch.equal(y, want)

    # Average (the default), scale factors, 2-D, a Parameter, every dtype family.
    assert torch.allclose(hvd.allreduce(x, name='avg'), want / n)
    scaled = hvd.allreduce(x, op=hvd.Sum, name='sc', prescale_factor=2, postscale_factor=0.25)
    assert torch.allclose(scaled, want / 2)
    grid = torch.full((3, 4), me + 1.0, dtype=torch.float64)
    h = hvd.allreduce_async_(grid, op=hvd.Sum, name='grid')
    assert _core.torch_kept(h) and hvd.synchronize(h) is grid
    assert bool((grid == n * (n + 1) / 2).all()) and grid.shape == (3, 4)
    p = torch.nn.Parameter(torch.full((2, 2), me + 1.0))
    h = hvd.allreduce_async_(p, op=hvd.Max, name='param')
    assert _core.torch_kept(h) and hvd.synchronize(h) is p and bool((p == n).all())
    for dtype in (torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
                  torch.int64):
        t = torch.full((5,), me + 1, dtype=dtype)
        h = hvd.allreduce_async(t, op=hvd.Sum, name='dt.%s' % dtype)
        assert _core.torch_kept(h), dtype
        r = hvd.synchronize(h)
        assert r.dtype == dtype and bool((r.float() == n * (n + 1) / 2).all()), (dtype, r)
    empty = hvd.allreduce(torch.empty(0, 3), op=hvd.Sum, name='empty')
    assert empty.shape == (0, 3)

    # Declined, so the checked path decides: Horovod's errors, or the right result.
    strided = torch.arange(12.0).reshape(3, 4)[:, 1]
    _raises(ValueError, lambda: hvd.allreduce_async(strided, name='strided'), 'contiguous')
    _raises(ValueError, lambda: hvd.allreduce(torch.ones(3).to_sparse(), name='sparse'),
            'layout')
    _raises(ValueError, lambda: hvd.allreduce(torch.ones(3, dtype=torch.complex64), name='c'),
            'not supported')
    _raises(TypeError, lambda: hvd.allreduce_async([1.0, 2.0], name='list'), 'torch.Tensor')
    _raises(ValueError, lambda: hvd.allreduce(x, op=99, name='badop'), 'unknown reduce op')
    tagged = x.as_subclass(_Tagged)
    h = hvd.allreduce_async(tagged, op=hvd.Sum, name='tagged')
    assert not _core.torch_kept(h) and torch.equal(hvd.synchronize(h), want)
    h = hvd.allreduce_async(x, op=hvd.Sum, name=7)  # Horovod formats any name with %s
    assert not _core.torch_kept(h) and torch.equal(hvd.synchronize(h), want)
    h = hvd.allreduce_async(x, op=hvd.Sum, prescale_factor=torch.tensor(1.0), name='tscale')
    assert torch.equal(hvd.synchronize(h), want)

    # One noname counter for both paths: unnamed ops interleaved across paths never collide.
    handles = [hvd.allreduce_async(x, op=hvd.Sum), hvd.allreduce_async(tagged, op=hvd.Sum),
               hvd.allreduce_async(x, op=hvd.Sum)]
    assert [_core.torch_kept(h) for h in handles] == [True, False, True]
    assert all(torch.equal(hvd.synchronize(h), want) for h in handles)

    # A name in flight twice: the core's ValueError, nothing left behind. Rank 0 only, and
    # before the other ranks submit it (after the barrier), so it is surely still in flight.
    if me == 0:
        h = hvd.allreduce_async(x, op=hvd.Sum, name='twice')
        _raises(ValueError, lambda: hvd.allreduce_async(x, op=hvd.Sum, name='twice'),
                'already in flight')
        hvd.barrier()
        assert torch.equal(hvd.synchronize(h), want)
    else:
        hvd.barrier()
        assert torch.equal(hvd.allreduce(x, op=hvd.Sum, name='twice'), want)
    hvd.shutdown()


def test_torch_allreduce_c_path_calls_and_declines():
    run_ranks(calls_and_declines, 2, timeout=120)


def _interrupt_after(seconds):
    def handler(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def tensor_lifetime(flag_path):
    import engine_native.torch as hvd
    from engine_native import _core
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    total = n * (n + 1) / 2

    # Kept from enqueue to synchronize, even with no reference left in the caller.
    t = torch.full((4096,), me + 1.0)
    alive = weakref.ref(t)
    h = hvd.allreduce_async(t, op=hvd.Sum, name='dropped')
    del t
    gc.collect()
    assert alive() is not None, 'input freed while the core may still read it'
    assert bool((hvd.synchronize(h) == total).all())
    gc.collect()
    assert alive() is None, 'input still held after synchronize'

    # A failed op (shapes differ across ranks) raises and lets go of its tensors.
    t = torch.ones(3 + me)
    alive = weakref.ref(t)
    h = hvd.allreduce_async_(t, name='mismatch')
    _raises(hvd.HorovodInternalError, lambda: hvd.synchronize(h), 'shape')
    assert not _core.torch_kept(h)
    del t
    gc.collect()
    assert alive() is None, 'tensor of a failed op still held'

    # Ctrl-C while waiting: the op is still pending, so its tensor stays kept and the same
    # handle finishes once the other rank submits (it waits for rank 0's interrupt).
    t = torch.full((8,), me + 1.0)
    alive = weakref.ref(t)
    if me == 0:
        h = hvd.allreduce_async_(t, op=hvd.Sum, name='late')
        _interrupt_after(0.2)
        try:
            hvd.synchronize(h)
            raise AssertionError('synchronize returned before the other rank submitted')
        except KeyboardInterrupt:
            pass
        open(flag_path, 'w').close()
        del t
        gc.collect()
        assert _core.torch_kept(h) and alive() is not None, 'pending tensor let go'
        out = hvd.synchronize(h)
        assert out is alive() and bool((out == total).all()), out
        del out
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(flag_path):
            assert time.monotonic() < deadline, 'rank 0 never reported its interrupt'
            time.sleep(0.01)
        assert bool((hvd.allreduce_(t, op=hvd.Sum, name='late') == total).all())
        del t
    gc.collect()
    assert alive() is None

    # shutdown() lets go of tensors never synchronized; a handle from before is then unknown.
    t = torch.full((16,), me + 1.0)
    alive = weakref.ref(t)
    h = hvd.allreduce_async(t, op=hvd.Sum, name='unsynced')
    del t
    hvd.shutdown()
    gc.collect()
    assert alive() is None, 'tensor of an unsynchronized op still held after shutdown()'
    hvd.init()
    assert hvd.synchronize(h) is None
    assert float(hvd.allreduce(torch.ones(1), op=hvd.Sum, name='again')) == n
    hvd.shutdown()


def test_torch_allreduce_c_path_keeps_tensors_alive(tmp_path):
    run_ranks(tensor_lifetime, 2, timeout=120, args=(str(tmp_path / 'interrupted'),))
