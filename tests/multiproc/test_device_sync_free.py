"""No device-wide synchronisation on the op path, on the fake CUDA runtime (issue #39 item 3):
after warm-up, every collective's output path and a SyncBatchNorm training step make no call
that waits for the device or allocates device memory (cudaMalloc, cudaFree, cudaFreeHost,
cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize); a block freed while a
stream still reads it is freed in that stream's order (Note [Ordered device memory] in
transport/nccl/ordered_memory.cc); without the stream-ordered allocator the stated fallback
(cudaMalloc/cudaFree) still gives right results.
"""
import collections
import ctypes

import numpy as np
import pytest
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import device_ops
from multiproc.harness import run_ranks

fake_cuda = _fake_cuda  # the session fixture, under its name

# Calls that wait for the device (or, for cudaMalloc/cudaMallocHost, may: CUDA documents both
# as able to synchronise implicitly).
SYNCING = ("cudaMalloc", "cudaFree", "cudaMallocHost", "cudaFreeHost", "cudaDeviceSynchronize",
           "cudaStreamSynchronize", "cudaEventSynchronize")


def _syncs(f):
    return {name: f.calls(name) for name in SYNCING}


def _delta(before, after):
    return {k: after[k] - before[k] for k in before if after[k] != before[k]}


def _per_round(f, step, rounds=3):
    """Syncing calls made by two warm-up calls of step(i) (first use of each size), and then
    per call of step."""
    start = _syncs(f)
    step(0)
    step(1)
    warm = _syncs(f)
    for i in range(rounds):
        step(i + 2)
    steady = {k: n / rounds for k, n in _delta(warm, _syncs(f)).items()}
    return _delta(start, warm), steady


def _collective_steps(hvd):
    from engine_native import _core
    r, n = hvd.rank(), hvd.size()

    def allreduce(i):
        got = device_ops.allreduce(np.full(64, r + i, np.float32), hvd.Sum, "ar")
        assert (got == sum(q + i for q in range(n))).all(), got

    def fused(i):  # two at once, packed into the fusion buffer, which warm-up grows
        xs = [np.full((32 + k) * (64 if i == 1 else 1), r + i + k, np.float32)
              for k in range(2)]
        outs = [np.empty_like(x) for x in xs]
        handles = [device_ops.enqueue(_core.ALLREDUCE, x, o, f"fused.{k}")
                   for k, (x, o) in enumerate(zip(xs, outs))]
        for h in handles:
            _core.wait(h)
        for k, o in enumerate(outs):
            assert (o == sum(q + i + k for q in range(n))).all(), o

    def allgather(i):
        got = device_ops.allgather(np.full((2, 3), r + i, np.float32), "ag")
        assert (got[2 * n - 2:] == n - 1 + i).all(), got

    def broadcast(i):
        got = device_ops.broadcast(np.full(16, r + i, np.float32), 0, "bc")
        assert (got == i).all(), got

    def alltoall(i):
        got, received = device_ops.alltoall(np.full(2 * n, r + i, np.float32), [2] * n, "a2a")
        assert received == [2] * n and (got == np.repeat(np.arange(n) + i, 2)).all(), got

    def reducescatter(i):
        got = device_ops.reducescatter(np.full(4 * n, r + i, np.float32), hvd.Sum, "rs")
        assert (got == sum(q + i for q in range(n))).all(), got

    return dict(allreduce=allreduce, fused=fused, allgather=allgather, broadcast=broadcast,
                alltoall=alltoall, reducescatter=reducescatter)


def collective_syncs():
    hvd = device_ops.init()
    f = device_ops.fakes()
    counts = {name: _per_round(f, step) for name, step in _collective_steps(hvd).items()}
    return counts, device_ops.gpu_path()


def sync_batch_norm_syncs(layers=3):
    """Forward and backward of `layers` SyncBatchNorm layers (torch on the fake CUDA)."""
    import torch
    from multiproc import torch_cuda_fake as fake
    hvd = fake.start()
    f = device_ops.fakes()
    model = torch.nn.Sequential(*[hvd.SyncBatchNorm(4).double() for _ in range(layers)])
    x = torch.randn(5, 4, 3, generator=torch.Generator().manual_seed(hvd.rank()),
                    dtype=torch.float64, requires_grad=True)

    def step(i):
        with fake.on_device(2 * layers):
            model(x * (i + 1)).square().sum().backward()
        assert torch.isfinite(x.grad).all()
    counts = _per_round(f, step)
    hvd.shutdown()
    return counts


@pytest.mark.parametrize("shared", [False, True], ids=["nccl", "staged"])
def test_collectives_make_no_syncing_call_per_op(fake_cuda, shared):
    for r in run_ranks(collective_syncs, 2, timeout=60,
                       **device_ops.rank_envs(fake_cuda, 2, shared)):
        counts, path = r.value
        assert path == ("staged" if shared else "nccl"), path
        assert all(not steady for _, steady in counts.values()), counts
        # Even warming up, no device memory is allocated or freed synchronously; the staged
        # path allocates its pinned host buffer once.
        warm = collections.Counter()
        for calls, _ in counts.values():
            warm.update(calls)
        assert dict(warm) == ({"cudaMallocHost": 1} if shared else {}), counts


def test_sync_batch_norm_makes_no_syncing_call_per_step(fake_cuda):
    for r in run_ranks(sync_batch_norm_syncs, 2, timeout=60,
                       **device_ops.rank_envs(fake_cuda, 2, False)):
        assert r.value == ({}, {}), r.value


def evicted_block_outlives_its_last_user():
    """With no cache, output #1's block is freed once dropped: while a consumer stream still
    has a read of it queued behind a blocked "kernel", the next op frees it in order after
    that read, never before (the fake's freed memory reads as 0xDB)."""
    from engine_native import _core
    hvd = device_ops.init()
    f = device_ops.fakes()
    x = np.full((2, 4), hvd.rank() + 1, np.float32)
    buffer, shape = _core.wait(device_ops.enqueue(_core.ALLGATHER, x, None, "first"))
    consumer = f.stream()
    token = f.cuda.fakeCudaLaunchBlocker(consumer)
    seen = (ctypes.c_uint8 * buffer.nbytes)()
    f.check(f.cuda.cudaMemcpyAsync(ctypes.addressof(seen), buffer.ptr, buffer.nbytes, 4,
                                   consumer))
    buffer.release_stream = consumer
    before = _syncs(f), f.calls("cudaFreeAsync")
    del buffer  # evicted at once: freed by the next op, after the queued read
    y = 10 * x  # outlives the op
    handle, pending = device_ops.held_for_a_second(
        hvd, "ALLGATHER", lambda: device_ops.enqueue(_core.ALLGATHER, y, None, "second"))
    f.check(f.cuda.fakeCudaReleaseBlocker(token))
    second, _ = _core.wait(handle)
    f.check(f.cuda.cudaStreamSynchronize(consumer))
    f.check(f.cuda.cudaStreamDestroy(consumer))
    read = np.frombuffer(bytes(seen), np.float32).reshape(shape).tolist()
    after = device_ops.device_array(second, shape, np.float32).tolist()
    counts = _delta(before[0], _syncs(f)), f.calls("cudaFreeAsync") - before[1]
    return pending, read, after, counts


def test_an_evicted_block_is_freed_after_its_last_user(fake_cuda):
    kw = device_ops.rank_envs(fake_cuda, 2, False,
                              extra={"HVD_TEST_DEVICE_OUTPUT_CACHE_BYTES": "0"})
    for r in run_ranks(evicted_block_outlives_its_last_user, 2, timeout=60, **kw):
        pending, read, after, (syncs, ordered_frees) = r.value
        assert read == [[1.0] * 4] * 2 + [[2.0] * 4] * 2, read  # output #1, not freed memory
        assert after == [[10.0] * 4] * 2 + [[20.0] * 4] * 2, after
        assert pending, "the next op did not wait for the evicted block's last user"
        # the consumer's cudaStreamSynchronize is the test's own
        assert ordered_frees >= 1 and syncs == {"cudaStreamSynchronize": 1}, r.value


def allgathers_without_ordered_allocator():
    hvd = device_ops.init()
    f = device_ops.fakes()
    device_ops.allgather(np.ones(8, np.float32), "warm")
    before = _syncs(f), f.calls("cudaMallocAsync"), f.calls("cudaFreeAsync")
    for i in range(3):
        got = device_ops.allgather(np.full(8, hvd.rank() + i, np.float32), "ag")
        assert (got == np.repeat(np.arange(hvd.size()) + i, 8)).all(), got
    return (_delta(before[0], _syncs(f)), f.calls("cudaMallocAsync") - before[1],
            f.calls("cudaFreeAsync") - before[2])


def test_without_the_ordered_allocator_frees_wait_for_the_device(fake_cuda):
    """The stated fallback (Note [Ordered device memory]): a device without memory pools gets
    cudaMalloc/cudaFree, logged once; with no cache, each dropped output is freed with cudaFree
    (which waits for the device) and results stay right."""
    kw = device_ops.rank_envs(fake_cuda, 2, False, extra={
        "FAKE_CUDA_NO_MEMPOOL": "1", "HVD_TEST_DEVICE_OUTPUT_CACHE_BYTES": "0"})
    for r in run_ranks(allgathers_without_ordered_allocator, 2, timeout=60, **kw):
        syncs, async_mallocs, async_frees = r.value
        assert syncs == {"cudaMalloc": 3, "cudaFree": 3}, r.value
        assert async_mallocs == 0 and async_frees == 0, r.value
        warned = r.stderr.count("cudaMallocAsync is not supported on this device")
        assert warned == 1, f"the fallback was not logged once; the rank's log: {r.stderr!r}"


def allgather_when_memory_runs_out():
    hvd = device_ops.init()
    f = device_ops.fakes()
    n = hvd.size()
    for kib in (64, 128, 256):  # three outputs, cached when dropped: 448 KiB
        device_ops.allgather(np.ones(kib * 256 // n, np.float32), f"fill.{kib}")
    frees = f.calls("cudaFreeAsync")
    x = np.full(512 * 256 // n, hvd.rank() + 1, np.float32)  # a 512 KiB output
    got = device_ops.allgather(x, "big")
    assert (got == np.repeat(np.arange(n) + 1, x.size)).all(), got
    frees = f.calls("cudaFreeAsync") - frees
    with pytest.raises(hvd.HorovodInternalError) as error:  # 1 MiB cannot fit at all
        device_ops.allgather(np.ones(1024 * 256 // n, np.float32), "too.big")
    return frees, str(error.value)


def test_an_allocation_that_runs_out_of_memory_frees_the_cache_first(fake_cuda):
    """768 KiB of device memory: the 512 KiB output fits only once the cached blocks, which the
    framework's allocator may need as much, are freed (Note [Output reuse]); a 1 MiB output
    never fits, and the error says what to do."""
    kw = device_ops.rank_envs(fake_cuda, 2, False, extra={"FAKE_CUDA_DEVICE_BYTES": "786432"})
    for r in run_ranks(allgather_when_memory_runs_out, 2, timeout=60, **kw):
        frees, error = r.value
        assert frees == 3, r.value
        assert "CUDA device 0 has no 1048576 bytes left for a collective's output" in error \
            and "torch.cuda.empty_cache()" in error, error
