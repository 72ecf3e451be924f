"""The device memory of outputs the core allocates for CUDA tensors (allgather, alltoall,
reducescatter), on the fake CUDA runtime: blocks are reused, never cudaFree'd per op (which
would synchronise the whole device), and a block is written again only after the stream its
last user ran on got past that use (Note [Output reuse] in runtime/device_output_pool.cc).
"""
import ctypes

import numpy as np
import pytest
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import device_ops
from multiproc.harness import run_ranks

fake_cuda = _fake_cuda  # the session fixture, under its name


def outputs_are_reused():
    hvd = device_ops.init()
    f = device_ops.fakes()
    device_ops.allgather(np.ones((4, 3), np.float32), "warm")
    mallocs, frees = f.calls("cudaMalloc"), f.calls("cudaFree")
    for i in range(30):
        got = device_ops.allgather(np.full((4, 3), i, np.float32), f"ag.{i % 3}")
        assert got.shape == (4 * hvd.size(), 3) and (got == i).all(), got
    return f.calls("cudaMalloc") - mallocs, f.calls("cudaFree") - frees


@pytest.mark.parametrize("shared", [False, True], ids=["nccl", "staged"])
def test_outputs_reuse_device_blocks_without_cuda_free(fake_cuda, shared):
    for r in run_ranks(outputs_are_reused, 2, timeout=60,
                       **device_ops.rank_envs(fake_cuda, 2, shared)):
        mallocs, frees = r.value
        assert frees == 0 and mallocs <= 1, r.value


def reuse_waits_for_the_last_user():
    """A consumer stream still has a read of output #1 queued (behind a blocked "kernel") when
    the tensor over it dies; output #2 gets the same block, and must not be written until that
    read ran."""
    from engine_native import _core
    hvd = device_ops.init()
    f = device_ops.fakes()
    x = np.full((2, 4), hvd.rank() + 1, np.float32)
    buffer, shape = _core.wait(device_ops.enqueue(_core.ALLGATHER, x, None, "first"))
    nbytes = buffer.nbytes
    consumer = f.stream()
    token = f.cuda.fakeCudaLaunchBlocker(consumer)
    seen = (ctypes.c_uint8 * nbytes)()
    f.check(f.cuda.cudaMemcpyAsync(ctypes.addressof(seen), buffer.ptr, nbytes, 4, consumer))
    first_block = buffer.ptr
    buffer.release_stream = consumer
    del buffer  # the last reference: the block goes back to the pool behind the queued read
    y = np.full((2, 4), 10 * (hvd.rank() + 1), np.float32)
    # Were the reuse not ordered, the write (and the op) would finish now.
    handle, pending = device_ops.held_for_a_second(
        hvd, "ALLGATHER", lambda: device_ops.enqueue(_core.ALLGATHER, y, None, "second"))
    f.check(f.cuda.fakeCudaReleaseBlocker(token))
    second, _ = _core.wait(handle)
    f.check(f.cuda.cudaStreamSynchronize(consumer))
    read = np.frombuffer(bytes(seen), np.float32).reshape(shape).copy()
    after = device_ops.device_array(second, shape, np.float32)
    same_block = second.ptr == first_block
    f.check(f.cuda.cudaStreamDestroy(consumer))
    return same_block, pending, read.tolist(), after.tolist()


@pytest.mark.parametrize("shared", [False, True], ids=["nccl", "staged"])
def test_a_reused_block_is_written_only_after_its_last_user(fake_cuda, shared):
    for r in run_ranks(reuse_waits_for_the_last_user, 2, timeout=60,
                       **device_ops.rank_envs(fake_cuda, 2, shared)):
        same_block, pending, read, after = r.value
        assert same_block, "the second output got another block: the test proves nothing"
        assert pending, "the second allgather finished while the block's last user was blocked"
        assert read == [[1.0] * 4] * 2 + [[2.0] * 4] * 2, read   # output #1, not #2
        assert after == [[10.0] * 4] * 2 + [[20.0] * 4] * 2, after
