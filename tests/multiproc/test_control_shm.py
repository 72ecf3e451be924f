"""Negotiation between ranks of one host goes through shared memory (Note [Control over shm]
in engine_native/csrc/transport/shm/ring_stream.cc), on spawned ranks.

Covered: which road each control channel takes (shm on one host, tcp across hosts: mixed
hosts use both at once); request and response lists far larger than the 64 KiB control ring,
sent both ways at the same moment (written in pieces, each side draining its own ring while
it waits for room); a loop thread asleep in poll() is woken by a frame in its ring, both
ways (a lost wake would cost the 200 ms tick on every op); a peer's last frame (a failure's
cause) written just before it hangs up is read, not lost behind the hang-up; a cause rank 0
relays late reaches a worker that already saw the failing rank hang up, and a worker that sees
a hang-up while rank 0 is stopped fails at once, saying so, as does one that sees a rank that
shut down hang up while rank 0 shuts down too; a failure told to a rank that had shut down ends
its wait without failing its core. That every other op
negotiates correctly over the rings is what the rest of tests/multiproc checks (checks.init
asserts the control road of every shm and tcp world).
"""
import signal
import time

import numpy as np
import pytest

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


ROUNDS = 3  # per late rank


def sleeping_loop_suite(folder: str):
    """Each round, one rank submits first and says so once its core lists the op as pending
    (its loop thread took it and, with nothing else to do, sleeps in poll()); only then does
    the late rank submit, so its frame reaches a sleeping loop. Rank 1 is late, then rank 0.
    Async ops only after a warm-up one: no caller drives them, so no loop thread is in
    standby, where it would not watch its ring (Note [Caller drives] B, E). Returns this
    rank's tick pickups over each late rank's rounds (Note [Tick pickups]: passes that found
    a frame or a submission nothing had woken them for)."""
    hvd = checks.init("shm")
    hvd.barrier()
    hvd.synchronize(hvd.allreduce_async(np.ones(1, np.float32), name="warm-up"))
    picked = {}
    for late_rank in (1, 0):
        before = hvd.metrics()["tick_pickups"]
        for i in range(ROUNDS):
            name, ready = f"late.{late_rank}.{i}", f"{late_rank}.{i}"
            late = hvd.rank() == late_rank
            if late:
                faults.await_event(folder, ready)
            handle = hvd.allreduce_async(np.ones(1, np.float32), op=hvd.Sum, name=name)
            if not late:
                faults.wait_until_pending(hvd, f"allreduce.{name}")
                faults.announce(folder, ready)
            out = hvd.synchronize(handle)
            assert out[0] == hvd.size(), out
        picked[late_rank] = hvd.metrics()["tick_pickups"] - before
    hvd.shutdown()
    return picked


def test_a_sleeping_loop_is_woken_by_its_ring(tmp_path):
    # Late worker: its request wakes rank 0 and rank 0's response wakes the worker. Late rank
    # 0: the worker's request wakes rank 0, and rank 0's response wakes the worker's loop.
    # A woken loop answers at once; a lost wake leaves the frame for the loop's 200 ms tick,
    # which counts a tick pickup on that rank (every round); a wake that races the tick's end
    # can add one.
    res = run_ranks(sleeping_loop_suite, 2, args=(str(tmp_path),), timeout=120)
    for late in (1, 0):
        picked = [r.value[late] for r in res]
        assert max(picked) <= 1, f"late rank {late}: tick pickups per rank {picked}"


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
    hvd = checks.init("shm")
    big = np.ones(16 << 20, np.float32)
    hvd.allreduce(np.ones(4, np.float32), name="warm-up")
    me = hvd.rank()

    def once_both_failed():
        faults.announce(folder, f"failed.{me}")
        faults.await_event(folder, f"failed.{3 - me}")

    result = faults.hung_peer(hvd, 0, folder,
                              lambda name: hvd.allreduce(big, op=hvd.Sum, name=name),
                              lambda name: hvd.allreduce_async(big, op=hvd.Sum, name=name),
                              before_kill=once_both_failed)
    hvd.shutdown()
    return result


def test_a_hang_up_seen_while_rank_0_is_stopped_fails_at_once_naming_it(tmp_path):
    """Waiting out the cause rank 0 cannot relay (2 s) put the survivor's error past
    HVD_TIMEOUT + 1 s of the stop (random programs, np 3)."""
    res = run_ranks(stopped_rank_0_suite, 3, args=(str(tmp_path),), timeout=120, check=False,
                    env={"HVD_TIMEOUT": "3"}, rank_env={2: {"HVD_TIMEOUT": "60"}})
    assert res[0].returncode == -signal.SIGKILL, res[0].describe()
    (error_1, seconds_1), (error_2, seconds_2) = res[1].value, res[2].value
    assert "timed out after 3 s waiting for rank 0" in error_1, error_1
    # the timeout names the stopped rank (stopped_ranks.h), once
    assert error_1.count("rank 0 (pid") == 1 and "is stopped (SIGSTOP" in error_1, error_1
    assert "lost connection to rank 1" in error_2, error_2
    assert "rank 0 (pid" in error_2 and "is stopped (SIGSTOP" in error_2, error_2
    # not the 2 s wait for rank 0's word (nor rank 2's own 60 s timeout)
    assert seconds_2 < seconds_1 + 1.5, (seconds_1, seconds_2)


def shut_down_rank_suite(folder, rank_0_shuts_down):
    """Rank 1 shuts down at once and, as nobody else agrees, closes after its HVD_TIMEOUT
    (2 s); rank 2 (HVD_TIMEOUT 60 s) is in an allreduce that needs rank 1, and so is rank 0,
    or it shuts down too. When rank 1 closes, the running ranks must fail at once saying why.
    A rank 0 that shuts down fails on nothing: rank 2 waited 2 s for its word (random
    programs: an error 5 s after the shutdown). Rank 1 shuts down once rank 0 says it does, so
    rank 0 is shutting down when rank 1 closes, 2 s later. Returns (error, when) on a running
    rank, when closed on a rank that shut down."""
    hvd = checks.init("shm")
    hvd.allreduce(np.ones(4, np.float32), name="warm-up")
    if hvd.rank() == 0 and rank_0_shuts_down:
        faults.announce(folder, "rank-0-shuts-down")
        hvd.shutdown()
        return time.monotonic()
    if hvd.rank() == 1:
        if rank_0_shuts_down:
            faults.await_event(folder, "rank-0-shuts-down")
        hvd.shutdown()
        return time.monotonic()  # it closed just before
    try:
        hvd.allreduce(np.ones(4, np.float32), name="needs-rank-1")
        result = ("no error", time.monotonic())
    except hvd.HorovodInternalError as error:
        result = (str(error), time.monotonic())
    hvd.shutdown()
    return result


@pytest.mark.parametrize("rank_0_shuts_down", [True, False], ids=["rank0-shuts-down",
                                                                   "rank0-runs"])
def test_a_rank_that_shut_down_is_named_at_once(tmp_path, rank_0_shuts_down):
    res = run_ranks(shut_down_rank_suite, 3, args=(str(tmp_path), rank_0_shuts_down), timeout=90,
                    env={"HVD_TIMEOUT": "60"}, rank_env={1: {"HVD_TIMEOUT": "2"}})
    for r in (2,) if rank_0_shuts_down else (0, 2):
        error, failed_at = res[r].value
        assert "lost connection to rank 1: it shut down" in error, (r, error)
        assert failed_at - res[1].value < 1.5, (r, failed_at - res[1].value)  # not 2 s more


def shut_down_before_the_failure_suite(folder):
    """Rank 1 shuts down and closes after its HVD_TIMEOUT (2 s); rank 2 shuts down too and
    waits for the others (60 s); rank 0, running, fails on rank 1's hang-up and tells every
    rank (Note [Failure fan-out]). Rank 2's core must not fail on that word: it had shut down,
    the failure is not its own. Rank 1 shuts down once rank 2 says it does, so rank 2 is
    shutting down when the word comes, 2 s later. Returns seconds in shutdown() on rank 2."""
    hvd = checks.init("shm")
    hvd.allreduce(np.ones(4, np.float32), name="warm-up")
    if hvd.rank() == 0:
        try:
            hvd.allreduce(np.ones(4, np.float32), name="needs-rank-1")
        except hvd.HorovodInternalError as error:
            hvd.shutdown()
            return str(error)
        return "no error"
    if hvd.rank() == 2:
        faults.announce(folder, "rank-2-shuts-down")
    else:
        faults.await_event(folder, "rank-2-shuts-down")
    t0 = time.monotonic()
    hvd.shutdown()
    return time.monotonic() - t0


def test_a_failure_told_to_a_rank_that_shut_down_ends_its_wait_without_failing_it(tmp_path):
    res = run_ranks(shut_down_before_the_failure_suite, 3, args=(str(tmp_path),), timeout=90,
                    env={"HVD_TIMEOUT": "60"}, rank_env={1: {"HVD_TIMEOUT": "2"}})
    assert "lost connection to rank 1: it shut down" in res[0].value, res[0].value
    assert res[2].value < 30, res[2].value  # not its own 60 s
    assert "core failed" not in res[2].stderr, res[2].stderr
