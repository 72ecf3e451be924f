"""Point-to-point between ranks of one host goes through shared-memory rings (Note
[Point-to-point over shm] in engine_native/csrc/transport/peer_channel.cc), on spawned ranks.

The messages themselves (every dtype and size, order, faults) are test_p2p.py's, which runs on
shm by default; here the wake-ups: a loop thread asleep is woken by a message for a receive it
has open (B), not by one nobody asked for yet (B), and a caller driving its receive is not (C). Checks count events (Note [Tick pickups], the loop's
wake-ups), never time ratios.
"""
import os
import time

import numpy as np
import pytest

from multiproc import checks
from multiproc.harness import run_ranks

EXCHANGES = 20


def _counts(hvd, *names):
    m = hvd.metrics()
    return {k: m[k] for k in names}


def _polled(request):
    """The receive's result, polled rather than waited for: no caller drives it or sleeps on
    the doorbell for it (Note [Caller sleeps on the doorbell]), so only the loop thread reads
    its message."""
    while not request.is_completed():
        time.sleep(0.0005)
    return request.wait()


def async_ping_pong_suite():
    """Receives nobody waits on, with no caller spin (HVD_CALLER_SPIN_US=0): each message
    reaches a loop that sleeps, so only the writer's wake byte gets it read before the tick."""
    hvd = checks.init("shm")
    me, other = hvd.rank(), 1 - hvd.rank()
    hvd.barrier()
    before = _counts(hvd, "tick_pickups")
    for k in range(EXCHANGES):
        if me == 0:
            hvd.isend(np.full(3, k, np.int32), other, tag=k).wait()
            got = _polled(hvd.irecv(other, tag=k))
        else:
            got = _polled(hvd.irecv(other, tag=k))
            hvd.isend(got + 1, other, tag=k).wait()
        assert int(got[0]) == k + other, (k, got)  # rank 1 answers k + 1
    picked = _counts(hvd, "tick_pickups")["tick_pickups"] - before["tick_pickups"]
    hvd.shutdown()
    return picked


def test_a_message_wakes_the_sleeping_loop_thread():
    # Measured: 0 on both ranks. Without the wake byte (B), 13-15 of the 20 exchanges per
    # rank waited for the receiver's 200 ms tick.
    picked = [r.value for r in run_ranks(async_ping_pong_suite, 2, timeout=60,
                                         env={"HVD_CALLER_SPIN_US": "0"})]
    assert max(picked) <= 2, f"messages found only at the idle tick: {picked}"


UNASKED = 50


def unasked_messages_suite():
    """Messages nobody has asked for yet stay in the ring: the receiver's loop thread, asleep
    in a barrier it does not drive (HVD_CALLER_SPIN_US=0), is not woken for them (B); the
    receives after the barrier find them there."""
    hvd = checks.init("shm")
    me, other = hvd.rank(), 1 - hvd.rank()
    hvd.barrier()
    before = _counts(hvd, "loop_wakeups")["loop_wakeups"]
    if me == 0:
        for k in range(UNASKED):
            hvd.send(np.full(2, k, np.int64), other, tag=k)
    hvd.barrier()
    woke = _counts(hvd, "loop_wakeups")["loop_wakeups"] - before
    if me == 1:
        got = [int(hvd.recv(other, tag=k)[0]) for k in range(UNASKED)]
        assert got == list(range(UNASKED)), got
    hvd.shutdown()
    return woke


def test_a_message_nobody_asked_for_does_not_wake_the_receiver():
    # Measured: rank 1's loop woke 1-3 times over the 50 sends and the barrier; when every
    # message woke it, 52 (3 runs of 4; in the fourth rank 1 reached the barrier late).
    woke = run_ranks(unasked_messages_suite, 2, timeout=60, env={"HVD_CALLER_SPIN_US": "0"})
    assert woke[1].value <= 10, [r.value for r in woke]


DRIVEN = 500


def driven_ping_pong_suite():
    """Blocking send and receive are driven by their callers, who read the rings every pass:
    a writer that sees the peer's `driving` mark sends no wake byte to its sleeping loop."""
    hvd = checks.init("shm")
    me, other = hvd.rank(), 1 - hvd.rank()
    message = np.ones(4, np.float32)
    hvd.barrier()
    before = _counts(hvd, "loop_wakeups", "caller_driven_ops")
    start = time.monotonic()
    for _ in range(DRIVEN):
        if me == 0:
            hvd.send(message, other)
            hvd.recv(other)
        else:
            hvd.recv(other)
            hvd.send(message, other)
    after = _counts(hvd, "loop_wakeups", "caller_driven_ops")
    took = time.monotonic() - start
    hvd.shutdown()
    return {k: after[k] - before[k] for k in before}, took


def test_a_driving_caller_is_not_woken_through_its_loop():
    # A spin long enough that no caller gives up inside the exchanges (a give-up wakes the
    # loop thread itself); what remains is the loop's idle tick, one per 200 ms the exchanges
    # took. Measured at 500 exchanges: 0-2 wake-ups per rank on a quiet machine, 10-26 with
    # two busy processes beside it (the exchanges took seconds: ticks); with the writers
    # ignoring `driving` (C), 79-425 per rank on the quiet machine.
    res = run_ranks(driven_ping_pong_suite, 2, timeout=60,
                    env={"HVD_CALLER_SPIN_US": "200000"})
    for r in res:
        counts, took = r.value
        assert counts["caller_driven_ops"] >= DRIVEN, counts
        ticks = took / 0.2
        assert counts["loop_wakeups"] <= ticks + 10, (counts, f"{took:.2f} s")


def eager_isend_suite():
    """An isend is written by its caller when no pass runs (Note [Caller drives] H): the
    sender's loop thread is not woken for it."""
    hvd = checks.init("shm")
    me, other = hvd.rank(), 1 - hvd.rank()
    hvd.barrier()
    before = _counts(hvd, "loop_wakeups")
    start = time.monotonic()
    late = 0  # isends not yet in the ring when the call returned (the loop thread held the lock)
    if me == 0:
        for k in range(DRIVEN):
            request = hvd.isend(np.full(4, k, np.float32), other, tag=3)
            late += not request.is_completed()
            request.wait()
    else:
        got = [float(hvd.recv(other, tag=3)[0]) for _ in range(DRIVEN)]
        assert got == [float(k) for k in range(DRIVEN)], got[:10]
    woke = _counts(hvd, "loop_wakeups")["loop_wakeups"] - before["loop_wakeups"]
    took = time.monotonic() - start
    hvd.shutdown()
    return woke, late, took


def test_an_isend_is_written_by_its_caller():
    # Measured: 0 wake-ups of the sender's loop for 500 isends; with every isend waking the
    # loop thread instead (before H), 500-501, and isend returned before the frame was written.
    res = run_ranks(eager_isend_suite, 2, timeout=60)
    woke, late, took = res[0].value
    assert woke <= took / 0.2 + 10, (woke, f"{took:.2f} s")
    assert late <= took / 0.2 + 10, (late, f"{took:.2f} s")


LATE_RECVS = 8


def late_neighbour_suite():
    """A pipeline stage's receive waits for its neighbour's compute: its spin runs out. Such
    misses back off point-to-point waits' own spins, never the collectives' (Note [Caller
    drives] H)."""
    hvd = checks.init("shm")
    me, other = hvd.rank(), 1 - hvd.rank()
    hvd.barrier()
    skipped0 = hvd.metrics()["caller_spin_skipped"]
    for k in range(LATE_RECVS):  # rank 1 "computes" 20 ms: rank 0's 2 ms spins run out
        if me == 0:
            hvd.irecv(other, tag=k).wait()
        else:
            time.sleep(0.02)
            hvd.send(np.ones(1, np.float32), other, tag=k)
    skipped1 = hvd.metrics()["caller_spin_skipped"]
    # Two collectives: a spin is skipped only after 3 misses in a row (Note [Spin backoff]), so
    # these two skip nothing unless the receives' misses were counted against them, however
    # loaded the host (two of their own could run out; 20 allreduces here on a loaded host
    # backed off alone).
    hvd.barrier()
    hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum, name="after")
    skipped2 = hvd.metrics()["caller_spin_skipped"]
    hvd.shutdown()
    return skipped1 - skipped0, skipped2 - skipped1


def test_late_receives_back_off_their_own_spin_not_the_collectives():
    # Measured: rank 0 skipped 4 of the 8 late receives' spins (3 misses, then a probe), 0 in
    # the collectives. With the receives' misses in the collectives' record (one record): 5
    # then 2; with no backoff for point-to-point (before): 0 then 0, every late receive
    # spinning its whole budget while the neighbour computed.
    res = run_ranks(late_neighbour_suite, 2, timeout=60, env={"HVD_CALLER_SPIN_US": "2000"})
    late, after = res[0].value
    assert late >= 1 and after == 0, (late, after)


LATE_WAITS = 8


def late_waits_suite():
    """A receive whose message comes after its caller's spin ran out (the neighbour
    "computes" 20 ms): the caller sleeps on its rank's peer doorbell, the writer wakes it and
    it reads the message itself (Note [Caller sleeps on the doorbell]); the loop thread, asleep
    watching everything, is woken neither when the spin gives up nor for the message (Note
    [Caller drives] I)."""
    hvd = checks.init("shm")
    me, other = hvd.rank(), 1 - hvd.rank()
    hvd.barrier()
    before = _counts(hvd, "loop_wakeups")["loop_wakeups"]
    start = time.monotonic()
    got = []
    for k in range(LATE_WAITS):
        if me == 0:
            got.append(int(hvd.recv(other, tag=k)[0]))
        else:
            time.sleep(0.02)
            hvd.send(np.full(2, k, np.int16), other, tag=k)
    woke = _counts(hvd, "loop_wakeups")["loop_wakeups"] - before
    took = time.monotonic() - start
    hvd.shutdown()
    if me == 0:
        assert got == list(range(LATE_WAITS)), got
    return woke, took


def test_a_late_message_wakes_its_waiting_caller_not_the_loop_thread():
    # Measured: rank 0's loop woke 0-2 times for 8 late receives; with the loop thread woken
    # when the spin gave up and reading the message (before), 16-17: two wake-ups per receive,
    # each followed by the caller's own.
    res = run_ranks(late_waits_suite, 2, timeout=60, env={"HVD_CALLER_SPIN_US": "200"})
    woke, took = res[0].value
    assert woke <= took / 0.2 + LATE_WAITS // 2, (woke, f"{took:.2f} s")


def interrupted_receive_suite():
    """Ctrl-C reaches a caller asleep on the doorbell in a receive nothing will answer (its
    wait runs in slices that see signals): KeyboardInterrupt, and the rank goes on."""
    import os
    import signal
    import threading

    hvd = checks.init("shm")
    me, other = hvd.rank(), 1 - hvd.rank()
    hvd.barrier()
    waited = None
    if me == 0:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sent = []
        timer = threading.Timer(0.3, lambda: (sent.append(time.monotonic()),
                                              os.kill(os.getpid(), signal.SIGINT)))
        timer.start()
        try:
            hvd.recv(other, tag=7)
            waited = "no interrupt"
        except KeyboardInterrupt:
            waited = time.monotonic() - sent[0]
        timer.join()
    hvd.barrier()  # the rank goes on
    hvd.shutdown()
    return waited


def test_ctrl_c_interrupts_a_receive_asleep_on_the_doorbell():
    res = run_ranks(interrupted_receive_suite, 2, timeout=60)
    waited = res[0].value
    assert isinstance(waited, float) and waited < 5.0, waited


SPUN_WAITS = 6


def spin_while_core_free_suite():
    """Receives whose message comes ~3 ms late, past HVD_CALLER_SPIN_US: where the ranks are
    bound to their own CPUs and the host has a core free (both forced or not per test) their
    callers spin on, up to HVD_P2P_SPIN_MAX_US (Note [Spin while a core is free])."""
    hvd = checks.init("shm")
    me, other = hvd.rank(), 1 - hvd.rank()
    hvd.barrier()
    before = _counts(hvd, "caller_spin_extended")["caller_spin_extended"]
    for k in range(SPUN_WAITS):
        if me == 0:
            assert int(hvd.recv(other, tag=k)[0]) == k
        else:
            time.sleep(0.003)
            hvd.send(np.full(2, k, np.int16), other, tag=k)
    extended = _counts(hvd, "caller_spin_extended")["caller_spin_extended"] - before
    hvd.shutdown()
    return extended


def one_cpu_spin_suite():
    """spin_while_core_free_suite with both ranks on one CPU: bound, they share it."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    return spin_while_core_free_suite()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="binds two ranks to a CPU each")
def test_a_late_receive_spins_past_its_budget_only_between_bound_ranks_with_a_core_free():
    # Measured: bound with a core free, all 6 receives spun past their budget (a rank 0 late
    # enough to find its message there spins no more: hence >= 1); with no core free, or
    # unbound, or bound to one CPU that both share (Note [CPU binding] C), none may (Note
    # [Spin while a core is free] A, B), whatever the load. With the extension removed: 0 in
    # the first case too; with it allowed for every bound rank, 6 in the last.
    env = {"HVD_CALLER_SPIN_US": "200", "HVD_P2P_SPIN_MAX_US": "1000000"}
    free = {**env, "HVD_CPU_BIND": "core", "HVD_TEST_CORE_FREE": "1"}
    busy = {**env, "HVD_CPU_BIND": "core", "HVD_TEST_CORE_FREE": "0"}
    unbound = {**env, "HVD_CPU_BIND": "none", "HVD_TEST_CORE_FREE": "1"}
    counts = [run_ranks(spin_while_core_free_suite, 2, timeout=60, env=e)[0].value
              for e in (free, busy, unbound)]
    counts.append(run_ranks(one_cpu_spin_suite, 2, timeout=60, env=free)[0].value)
    assert counts[0] >= 1 and counts[1:] == [0, 0, 0], counts
