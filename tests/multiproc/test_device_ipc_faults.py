"""Failures on the CUDA-IPC path (ranks sharing one fake GPU): a rank that dies while its peers
hold its mapped buffer and wait on its events, and abort() mid-collective followed by
shutdown() + init(). Every surviving rank fails within HVD_TIMEOUT naming the lost rank (no
hang), and after a recovery the peers' buffers are mapped afresh with none left over (the fake
counts open IPC mappings).
"""
import os
import signal
import time

import numpy as np
import pytest
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import checks, device_ops
from multiproc.harness import run_ranks
from multiproc.test_device_faults import _failure

fake_cuda = _fake_cuda  # the session fixture, under its name
TIMEOUT = 3


def stuck_ipc_peer(action):
    """The last rank's input comes from a producer kernel that never finishes, so the others
    wait for it (Note [IPC step protocol]): host-ordered, in the step's barrier while its loop
    holds the op in phase A; device-ordered, their streams on its input_ready event. Then rank
    0 aborts, or the last rank is SIGKILLed."""
    hvd = device_ops.init()
    f = device_ops.fakes()
    last = hvd.size() - 1
    device_ops.allreduce(np.ones(4, np.float32), hvd.Sum, "warm")  # peers mapped
    mapped = f.cuda.fakeCudaLiveIpcMappings()
    stuck = device_ops.StuckAllreduce(blocked_rank=last)
    bus = checks.out_of_band()
    pending = stuck.rank0_acts(action, bus)
    if action == "kill" and hvd.rank() == last:
        os.kill(os.getpid(), signal.SIGKILL)
    error, seconds = _failure(stuck.handle)
    stuck.release()
    result = {"pending": pending, "error": error, "seconds": seconds, "mapped": mapped}
    if action == "abort":
        hvd.shutdown()
        result["after_shutdown"] = f.cuda.fakeCudaLiveIpcMappings()
        hvd.init()
        again = device_ops.allreduce(np.ones(4, np.float32), hvd.Sum, "after")
        result["again"] = again.tolist() == [float(hvd.size())] * 4
        result["path"] = device_ops.gpu_path()
        result["remapped"] = f.cuda.fakeCudaLiveIpcMappings()
        hvd.shutdown()
        result["final"] = f.cuda.fakeCudaLiveIpcMappings()
    return result


def stuck_then_grow():
    """Device-ordered, the last rank's input comes from a producer that never finishes, and
    the next op needs larger slots: every rank's slot growth (DeviceIpcSteps::reserve) waits
    for its stream — the last rank's behind the producer, the others' behind their device wait
    for its input. Rank 0 aborts: the waits end, no rank hangs."""
    from engine_native import _core
    hvd = device_ops.init()
    f = device_ops.fakes()
    last = hvd.size() - 1
    device_ops.allreduce(np.ones(4, np.float32), hvd.Sum, "warm")  # peers mapped, small slots
    producer, token = f.stream(), 0
    if hvd.rank() == last:
        token = f.cuda.fakeCudaLaunchBlocker(producer)
    small, big = np.ones(1024, np.float32), np.ones((2 << 20) // 4 + 1, np.float32)
    outs = [np.empty_like(small), np.empty_like(big)]
    device_ops.enqueue(_core.ALLREDUCE, small, outs[0], "stuck", hvd.Sum, stream=producer)
    grow = device_ops.enqueue(_core.ALLREDUCE, big, outs[1], "grow", hvd.Sum, stream=producer)
    bus = checks.out_of_band()
    if hvd.rank() == 0:
        time.sleep(0.5)  # a stimulus, not a synchronisation: the growth is waiting by now
        hvd.abort("test")
        bus.set("rank0-aborted", b"1")
    else:
        bus.get("rank0-aborted", timeout=30)
    error, seconds = _failure(grow)
    if hvd.rank() == last:
        f.check(f.cuda.fakeCudaReleaseBlocker(token))
    hvd.shutdown()
    return {"error": error, "seconds": seconds, "final": f.cuda.fakeCudaLiveIpcMappings()}


def test_slot_growth_behind_a_stuck_stream_ends_at_abort(fake_cuda):
    np_ = 3
    results = run_ranks(stuck_then_grow, np_, timeout=90, **_envs(fake_cuda, np_, "device"))
    for r in results:
        v = r.value
        assert v["error"] and v["seconds"] < TIMEOUT + 3, v
        assert v["final"] == 0, v


def _envs(fake, np_, order):
    return device_ops.rank_envs(fake, np_, True, {"HVD_TIMEOUT": str(TIMEOUT),
                                                  "HVD_IPC_ORDER": order}, ipc=True)


ORDERS = pytest.mark.parametrize("order", ["host", "device"])


@ORDERS
def test_abort_mid_collective_then_reinit_leaves_no_mappings(fake_cuda, order):
    np_ = 3
    results = run_ranks(stuck_ipc_peer, np_, args=("abort",), timeout=120,
                        **_envs(fake_cuda, np_, order))
    assert results[0].value["pending"], "the op finished although its peer was stuck"
    for r in results:
        v = r.value
        assert v["error"] and v["seconds"] < TIMEOUT + 3, v
        assert v["mapped"] == np_ - 1 and v["after_shutdown"] == 0, v
        assert v["again"] and v["path"] == "cuda-ipc", v
        assert v["remapped"] == np_ - 1 and v["final"] == 0, v


@ORDERS
def test_a_rank_killed_while_peers_hold_its_mapping(fake_cuda, order):
    np_ = 3
    results = run_ranks(stuck_ipc_peer, np_, args=("kill",), timeout=120, check=False,
                        **_envs(fake_cuda, np_, order))
    assert results[-1].returncode == -signal.SIGKILL, results[-1].describe()
    for r in results[:-1]:
        assert r.ok, r.describe()
        v = r.value
        assert v["pending"] and v["error"], v
        assert f"rank {np_ - 1}" in v["error"], v
        assert v["seconds"] < TIMEOUT + 3, v
