"""The device path's stream contract and completion, on the fake CUDA runtime (real worker
threads per stream, real events): an op waits on the device for the kernel that produced its
input, even one still running when the op is enqueued; the core's loop is never blocked by
the device (other work completes meanwhile); the NCCL path never waits on a stream from the
host; nothing leaks once the core shuts down.
"""
import time

import numpy as np
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import device_ops
from multiproc.harness import run_ranks

fake_cuda = _fake_cuda  # the session fixture, under its name


def producer_still_running():
    """A "kernel" on the producer stream fills the input 300 ms after the enqueue: the result
    must be the filled values, and the handle must not be done before the kernel ran."""
    from engine_native import _core
    hvd = device_ops.init()
    f = device_ops.fakes()
    producer = f.stream()
    x = np.zeros(1 << 16, np.uint8)
    out = np.empty_like(x)
    f.check(f.cuda.fakeCudaLaunchDelayedFill(x.ctypes.data, 7, x.nbytes, 300, producer))
    t0 = time.monotonic()
    handle = device_ops.enqueue(_core.ALLREDUCE, x, out, "late", hvd.Max, stream=producer)
    early = _core.poll(handle)
    _core.wait(handle)
    waited = time.monotonic() - t0
    f.check(f.cuda.cudaStreamDestroy(producer))
    return {"early": early, "waited": waited, "values": sorted(set(out.tolist()))}


def test_op_waits_for_a_producer_kernel_still_running(fake_cuda):
    for shared in (False, True):
        results = run_ranks(producer_still_running, 2, timeout=60,
                            **device_ops.rank_envs(fake_cuda, 2, shared))
        for r in results:
            assert r.value["values"] == [7], (shared, r.value)  # not the zeros before the fill
            assert not r.value["early"] and r.value["waited"] >= 0.25, (shared, r.value)


def loop_not_blocked():
    """While a CUDA op waits (on the device) for a blocked producer, CPU collectives and
    CUDA ops on other streams still complete: the loop only queued the work."""
    from engine_native import _core
    hvd = device_ops.init()
    f = device_ops.fakes()
    producer = f.stream()
    token = f.cuda.fakeCudaLaunchBlocker(producer)
    assert token > 0
    x = np.full(8, hvd.rank() + 1, np.float32)
    out = np.empty_like(x)
    blocked = device_ops.enqueue(_core.ALLREDUCE, x, out, "blocked", hvd.Sum, stream=producer)
    cpu = hvd.allreduce(np.ones(3, np.float32), op=hvd.Sum, name="cpu.meanwhile")
    pending_after_cpu = not _core.poll(blocked)
    f.check(f.cuda.fakeCudaReleaseBlocker(token))
    _core.wait(blocked)
    f.check(f.cuda.cudaStreamDestroy(producer))
    return {"cpu": cpu.tolist(), "pending": pending_after_cpu, "out": out.tolist()}


def test_loop_keeps_working_while_a_device_op_waits(fake_cuda):
    # NCCL only: the staged path waits for its own copies on the host by design.
    results = run_ranks(loop_not_blocked, 2, timeout=60,
                        **device_ops.rank_envs(fake_cuda, 2, False))
    for r in results:
        assert r.value == {"cpu": [2.0] * 3, "pending": True, "out": [3.0] * 8}, r.value


def no_host_waits_on_nccl():
    hvd = device_ops.init()
    f = device_ops.fakes()
    device_ops.allreduce(np.ones(16, np.float32), hvd.Sum, "warm")  # path set up
    waits = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")
    before = {w: f.calls(w) for w in waits}
    for i in range(50):
        device_ops.allreduce(np.ones(1000, np.float32) * i, hvd.Sum, f"step.{i % 5}")
    after = {w: f.calls(w) for w in waits}
    return {w: after[w] - before[w] for w in waits}, f.calls("cudaLaunchHostFunc")


def test_nccl_path_never_waits_on_the_device_from_the_host(fake_cuda):
    results = run_ranks(no_host_waits_on_nccl, 2, timeout=60,
                        **device_ops.rank_envs(fake_cuda, 2, False))
    for r in results:
        waits, host_funcs = r.value
        assert waits == {"cudaStreamSynchronize": 0, "cudaEventSynchronize": 0,
                         "cudaDeviceSynchronize": 0}, waits
        assert host_funcs >= 51  # every op's completion woke the loop from the driver


def nothing_leaks():
    """Streams, events, pinned buffers and communicators are all returned at shutdown, and a
    re-init builds them afresh; device outputs go back to the core's pool when their last
    reference dies and are reused (Note [Output reuse]): the device memory in use after a
    second init-use-shutdown cycle is what it was after the first."""
    hvd = device_ops.init()
    f = device_ops.fakes()
    live = []
    for cycle in range(2):
        for i in range(5):
            got = device_ops.allgather(np.ones((2, 2), np.float32) * i, f"ag.{i}")
            assert got.shape == (2 * hvd.size(), 2)
        device_ops.allreduce(np.ones(5, np.float32), hvd.Sum, "ar")
        hvd.shutdown()
        live.append(f.live())
        if cycle == 0:
            hvd.init()
    return live


def test_no_device_memory_stream_event_or_communicator_leaks(fake_cuda):
    for shared in (False, True):
        results = run_ranks(nothing_leaks, 2, timeout=60,
                            **device_ops.rank_envs(fake_cuda, 2, shared))
        for r in results:
            first, second = r.value
            assert second["device"] == first["device"] <= 1, (shared, first, second)
            assert second["comms"] == 0 and second["streams"] == 0, (shared, second)
            assert second["host"] == 0, (shared, second)
