"""Failures on the device path, on the fake CUDA runtime and NCCL: abort() and a lost rank
with CUDA ops in flight, an asynchronous NCCL error, a collective that never progresses, a
communicator that cannot be made — each fails the op on every rank within HVD_TIMEOUT (no
hang), and shutdown() + init() then works in the same processes. Plus the errors a user sees
for an impossible HVD_GPU_PATH=nccl, CPU/GPU mixed across ranks, and CUDA without a runtime.
"""
import os
import time

import numpy as np
import pytest
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import checks, device_ops
from multiproc.harness import run_ranks

fake_cuda = _fake_cuda  # the session fixture, under its name


def _works_again(hvd):
    """After a failure: shutdown, init, and a CUDA collective succeeds."""
    hvd.shutdown()
    hvd.init()
    out = device_ops.allreduce(np.ones(4, np.float32), hvd.Sum, "after")
    return out.tolist() == [float(hvd.size())] * 4


def _failure(handle):
    from engine_native import _core
    t0 = time.monotonic()
    try:
        _core.wait(handle)
    except _core.HorovodInternalError as exc:
        return str(exc), time.monotonic() - t0
    return None, time.monotonic() - t0


def stuck_peer(action):
    """Rank 1's input comes from a producer kernel that never finishes, so rank 0's NCCL
    collective waits for it on the device. Then: rank 0 aborts, rank 1 dies, or nobody acts
    (HVD_TIMEOUT passes)."""
    hvd = device_ops.init()
    device_ops.allreduce(np.ones(4, np.float32), hvd.Sum, "warm")  # communicator made
    stuck = device_ops.StuckAllreduce(blocked_rank=1)
    bus = checks.out_of_band()
    pending = stuck.rank0_acts(action, bus)
    if hvd.rank() == 0:
        error, seconds = _failure(stuck.handle)
        return {"pending": pending, "error": error, "seconds": seconds,
                "again": action != "exit" and _works_again(hvd)}
    if action == "exit":
        os._exit(3)
    error, seconds = _failure(stuck.handle)  # the producer is still blocked here
    stuck.release()
    return {"error": error, "seconds": seconds, "again": _works_again(hvd)}


@pytest.mark.parametrize("action, cause, shared", [
    ("abort", "aborted", False), ("exit", "rank 1", False), ("timeout", "no progress", False),
    ("abort", "aborted", True)], ids=["abort-nccl", "exit-nccl", "timeout-nccl", "abort-staged"])
def test_stuck_collective_fails_on_every_rank_and_recovers(fake_cuda, action, cause, shared):
    """Staged: rank 1's loop, whose op waits for its inputs to reach host memory, is not
    blocked by the device — it takes rank 0's abort while its producer is still stuck."""
    kwargs = device_ops.rank_envs(fake_cuda, 2, shared, {"HVD_TIMEOUT": "3"})
    results = run_ranks(stuck_peer, 2, args=(action,), timeout=90, check=False, **kwargs)
    zero = results[0]
    assert zero.ok, zero.describe()
    assert zero.value["pending"], "the op finished although its peer was stuck"
    assert zero.value["error"] and cause in zero.value["error"], zero.value
    assert zero.value["seconds"] < 3 + 3, zero.value  # within HVD_TIMEOUT, plus slack
    if action == "exit":
        assert results[1].returncode == 3
    else:
        assert results[1].ok, results[1].describe()
        assert results[1].value["error"], results[1].value
        assert results[1].value["seconds"] < 3 + 3, results[1].value
        assert results[1].value["again"] and zero.value["again"]


def async_nccl_error():
    hvd = device_ops.init()
    outcomes = []
    for i in range(4):  # the third collective fails on rank 1 (FAKE_NCCL_FAIL_COLLECTIVE)
        try:
            device_ops.allreduce(np.ones(8, np.float32), hvd.Sum, f"n.{i}")
            outcomes.append("ok")
        except Exception as exc:  # noqa: BLE001
            outcomes.append(f"{type(exc).__name__}: {exc}")
            break
    return outcomes, _works_again(hvd)


def test_asynchronous_nccl_error_fails_every_rank(fake_cuda):
    kwargs = device_ops.rank_envs(fake_cuda, 2, False, {"HVD_TIMEOUT": "5"})
    kwargs["rank_env"][1]["FAKE_NCCL_FAIL_COLLECTIVE"] = "3"  # init is no collective
    results = run_ranks(async_nccl_error, 2, timeout=90, **kwargs)
    for r in results:
        outcomes, again = r.value
        assert outcomes[:2] == ["ok", "ok"] and len(outcomes) == 3, outcomes
        assert outcomes[2].startswith("HorovodInternalError") and "NCCL" in outcomes[2], outcomes
        assert again


def path_after_failed_init():
    hvd = device_ops.init()
    out = device_ops.allreduce(np.full(6, hvd.rank() + 1.0, np.float32), hvd.Sum, "x")
    return device_ops.gpu_path(), out.tolist()


def test_communicator_that_cannot_be_made_falls_back_to_staging(fake_cuda):
    kwargs = device_ops.rank_envs(fake_cuda, 2, False)
    kwargs["rank_env"][1]["FAKE_NCCL_FAIL_INIT"] = "1"
    results = run_ranks(path_after_failed_init, 2, timeout=90, **kwargs)
    assert [r.value for r in results] == [("staged", [3.0] * 6)] * 2
    notice = results[0].stderr
    assert "NCCL could not set up a communicator (" in notice and "rank 1: " in notice, notice


def demand_nccl():
    hvd = device_ops.init()
    try:
        device_ops.allreduce(np.ones(4, np.float32), hvd.Sum, "x")
    except Exception as exc:  # noqa: BLE001
        return str(exc)
    return None


def test_hvd_gpu_path_nccl_on_shared_gpus_is_a_clear_error(fake_cuda):
    kwargs = device_ops.rank_envs(fake_cuda, 2, True, {"HVD_GPU_PATH": "nccl"})
    for r in run_ranks(demand_nccl, 2, timeout=60, **kwargs):
        assert r.value and "HVD_GPU_PATH=nccl" in r.value, r.value
        assert "share GPU " + device_ops.SHARED_BUS_ID in r.value, r.value


def mixed_devices():
    from engine_native import _core
    hvd = device_ops.init()
    x = np.ones(4, np.float32)
    out = np.empty_like(x)
    device = 0 if hvd.rank() == 0 else -1
    try:
        _core.wait(device_ops.enqueue(_core.ALLREDUCE, x, out, "mixed", hvd.Sum, device=device))
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    return None


def test_cpu_and_gpu_for_one_name_is_horovods_error_on_every_rank(fake_cuda):
    for r in run_ranks(mixed_devices, 2, timeout=60,
                       **device_ops.rank_envs(fake_cuda, 2, False)):
        kind, text = r.value
        assert kind == "HorovodInternalError" and "CPU/GPU device selection" in text, r.value


def cuda_before_runtime():
    import engine_native as hvd
    from engine_native import _core
    hvd.init()
    x = np.ones(4, np.float32)
    try:
        device_ops.enqueue(_core.ALLREDUCE, x, np.empty_like(x), "early", hvd.Sum)
    except ValueError as exc:
        return str(exc)
    return None


def test_cuda_tensor_without_a_loaded_runtime_is_a_value_error(fake_cuda):
    out = run_ranks(cuda_before_runtime, 1, timeout=60)[0].value
    assert out and "before the CUDA runtime was loaded" in out and "require_cuda()" in out, out
