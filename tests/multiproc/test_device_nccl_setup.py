"""NCCL communicator set-up that does not finish (issue #39, Note [Non-blocking set-up]), on the
fake NCCL: a member failing inside set-up (FAKE_NCCL_INIT_STALL=fail) or never joining (=hang)
leaves its peers' set-up in progress; every rank must still fail within HVD_TIMEOUT, naming
the failed member where one failed, and abort() must end the wait. After each, shutdown() and
init() work in the same processes. The normal path is every other device test's first op.
Later calls answered "in progress" are waited for, every collective's result right.
"""
import os
import threading
import time

import numpy as np
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import device_ops
from multiproc.harness import run_ranks

fake_cuda = _fake_cuda  # the session fixture, under its name

TIMEOUT_S = 1.5  # HVD_TIMEOUT in these tests
# Far below what a wait without the bound would take (the fake's blocking init gives up after
# 60 s; the abort test's HVD_TIMEOUT is 60 s), far above scheduling on a loaded CI machine.
SLACK_S = 15.0


def _first_op_fails(abort_when_set_up_starts=False):
    """The first CUDA allreduce (it makes the communicator); its error and how long it took.
    Then the stall hook is dropped and the core restarted: a CUDA op must work again."""
    from engine_native import _core
    hvd = device_ops.init()
    x = np.ones(4, np.float32)
    out = np.empty_like(x)
    t0 = time.monotonic()
    handle = device_ops.enqueue(_core.ALLREDUCE, x, out, "first", hvd.Sum)
    if abort_when_set_up_starts and hvd.rank() == 0:
        fakes = device_ops.fakes()
        while fakes.live()["comms"] == 0:  # a communicator in progress: set-up has begun
            assert time.monotonic() - t0 < 30, "set-up never started"
            threading.Event().wait(0.001)
        hvd.abort("test")
    error = None
    try:
        _core.wait(handle)
    except _core.HorovodInternalError as exc:
        error = str(exc)
    seconds = time.monotonic() - t0
    os.environ.pop("FAKE_NCCL_INIT_STALL", None)
    hvd.shutdown()
    hvd.init()
    again = device_ops.allreduce(np.ones(4, np.float32), hvd.Sum, "after")
    return {"error": error, "seconds": seconds, "path": device_ops.gpu_path(),
            "again": again.tolist() == [float(hvd.size())] * 4}


def _run(fake_cuda, stall, timeout_s, abort=False):
    kwargs = device_ops.rank_envs(fake_cuda, 3, False, {"HVD_TIMEOUT": str(timeout_s)})
    kwargs["rank_env"][1]["FAKE_NCCL_INIT_STALL"] = stall
    return [r.value for r in run_ranks(_first_op_fails, 3, args=(abort,), timeout=40, **kwargs)]


def test_member_failing_inside_set_up_fails_every_rank_naming_it(fake_cuda):
    for value in _run(fake_cuda, "fail", TIMEOUT_S):
        error = value["error"]
        assert error and "NCCL could not set up a communicator" in error, value
        assert "it failed on rank 1: " in error and "system error" in error, value
        assert "rank(s) 0, 2 waited HVD_TIMEOUT" in error, value
        assert value["seconds"] < TIMEOUT_S + SLACK_S, value
        assert value["again"] and value["path"] == "nccl", value


def test_member_that_never_joins_fails_every_rank_within_the_timeout(fake_cuda):
    for value in _run(fake_cuda, "hang", TIMEOUT_S):
        error = value["error"]
        assert error and "rank(s) 0, 1, 2 waited HVD_TIMEOUT" in error, value
        assert "No member reported an error" in error, value
        assert value["seconds"] < TIMEOUT_S + SLACK_S, value
        assert value["again"], value


def test_abort_ends_a_set_up_in_progress_on_every_rank(fake_cuda):
    """HVD_TIMEOUT is long: only the abort on rank 0 can end the wait this soon."""
    for value in _run(fake_cuda, "hang", 60, abort=True):
        assert value["error"] and "aborted on rank 0" in value["error"], value
        assert value["seconds"] < SLACK_S, value
        assert value["again"], value


def test_calls_answered_in_progress_are_waited_for(fake_cuda):
    """A non-blocking communicator stays so: NCCL may answer any later call "in progress"
    (a group's end still connecting peers), and the next call must wait until
    ncclCommGetAsyncError leaves that state (Note [Non-blocking set-up]); the fake refuses a
    call made sooner (Note [Calls in progress] in fake_nccl.c)."""
    from multiproc.test_device_path import others_suite
    kwargs = device_ops.rank_envs(fake_cuda, 2, False, {"FAKE_NCCL_CALLS_IN_PROGRESS": "1"})
    assert [r.value for r in run_ranks(others_suite, 2, timeout=120, **kwargs)] == ["nccl"] * 2
