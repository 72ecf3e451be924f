"""Negotiation between ranks of one host goes through shared memory (Note [Control over shm]
in engine_native/csrc/transport/shm/ring_stream.cc), on spawned ranks.

Covered: which road each control channel takes (shm on one host, tcp across hosts: mixed
hosts use both at once); request and response lists far larger than the 64 KiB control ring,
sent both ways at the same moment (written in pieces, each side draining its own ring while
it waits for room); a loop thread asleep in poll() is woken by a frame in its ring, both
ways (a lost wake would cost the 200 ms tick on every op); a peer's last frame (a failure's
cause) written just before it hangs up is read, not lost behind the hang-up; a cause rank 0
relays late reaches a worker that already saw the failing rank hang up, and a worker that sees
a hang-up while rank 0 is stopped fails at once, saying so. That every other op
negotiates correctly over the rings is what the rest of tests/multiproc checks (checks.init
asserts the control road of every shm and tcp world).
"""
import signal
import statistics
import time

import numpy as np

from multiproc import checks, faults
from multiproc.checks import Failures
from multiproc.harness import run_ranks

# 2500 names of ~90 bytes: each worker's request list and rank 0's response list are over
# 200 KiB, three times the control ring.
MANY = 2500


def many_names_suite():
    import engine_native as hvd

    hvd.init()
    fails = Failures()
    prefix = "a-long-tensor-name-so-that-the-negotiation-frames-outgrow-the-control-ring."
    for round_ in range(2):
        handles = [hvd.allreduce_async(np.full(2, hvd.rank() + i, np.float32), op=hvd.Sum,
                                       name=f"{prefix}{round_}.{i}") for i in range(MANY)]
        for i, h in enumerate(handles):
            out = hvd.synchronize(h)
            want = sum(r + i for r in range(hvd.size()))
            if not np.all(out == want):
                fails.check(f"round {round_} tensor {i}", f"{out} != {want}")
                break
    controls = hvd.metrics()["control_transports"]
    hvd.shutdown()
    return fails.raise_if_any(), controls


def test_frames_larger_than_the_ring_both_ways():
    res = run_ranks(many_names_suite, 3, timeout=240)
    assert [r.value[1] for r in res] == [["none", "shm", "shm"], ["shm", "none", "none"],
                                         ["shm", "none", "none"]]


def test_mixed_hosts_use_shm_and_tcp_side_by_side():
    res = run_ranks(many_names_suite, 3, timeout=240, hosts=["a", "a", "b"])
    assert [r.value[1] for r in res] == [["none", "shm", "tcp"], ["shm", "none", "none"],
                                         ["tcp", "none", "none"]]


ROUNDS = 12
LATE_S = 0.05


def sleeping_loop_suite(late_rank: int):
    """The other rank submits first, so its loop thread is asleep in poll() when the late
    rank's frame arrives. Async ops: no caller drives them (Note [Caller drives] E)."""
    hvd = checks.init("shm")
    latencies = []
    for i in range(ROUNDS):
        hvd.barrier()
        if hvd.rank() == late_rank:
            time.sleep(LATE_S)
        t0 = time.perf_counter()
        out = hvd.synchronize(hvd.allreduce_async(np.ones(1, np.float32), op=hvd.Sum,
                                                  name=f"late.{i}"))
        if hvd.rank() == late_rank:
            latencies.append(time.perf_counter() - t0)
        assert out[0] == hvd.size(), out
    hvd.shutdown()
    return latencies


def test_a_sleeping_loop_is_woken_by_its_ring():
    # Late worker: its request wakes rank 0 and rank 0's response wakes the worker. Late rank
    # 0: the worker's request is waiting, and rank 0's response wakes the worker's loop.
    # A woken loop answers far inside the bound (not recorded in benchmarks/); a lost wake
    # waits for the loop's 200 ms tick.
    for late in (1, 0):
        res = run_ranks(sleeping_loop_suite, 2, args=(late,), timeout=120)
        waits = res[late].value
        assert statistics.median(waits) < 0.06, (late, [round(w * 1e3, 2) for w in waits])


def last_frame_suite(folder: str):
    """Rank 1's loop thread stops between reading its ring and reading its socket (the test
    switch CONTROL_END_GAP_DIR, armed here); there rank 0 aborts, so its cause goes into the
    ring, and shuts down, so its socket hangs up. Rank 1 must report that cause."""
    hvd = checks.init("shm")
    if hvd.rank() == 1:
        faults.announce(folder, "arm")  # its loop's next pass stops there (a tick at most)
        faults.await_event(folder, "go")
        try:
            hvd.allreduce(np.ones(4, np.float32), name="after")
        except hvd.HorovodInternalError as error:
            return str(error)
        return "no error"
    faults.await_event(folder, "in_gap")  # rank 1 read its ring and has not seen the hang-up
    hvd.abort("rank 0 gives up")
    hvd.shutdown()  # the abort is in rank 1's ring and the mesh is closed: its socket hung up
    faults.announce(folder, "go")
    return "aborted"


def test_a_cause_written_just_before_the_hang_up_is_read(tmp_path):
    folder = str(tmp_path)
    res = run_ranks(last_frame_suite, 2, args=(folder,), timeout=90,
                    rank_env={1: {"HVD_TEST_CONTROL_END_GAP_DIR": folder}})
    assert res[0].value == "aborted"
    assert "aborted on rank 0: rank 0 gives up" in res[1].value, res[1].value


def late_relay_suite():
    """Rank 1 aborts and closes; rank 2, waiting in an allreduce, sees rank 1 hang up before
    rank 0 (HVD_TEST_FAILURE_NOTICE_DELAY_MS) relays the cause. Rank 2 must report the cause,
    not the hang-up of the rank that closed."""
    hvd = checks.init("shm")
    if hvd.rank() == 1:
        hvd.abort("rank 1 gives up")
        hvd.shutdown()
        return "aborted"
    try:
        hvd.allreduce(np.ones(4, np.float32), name="never-completes")
    except hvd.HorovodInternalError as error:
        return str(error)
    return "no error"


def test_a_cause_rank_0_relays_late_is_still_the_reported_one():
    res = run_ranks(late_relay_suite, 3, timeout=90,
                    rank_env={0: {"HVD_TEST_FAILURE_NOTICE_DELAY_MS": "400"}})
    for r in (0, 2):
        assert "aborted on rank 1: rank 1 gives up" in res[r].value, (r, res[r].value)


def stopped_rank_0_suite(folder):
    """Rank 0 stops (SIGSTOP) inside a 64 MiB shm allreduce: rank 1 times out waiting for it
    (HVD_TIMEOUT 3 s), fails and closes; rank 2 (HVD_TIMEOUT 60 s) sees rank 1 hang up, and
    rank 0 cannot relay why. Rank 0 is killed once both failed. Returns (error, seconds)."""
    import os
    hvd = checks.init("shm")
    big = np.ones(16 << 20, np.float32)
    hvd.allreduce(np.ones(4, np.float32), name="warm-up")
    for attempt in range(5):  # retried only if the stop missed the op
        name = f"big.{attempt}"
        if hvd.rank() == 0:
            faults.write_pid(folder, "victim")
            handle = hvd.allreduce_async(big, op=hvd.Sum, name=name)
            if faults.wait_until_running(hvd, name, handle) and not hvd.poll(handle):
                os.kill(os.getpid(), signal.SIGSTOP)
            hvd.synchronize(handle)
            continue
        start = time.monotonic()
        try:
            hvd.allreduce(big, op=hvd.Sum, name=name)
        except hvd.HorovodInternalError as exc:
            result = str(exc), time.monotonic() - start
            faults.announce(folder, f"failed.{hvd.rank()}")
            faults.await_event(folder, f"failed.{3 - hvd.rank()}")
            faults.kill_by_pid_file(folder, "victim")
            hvd.shutdown()
            return result
    return "the stop never landed", 0.0


def test_a_hang_up_seen_while_rank_0_is_stopped_fails_at_once_naming_it(tmp_path):
    """Waiting out the cause rank 0 cannot relay (2 s) put the survivor's error past
    HVD_TIMEOUT + 1 s of the stop (random programs, np 3)."""
    res = run_ranks(stopped_rank_0_suite, 3, args=(str(tmp_path),), timeout=120, check=False,
                    env={"HVD_TIMEOUT": "3"}, rank_env={2: {"HVD_TIMEOUT": "60"}})
    assert res[0].returncode == -signal.SIGKILL, res[0].describe()
    (error_1, seconds_1), (error_2, seconds_2) = res[1].value, res[2].value
    assert "timed out after 3 s waiting for rank 0" in error_1, error_1
    assert "lost connection to rank 1" in error_2, error_2
    assert "rank 0 (pid" in error_2 and "is stopped (SIGSTOP" in error_2, error_2
    # not the 2 s wait for rank 0's word (nor rank 2's own 60 s timeout)
    assert seconds_2 < seconds_1 + 1.5, (seconds_1, seconds_2)
