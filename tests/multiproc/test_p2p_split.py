"""The split copy of a large point-to-point message between ranks of one host (Note [Split copy]
in engine_native/csrc/transport/peer_split.cc): each side copies half, straight between the two
processes' memory. Messages arrive whole and in order (one tag too), both ways at once (each
side's offer waits for the other's answer); a posted receive's out= is never written by the
peer (from 4 MiB the receiver reads it all, on two threads; below, it comes whole through the
ring); a receive into out= that ends while the helper thread reads never has out written
afterwards, the helper's end wakes a sleeping loop, and a forked child reads with a helper of
its own; an offer wakes a receiver that has no receive open; a receiver that cannot verify its
peer refuses and the messages go whole through the ring; a sender that cannot verify the
receiver writes nothing and the receiver reads it all; HVD_P2P_SPLIT_MIN_BYTES=0 never splits.
"""
import threading

import numpy as np

from multiproc import checks, faults
from multiproc.harness import run_ranks

BIG = (3 << 20) + 13  # bytes: over the 1 MiB default, not a whole number of pages


def exchange_suite():
    """Both ranks send each other two split messages and small ones between them, all posted
    at once; then a receive into out=. Returns what arrived and the split counters."""
    hvd = checks.init("shm")
    me, peer = hvd.rank(), 1 - hvd.rank()
    big = (np.arange(BIG, dtype=np.uint8) * (7 + me)).astype(np.uint8)
    wide = np.arange((5 << 20) // 8, dtype=np.float64) * (me + 1)
    requests = [hvd.irecv(peer, tag=t) for t in (1, 2, 3, 4, 6, 6)]
    sends = [hvd.isend(big, peer, tag=1), hvd.isend(np.array([me, 42]), peer, tag=2),
             hvd.isend(wide, peer, tag=3), hvd.isend(np.array([me, 43]), peer, tag=4),
             hvd.isend(big, peer, tag=6), hvd.isend(np.array([me, 44]), peer, tag=6)]
    got = [r.wait() for r in requests]
    for s in sends:
        s.wait()
    expect_big = (np.arange(BIG, dtype=np.uint8) * (7 + peer)).astype(np.uint8)
    expect_wide = np.arange((5 << 20) // 8, dtype=np.float64) * (peer + 1)
    out = np.zeros_like(wide)
    small_out = np.zeros(BIG, np.uint8)
    if me == 0:
        hvd.barrier()  # rank 1 posted its receives into out
        hvd.send(wide, 1, tag=5)
        hvd.send(big, 1, tag=7)
        into = None
    else:
        requests = [hvd.irecv(0, tag=5, out=out), hvd.irecv(0, tag=7, out=small_out)]
        hvd.barrier()
        into = [requests[0].wait() is out and bool(np.array_equal(out, expect_wide)),
                requests[1].wait() is small_out and bool(np.array_equal(small_out, expect_big))]
    hvd.barrier()
    m = hvd.metrics()
    hvd.shutdown()
    return {"big": bool(np.array_equal(got[0], expect_big)) and got[0].dtype == np.uint8,
            "small": [got[1].tolist(), got[3].tolist(), got[5].tolist()],
            "one tag": bool(np.array_equal(got[4], expect_big)),
            "wide": bool(np.array_equal(got[2], expect_wide)), "into": into,
            "split": (m["p2p_split_sent"], m["p2p_split_received"], m["p2p_split_refused"])}


def _run(env=None, rank_env=None):
    values = [r.value for r in run_ranks(exchange_suite, 2, env=env, rank_env=rank_env,
                                         timeout=90)]
    return values


def _arrived_whole(values):
    for me, v in enumerate(values):
        assert v["big"] and v["wide"] and v["one tag"], v
        assert v["small"] == [[1 - me, 42], [1 - me, 43], [1 - me, 44]], v
    assert values[1]["into"] == [True, True], values[1]


def test_large_messages_cross_both_ways_at_once_split_between_the_two_sides():
    values = _run()
    _arrived_whole(values)
    # (sent, received, refused): two big and one wide each way split; rank 1's posted out=
    # of 5 MiB read by rank 1 alone (a split both sides count), the one of 3 MiB went whole
    # (refused on both sides)
    assert values[0]["split"] == (4, 3, 1), values
    assert values[1]["split"] == (3, 4, 1), values


def test_no_split_below_the_threshold_or_when_turned_off():
    values = _run(env={"HVD_P2P_SPLIT_MIN_BYTES": "0"})
    _arrived_whole(values)
    assert [v["split"] for v in values] == [(0, 0, 0), (0, 0, 0)], values


def test_a_receiver_that_cannot_verify_its_peer_refuses_and_the_ring_carries_it():
    values = _run(rank_env={1: {"HVD_TEST_P2P_SPLIT_UNVERIFIED": "1"}})
    _arrived_whole(values)
    # rank 1 checks rank 0 once and refuses its offers: rank 0 sends them whole through the
    # ring (and offers nothing more); rank 1's own offers, accepted by rank 0, it cannot write
    # (rank 0 unverified): rank 0 reads those whole
    sent0, received0, refused0 = values[0]["split"]
    sent1, received1, refused1 = values[1]["split"]
    assert (sent0, received1) == (0, 0) and refused0 >= 1 and refused1 >= 1, values


def test_a_sender_that_cannot_verify_the_receiver_lets_it_read_everything():
    values = _run(rank_env={0: {"HVD_TEST_P2P_SPLIT_UNVERIFIED": "1"}})
    _arrived_whole(values)
    # rank 0 cannot verify rank 1: it refuses rank 1's offers and writes nothing of its own
    # first offer (rank 1 reads it all), then sends whole
    sent0, received0, refused0 = values[0]["split"]
    sent1, received1, refused1 = values[1]["split"]
    assert (sent1, received0) == (0, 0) and sent0 >= 1 and received1 >= 1, values
    assert refused0 >= 1 and refused1 >= 1, values


def unposted_suite(folder):
    """Rank 0 sends a split message before rank 1 has a receive open (rank 1 waits for the
    send to complete first): the offer must wake rank 1's sleeping loop, not wait for its idle
    tick (metrics()["tick_pickups"] counts passes that found work nothing woke them for)."""
    hvd = checks.init("shm")
    message = np.arange(BIG, dtype=np.uint8)
    hvd.barrier()
    if hvd.rank() == 0:
        hvd.send(message, 1, tag=9)
        faults.announce(folder, "sent")
        result = None
    else:
        before = hvd.metrics()["tick_pickups"]
        faults.await_event(folder, "sent")
        got = hvd.recv(0, tag=9)
        result = (bool(np.array_equal(got, message)), hvd.metrics()["tick_pickups"] - before,
                  hvd.metrics()["p2p_split_received"])
    hvd.barrier()
    hvd.shutdown()
    return result


def test_an_offer_wakes_a_receiver_with_no_receive_open(tmp_path):
    _, (whole, missed_wakes, split) = (r.value for r in run_ranks(
        unposted_suite, 2, args=(str(tmp_path),), timeout=60))
    assert whole and split == 1 and missed_wakes == 0, (whole, missed_wakes, split)


WIDE = 6 << 20  # bytes: a posted out= this large is read by the receiver alone (G)
WAKES = 3  # messages whose helper read's end must wake the loop


def helper_suite(folder, times_out):
    """Rank 1 posts receives into out= of WIDE bytes; the process's helper thread starts each
    of its halves late (HVD_TEST_HELPER_READ_DELAY_MS). times_out: HVD_TIMEOUT passes
    first, the receive fails, and out must not change afterwards; the message then goes whole
    to the next receive. Else WAKES receives complete while this thread only polls: the loop
    thread sleeps once its half is read, and each helper's end must wake it. tick_pickups
    counts passes that found work nothing woke them for: without the wake, every message's
    last pass is one; with it, only a wake that races a tick's end (Note [Tick pickups])."""
    hvd = checks.init("shm")
    message = (np.arange(WIDE // 4, dtype=np.float32) % 251) + 1  # no zero anywhere
    if hvd.rank() == 0:
        return faults.send_once_posted(hvd, folder,
                                       [message + k for k in range(1 if times_out else WAKES)])
    if not times_out:
        outs = [np.zeros_like(message) for _ in range(WAKES)]
        before = hvd.metrics()["tick_pickups"]
        requests = [hvd.irecv(0, tag=3 + tag, out=out) for tag, out in enumerate(outs)]
        faults.announce(folder, "posted")
        while not all(r.is_completed() for r in requests):  # the loop drives them, not us
            threading.Event().wait(0.002)  # a bounded poll of the core's state, not a nap
        result = ([r.wait() is out for r, out in zip(requests, outs)],
                  [bool(np.array_equal(out, message + tag)) for tag, out in enumerate(outs)],
                  hvd.metrics()["tick_pickups"] - before)
        hvd.barrier()
        hvd.shutdown()
        return result
    error, out = faults.failed_receive_into(hvd, folder, message)
    kept = out.copy()
    got = hvd.recv(0, tag=3)  # the whole message, in memory of its own, once the helper ends
    hvd.barrier()
    hvd.shutdown()
    return error, bool(np.array_equal(out, kept)), bool(np.array_equal(got, message))


def test_a_receive_into_out_that_ends_while_the_helper_reads_leaves_out_alone(tmp_path):
    res = run_ranks(helper_suite, 2, args=(str(tmp_path), True), timeout=60,
                    rank_env={1: {"HVD_TIMEOUT": "1",
                                  "HVD_TEST_HELPER_READ_DELAY_MS": "2500"}})
    assert res[0].value == "sent"
    error, untouched_after, whole = res[1].value
    assert error and "recv from rank 0 (tag 3)" in error, error
    assert untouched_after and whole, res[1].value


def test_the_helpers_end_wakes_the_sleeping_loop(tmp_path):
    res = run_ranks(helper_suite, 2, args=(str(tmp_path), False), timeout=60,
                    rank_env={1: {"HVD_TEST_HELPER_READ_DELAY_MS": "300"}})
    into, equal, missed_wakes = res[1].value
    assert all(into) and all(equal), res[1].value
    assert missed_wakes < WAKES, res[1].value  # (broken, each message's last pass is one)


def _read_all(hvd, value: float) -> bool:
    """Rank 0 sends WIDE bytes into rank 1's posted out= (read by rank 1 alone, on two
    threads); True where it arrived."""
    message = np.full(WIDE // 8, value)
    if hvd.rank() == 0:
        hvd.barrier()  # rank 1's receive is posted
        hvd.send(message, 1, tag=11)
        return True
    out = np.zeros_like(message)
    request = hvd.irecv(0, tag=11, out=out)
    hvd.barrier()
    return request.wait() is out and bool(np.array_equal(out, message))


def forked_suite():
    """A read-all in the parent leaves rank 1's helper thread waiting for work; then each rank
    shuts down and forks, and the children start the core again and read-all twice. A child
    inherits the helper's lock and conditions but not its thread: it must read with a thread
    and conditions of its own. The exit status of each child, or "hung"."""
    import os
    import signal
    import time
    hvd = checks.init("shm")
    assert _read_all(hvd, 1.0)
    hvd.shutdown()
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)  # (no child outlives its test, whatever happens to the rank)
        code = 1
        try:
            hvd = checks.init("shm")
            code = 0 if _read_all(hvd, 2.0) and _read_all(hvd, 3.0) else 2
            hvd.shutdown()
        except BaseException:  # noqa: BLE001 - the child's error, shown before it exits
            import traceback
            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        threading.Event().wait(0.05)  # a bounded poll of the child, not a nap
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


def test_a_forked_child_reads_all_with_a_helper_of_its_own():
    values = [r.value for r in run_ranks(forked_suite, 2, timeout=90,
                                         env={"HVD_TIMEOUT": "10"})]
    assert values == [0, 0], values
