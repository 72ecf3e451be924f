"""Edges of the device path on the fake CUDA runtime and NCCL: joins before any CUDA op, two
GPUs in one process, removed process sets, a producer that never finishes on a staged set of
one, a framework thread's current device (the loop's passes may run on it), and a staged
broadcast's pinned buffer, which no peer reads directly under HVD_SINGLE_COPY=auto.
"""
import os

import numpy as np
import pytest
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import device_ops, faults
from multiproc.harness import run_ranks

fake_cuda = _fake_cuda  # the session fixture, under its name

JOIN_DTYPE = 3  # int32, as engine_native.torch sends a join


def _join(device):
    from engine_native import _core
    return _core.wait(_core.enqueue(_core.JOIN, "join", JOIN_DTYPE, (), 0, 0, 1, 1.0, 1.0, 0,
                                    0, None, device))


def join_first(device):
    """Every rank joins (naming `device`) before any CUDA op, then CUDA collectives run."""
    hvd = device_ops.init()
    last = _join(device)
    out = device_ops.allreduce(np.ones(4, np.float32), hvd.Sum, "after.join")
    return last, out.tolist()


def test_every_rank_joining_before_any_cuda_op(fake_cuda):
    results = run_ranks(join_first, 2, args=(0,), timeout=60,
                        **device_ops.rank_envs(fake_cuda, 2, False))
    values = [r.value for r in results]
    # join() returns the rank that joined last: either may, but every rank names the same one
    assert values[0][0] in (0, 1) and values == [(values[0][0], [2.0] * 4)] * 2, values


def join_on_cpu_while_peers_use_cuda():
    hvd = device_ops.init()
    try:
        if hvd.rank() == 1:
            _join(-1)  # Horovod's default, on a rank that never ran a CUDA op
        else:
            device_ops.allreduce(np.ones(4, np.float32), hvd.Sum, "needs.zeros")
            _join(0)
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    return None


def test_a_cpu_join_under_cuda_collectives_is_a_clear_error_on_every_rank(fake_cuda):
    results = run_ranks(join_on_cpu_while_peers_use_cuda, 2, timeout=60,
                        **device_ops.rank_envs(fake_cuda, 2, False))
    for r in results:
        assert r.value and "join(device=" in r.value[1], r.value
    assert results[1].value[0] == "ValueError", results[1].value


def two_gpus_in_one_set():
    from engine_native import _core
    hvd = device_ops.init()
    device_ops.allreduce(np.ones(2, np.float32), hvd.Sum, "on.gpu0")
    x = np.ones(2, np.float32)
    errors = []
    for call in (lambda: device_ops.enqueue(_core.ALLREDUCE, x, np.empty_like(x), "on.gpu1",
                                            hvd.Sum, device=1),
                 lambda: _join(7)):
        try:
            call()
        except ValueError as exc:
            errors.append(str(exc))
    out = device_ops.allreduce(np.ones(2, np.float32), hvd.Sum, "still.works")
    return errors, out.tolist()


def test_a_second_gpu_in_a_set_or_a_missing_one_is_a_value_error_at_enqueue(fake_cuda):
    kwargs = device_ops.rank_envs(fake_cuda, 2, False, {"FAKE_CUDA_DEVICE_COUNT": "2"})
    for r in kwargs["rank_env"].values():
        r["FAKE_CUDA_BUS_IDS"] += ",0000:7f:00.0"
    for r in run_ranks(two_gpus_in_one_set, 2, timeout=60, **kwargs):
        errors, out = r.value
        assert len(errors) == 2 and out == [2.0, 2.0], r.value
        assert "cuda:0" in errors[0] and "cuda:1" in errors[0], errors
        assert "join(device=7)" in errors[1] and "2 CUDA device(s)" in errors[1], errors


def removed_set_drops_its_communicator():
    hvd = device_ops.init()
    f = device_ops.fakes()
    before = f.nccl.fakeNcclLiveComms()
    evens = hvd.add_process_set([0, 1])
    from engine_native import _core
    x = np.ones(3, np.float32)
    out = np.empty_like(x)
    _core.wait(device_ops.enqueue(_core.ALLREDUCE, x, out, "in.set", hvd.Sum,
                                  set_id=evens.process_set_id))
    during = f.nccl.fakeNcclLiveComms()
    hvd.remove_process_set(evens)
    # executed from the loop's queue, after the pass that drops removed sets (a small blocking
    # allreduce may finish on the one-round board before that: Note [One round] H)
    hvd.barrier()
    return before, during, f.nccl.fakeNcclLiveComms()


def test_a_removed_process_set_frees_its_nccl_communicator(fake_cuda):
    for r in run_ranks(removed_set_drops_its_communicator, 2, timeout=60,
                       **device_ops.rank_envs(fake_cuda, 2, False)):
        before, during, after = r.value
        assert during == before + 1 and after == before, r.value


def stuck_producer_on_a_staged_set_of_one():
    from engine_native import _core
    hvd = device_ops.init()
    f = device_ops.fakes()
    producer = f.stream()
    token = f.cuda.fakeCudaLaunchBlocker(producer)
    x = np.ones(4, np.float32)
    handle = device_ops.enqueue(_core.ALLREDUCE, x, np.empty_like(x), "stuck", hvd.Sum,
                                stream=producer)
    error, seconds = faults.timed_wait(handle)
    f.check(f.cuda.fakeCudaReleaseBlocker(token))
    hvd.shutdown()
    return error, seconds


def test_a_staged_op_whose_producer_never_finishes_times_out(fake_cuda):
    kwargs = device_ops.rank_envs(fake_cuda, 1, False, {"HVD_GPU_PATH": "staged",
                                                         "HVD_TIMEOUT": "2"})
    error, seconds = run_ranks(stuck_producer_on_a_staged_set_of_one, 1, timeout=60,
                               **kwargs)[0].value
    assert error and "waited for its inputs' producers" in error, error
    assert seconds < 2 + 3, seconds


def framework_thread_keeps_its_device():
    """The waiting thread drives its op (caller drives) on cuda:1 and records its ready event
    there; its own current device (0) is what it was before."""
    import ctypes
    from engine_native import _core
    hvd = device_ops.init()
    f = device_ops.fakes()
    f.check(f.cuda.cudaSetDevice(0))
    warm = np.ones(8, np.float32)  # the set's path and communicator are made first
    _core.wait(_core.enqueue(_core.ALLREDUCE, "warm", 7, warm.shape, warm, np.empty_like(warm),
                             hvd.Sum, 1.0, 1.0, 0, 0, None, 1, 0))
    # Until one op ran on this thread (the core's own thread may take an op first on a busy
    # machine), each checked: results right, this thread's device still 0.
    devices, outs, driven = [], [], 0
    for attempt in range(20):
        x = np.ones(8, np.float32)
        out = np.empty_like(x)
        before = hvd.metrics()["caller_driven_ops"]
        _core.wait(_core.enqueue_for_wait(_core.ALLREDUCE, f"on.gpu1.{attempt}", 7, x.shape, x,
                                          out, hvd.Sum, 1.0, 1.0, 0, 0, None, 1, 0))
        current = ctypes.c_int(-1)
        f.check(f.cuda.cudaGetDevice(ctypes.byref(current)))
        devices.append(current.value)
        outs.append(out.tolist())
        driven = hvd.metrics()["caller_driven_ops"] - before
        if driven:
            break
    return devices, outs, driven


@pytest.mark.parametrize("shared", [False, True], ids=["nccl", "staged"])
def test_a_driving_caller_keeps_its_current_device(fake_cuda, shared):
    # A waiting caller drives for up to 5 s here (not 200 µs), so the op surely runs on it.
    kwargs = device_ops.rank_envs(fake_cuda, 1, shared, {"FAKE_CUDA_DEVICE_COUNT": "2",
                                                          "HVD_CALLER_SPIN_US": "5000000"})
    kwargs["rank_env"][0]["FAKE_CUDA_BUS_IDS"] += ",0000:7f:00.0"
    devices, outs, driven = run_ranks(framework_thread_keeps_its_device, 1, timeout=60,
                                      **kwargs)[0].value
    assert set(devices) == {0} and all(o == [1.0] * 8 for o in outs), (devices, outs)
    assert driven >= 1, f"none of {len(devices)} ops ran on the waiting thread: proves nothing"


def ops_while_a_stream_captures():
    """Note [Graph capture]: an op whose producer stream captures a CUDA graph, or on the legacy
    stream while another stream captures, is refused at enqueue on this rank; once the capture
    ends, the same op runs (nothing was submitted meanwhile, so the ranks still agree). (No op
    runs during the capture: in CUDA's global capture mode, torch's default, the core thread's
    own calls would invalidate it.)"""
    hvd = device_ops.init()
    f = device_ops.fakes()
    capturing = f.stream()
    x = np.ones(3, np.float32)
    errors = []
    f.check(f.cuda.fakeCudaSetCapture(capturing, 1))
    for stream in (capturing, 0):
        try:
            device_ops.allreduce(x, hvd.Sum, "captured", stream=stream)
            errors.append(None)
        except ValueError as exc:
            errors.append(str(exc))
    f.check(f.cuda.fakeCudaSetCapture(capturing, 0))
    after = device_ops.allreduce(x, hvd.Sum, "captured", stream=capturing).tolist()
    return errors, after, f.calls("cudaStreamIsCapturing") > 0


def test_an_op_on_a_capturing_stream_is_refused_at_enqueue_on_its_rank(fake_cuda):
    for r in run_ranks(ops_while_a_stream_captures, 2, timeout=60,
                       **device_ops.rank_envs(fake_cuda, 2, False)):
        errors, after, asked = r.value
        assert len(errors) == 2 and all(errors), r.value
        for e in errors:
            assert e.startswith("ALLREDUCE('captured'): the tensor's CUDA stream is capturing a "
                                "CUDA graph"), e
            assert "after graph.replay()" in e, e
        assert after == [2.0] * 3 and asked, r.value


def staged_and_host_broadcasts():
    """A 16 MiB broadcast through the staged path, then the same from host memory, on ranks
    sharing two CPUs (a host whose readers read on two threads: HVD_SINGLE_COPY=auto reads
    broadcasts directly). Returns the host's single-copy mode, the single-copy ops each
    broadcast ran and whether both results are the root's."""
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:2]))
    hvd = device_ops.init()
    count = (16 << 20) // 4 + 9
    before = hvd.metrics()["single_copy_ops"]
    staged = device_ops.broadcast(np.full(count, hvd.rank() + 1.0, np.float32), 0, "staged.b")
    staged_ops = hvd.metrics()["single_copy_ops"] - before
    host = hvd.broadcast(np.full(count, hvd.rank() + 1.0, np.float32), 0, name="host.b")
    host_ops = hvd.metrics()["single_copy_ops"] - before - staged_ops
    mode = hvd.metrics()["host_copy"]
    hvd.shutdown()
    return mode, staged_ops, host_ops, bool(np.all(staged == 1.0)) and bool(np.all(host == 1.0))


def test_a_staged_broadcast_keeps_the_slots_under_auto_single_copy(fake_cuda):
    """A staged op's host buffer is pinned (cudaMallocHost) on a real GPU, which a peer's
    process_vm_readv may not read: under auto its broadcast goes through the slots, while a
    broadcast from the process's own memory reads the root's input directly."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    kwargs = device_ops.rank_envs(fake_cuda, 2, True)
    results = run_ranks(staged_and_host_broadcasts, 2, timeout=120, **kwargs)
    assert [r.value for r in results] == [("single-copy broadcast", 0, 1, True)] * 2
