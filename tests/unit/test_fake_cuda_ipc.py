"""CUDA IPC in the fake runtime (tests/fakecuda/fake_cudart_ipc.c): device memory and events
that a second process opens from a 64-byte handle, with CUDA's errors and event semantics.

Two real rank processes (multiproc harness, hard timeout) exchange handles through the core's
CPU allgather; a blocker (fakeCudaLaunchBlocker) holds the exporter's stream deterministically,
and the one short sleep only gives a wrongly-released stream the chance to show it.
"""
import os
import time

import numpy as np
from fakecuda.clib import NOT_READY, Fakes
from fakecuda.fixtures import fake_cuda as _fake_cuda
from multiproc.harness import run_ranks

fake_cuda = _fake_cuda
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
INVALID_VALUE, DEVICE_UNINITIALIZED, INVALID_HANDLE = 1, 201, 400


def exchange(hvd, data: bytes) -> list:
    """Every rank's 64-byte handle (or any equal-length bytes), by rank."""
    got = hvd.allgather(np.frombuffer(data, np.uint8).reshape(1, -1).copy())
    return [bytes(row) for row in got]


def rank_ipc(fake):
    import engine_native as hvd
    hvd.init()
    f = Fakes(fake.cudart, fake.nccl)
    c, me = f.cuda, hvd.rank()
    peer = 1 - me
    buf, gone = f.malloc(4096), f.malloc(256)
    f.put(buf, bytes([10 + me]) * 4096)
    s, done = f.stream(), f.event()
    ev = f.event(flags=6)  # cudaEventInterprocess | cudaEventDisableTiming
    out = {"timing_interprocess": c.cudaEventCreateWithFlags(ctypes_out(), 4),
           "plain_event_handle": handle_error(f, f.event()),
           "not_device": handle_error(f, 0x1234, memory=True)}
    mem = exchange(hvd, f.ipc_handle(buf + 100))  # any address inside names the allocation
    evs = exchange(hvd, f.ipc_handle(ev, event=True))
    gones = exchange(hvd, f.ipc_handle(gone))
    out["own"] = [f.ipc_open(mem[me])[0], f.ipc_open(evs[me], event=True)[0]]
    result, mapped = f.ipc_open(mem[peer])
    again = f.ipc_open(mem[peer])[1]
    out["open"] = (result, mapped != buf, again == mapped, c.fakeCudaLiveIpcMappings())
    out["peer_bytes"] = f.get(mapped, 4)
    if me == 0:
        f.put(mapped + 8, b"\x63" * 4)  # into rank 1's allocation
    hvd.barrier()
    out["written_by_peer"] = f.get(buf + 8, 4)
    result, peer_ev = f.ipc_open(evs[peer], event=True)
    out["open_event"] = result
    # The exporter's stream is held; its record is pending: the importer's wait holds its stream.
    if me == 0:
        token = c.fakeCudaLaunchBlocker(s)
        f.check(c.cudaEventRecord(ev, s))
    hvd.barrier()
    if me == 1:
        f.check(c.cudaStreamWaitEvent(s, peer_ev, 0))
        f.check(c.cudaMemsetAsync(buf, 7, 4, s))
        f.check(c.cudaEventRecord(done, s))
        f.settled(s)
        out["held"] = (c.cudaEventQuery(peer_ev), c.cudaEventQuery(done), f.get(buf, 4))
    hvd.barrier()
    if me == 0:
        f.check(c.fakeCudaReleaseBlocker(token))
    hvd.barrier()
    if me == 1:
        f.check(c.cudaStreamSynchronize(s))
        out["released"] = (c.cudaEventQuery(peer_ev), f.get(buf, 4))
        # Nothing recorded since: a wait captures the fired record and holds nothing.
        token = c.fakeCudaLaunchBlocker(f.stream())
        f.check(c.cudaStreamWaitEvent(s, peer_ev, 0))
        f.check(c.cudaMemsetAsync(buf, 8, 4, s))
        f.check(c.cudaStreamSynchronize(s))
        out["latest_at_call"] = f.get(buf, 4)
        f.check(c.fakeCudaReleaseBlocker(token))
    if me == 0:
        f.check(c.cudaFree(gone))
        reuse = f.malloc(256)  # likely takes the freed fd number: the handle must still fail
    hvd.barrier()
    out["freed"] = f.ipc_open(gones[peer])[0] if me == 1 else None
    out["close"] = [c.cudaIpcCloseMemHandle(mapped), c.fakeCudaLiveIpcMappings(),
                    c.cudaIpcCloseMemHandle(mapped), c.fakeCudaLiveIpcMappings(),
                    c.cudaIpcCloseMemHandle(mapped)]
    f.check(c.cudaEventDestroy(peer_ev))
    hvd.barrier()
    if me == 0:
        f.check(c.cudaFree(reuse))
    hvd.shutdown()
    return out


def ctypes_out():
    import ctypes
    return ctypes.byref(ctypes.c_void_p())


def handle_error(f, what, memory=False):
    import ctypes
    from fakecuda.clib import IpcHandle
    h = IpcHandle()
    fn = f.cuda.cudaIpcGetMemHandle if memory else f.cuda.cudaIpcGetEventHandle
    return fn(ctypes.byref(h), what)


def test_ipc_memory_and_events_between_two_processes(fake_cuda):
    env = {"PYTHONPATH": os.pathsep.join([REPO, TESTS])}
    results = run_ranks(rank_ipc, 2, env=env, timeout=90, args=(fake_cuda,))
    out = [r.value for r in results]
    for me, o in enumerate(out):
        assert o["timing_interprocess"] == INVALID_VALUE
        assert o["plain_event_handle"] == INVALID_HANDLE and o["not_device"] == INVALID_VALUE
        assert o["own"] == [DEVICE_UNINITIALIZED, DEVICE_UNINITIALIZED]
        assert o["open"] == (0, True, True, 1)
        assert o["peer_bytes"] == bytes([10 + 1 - me]) * 4
        assert o["open_event"] == 0
        assert o["close"] == [0, 1, 0, 0, INVALID_VALUE]
    assert out[1]["written_by_peer"] == b"\x63" * 4
    assert out[0]["written_by_peer"] == bytes([10]) * 4
    assert out[1]["held"] == (NOT_READY, NOT_READY, bytes([11]) * 4)
    assert out[1]["released"] == (0, b"\7" * 4)
    assert out[1]["latest_at_call"] == b"\x08" * 4
    assert out[1]["freed"] == INVALID_HANDLE


def rank_dead_exporter(fake):
    """Rank 1 exports two allocations and an event, and exits; rank 0 opens one allocation
    while rank 1 lives and the other and the event only once rank 1's process is gone: those
    fail as CUDA's do for a dead exporter, and the mapping opened earlier stays readable."""
    import engine_native as hvd
    hvd.init()
    f = Fakes(fake.cudart, fake.nccl)
    c, me = f.cuda, hvd.rank()
    buf, other, ev = f.malloc(4096), f.malloc(64), f.event(flags=6)
    f.put(buf, bytes([40 + me]) * 4096)
    mem = exchange(hvd, f.ipc_handle(buf))
    others = exchange(hvd, f.ipc_handle(other))
    evs = exchange(hvd, f.ipc_handle(ev, event=True))
    pids = exchange(hvd, os.getpid().to_bytes(8, "little"))
    early = f.ipc_open(mem[1])[1] if me == 0 else 0
    hvd.shutdown()
    if me == 1:
        return None
    pid = int.from_bytes(pids[1], "little")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the harness reaps rank 1 when it exits
        try:
            with open(f"/proc/{pid}/status") as fh:
                if "State:\tZ" in fh.read():
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    return {"memory": f.ipc_open(others[1])[0], "event": f.ipc_open(evs[1], event=True)[0],
            "early_still_mapped": f.get(early, 4), "close": c.cudaIpcCloseMemHandle(early)}


def test_a_dead_exporters_handles_fail_and_its_open_mapping_stays(fake_cuda):
    env = {"PYTHONPATH": os.pathsep.join([REPO, TESTS])}
    out = run_ranks(rank_dead_exporter, 2, env=env, timeout=90, args=(fake_cuda,))[0].value
    assert out == {"memory": INVALID_HANDLE, "event": INVALID_HANDLE,
                   "early_still_mapped": bytes([41]) * 4, "close": 0}, out
