"""Point-to-point messages (engine_native.send/recv/isend/irecv; Note [Point-to-point] in
engine_native/csrc/runtime/peer_ops.cc) between real rank processes: every dtype and size (0-d,
empty, one element, odd, larger than a socket buffer) around a ring at np 2-4; tags taken out of
order, one tag in order, a message that arrives before its receive, point-to-point mixed with
collectives; bad arguments refused on the calling rank; the failures — a killed peer, a
stopped peer, abort() — each an error, never a hang; and the arrays of dropped requests let go
when the world ends.
"""
import os
import re
import signal
import time

import numpy as np
import pytest

from multiproc import checks, faults
from multiproc.checks import ALL_DTYPES, Failures, world_kwargs
from multiproc.harness import run_ranks

LARGE = 12 << 20  # bytes: more than the two 4 MiB socket buffers of a connection hold


def ring_suite(transport):
    hvd = checks.init(transport)
    fails = Failures()
    me, n = hvd.rank(), hvd.size()
    to, frm = (me + 1) % n, (me - 1) % n
    for dtype in ALL_DTYPES:
        for shape in ((), (0,), (1,), (1001,), (7, 3, 5), (LARGE // dtype.itemsize + 3,)):
            name = f"p2p.{dtype}.{shape}"
            sending = hvd.isend(checks.make_input(dtype, shape, me, name), to, tag=len(shape))
            got = hvd.recv(frm, tag=len(shape))
            sending.wait()
            want = checks.make_input(dtype, shape, frm, name)
            fails.check(name, None if got.dtype == want.dtype and got.shape == want.shape and
                        np.array_equal(got, want) else f"got {got.dtype} {got.shape}")
    # both directions of the ring at once in one batch, every rank receiving into out=
    left, right = np.zeros(5, np.int64), np.zeros(5, np.int64)
    hvd_ops = [hvd.P2POp(hvd.isend, np.full(5, me, np.int64), to, 9),
               hvd.P2POp(hvd.isend, np.full(5, -me, np.int64), frm, 9),
               hvd.P2POp(hvd.irecv, left, frm, 9), hvd.P2POp(hvd.irecv, right, to, 9)]
    for request in hvd.batch_isend_irecv(hvd_ops):
        request.wait()
    fails.expect("batch_isend_irecv both ways", left.tolist() == [frm] * 5 and
                 right.tolist() == [-to] * 5, f"{left} {right}")

    def isend(*args):  # another library's function of that name (torch.distributed.isend)
        raise AssertionError("a foreign isend was called")
    fails.expect_raises("a foreign isend is refused", ValueError,
                        lambda: hvd.P2POp(isend, left, to), "engine_native binding")
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_, transport", [(2, "shm"), (3, "tcp"), (4, "shm")],
                         ids=["np2", "np3-tcp", "np4"])
def test_every_dtype_and_size_around_a_ring(np_, transport):
    run_ranks(ring_suite, np_, args=(transport,), timeout=180, **world_kwargs(np_, transport))


def order_suite():
    hvd = checks.init("shm")
    me = hvd.rank()
    seen = {}
    if me == 0:
        for k in range(3):
            hvd.send(np.array([k]), 1, tag=1)
        hvd.send(np.array([10.0]), 1, tag=2)
        hvd.barrier()  # rank 1 posts its receive only after this message arrived
        hvd.send(np.arange(6, dtype=np.int16).reshape(2, 3), 1, tag=3)
        big = np.ones(LARGE, np.uint8)
        request = hvd.isend(big, 1, tag=4)  # not yet received while both allreduce
        seen["sum"] = float(hvd.allreduce(np.ones(2), op=hvd.Sum)[0])
        request.wait()
        seen["completed"] = request.is_completed()
    else:
        seen["tag2 first"] = float(hvd.recv(0, tag=2)[0])
        seen["tag1 in order"] = [int(hvd.recv(0, tag=1)[0]) for _ in range(3)]
        hvd.barrier()
        out = np.zeros((2, 3), np.int16)
        seen["into out"] = hvd.recv(0, tag=3, out=out) is out and out.tolist()
        seen["sum"] = float(hvd.allreduce(np.ones(2), op=hvd.Sum)[0])
        seen["big"] = int(hvd.recv(0, tag=4).sum())
    m = hvd.metrics()
    seen["counted"] = (m["p2p_sent"], m["p2p_sent_bytes"], m["p2p_received"],
                       m["p2p_received_bytes"])
    hvd.barrier()
    if me == 1:  # a wrong `out` is this rank's ValueError; the message is consumed, nothing hangs
        hvd.send(np.ones(3, np.float32), 0, tag=5)
    else:
        try:
            hvd.recv(1, tag=5, out=np.zeros(4, np.float32))
        except ValueError as exc:
            seen["mismatch"] = str(exc)
    hvd.shutdown()
    return seen


def test_tags_order_early_messages_and_collectives_between():
    zero, one = (r.value for r in run_ranks(order_suite, 2, timeout=120))
    sent = 3 * 8 + 8 + 6 * 2 + LARGE  # three int64, one float64, an int16 2x3, the big one
    assert zero == {"sum": 2.0, "completed": True, "counted": (6, sent, 0, 0),
                    "mismatch": "recv(from rank 1, tag 5): the message is float32 (3,), out is "
                                "float32 (4,)"}
    assert one == {"tag2 first": 10.0, "tag1 in order": [0, 1, 2], "sum": 2.0,
                   "counted": (0, 0, 6, sent),
                   "into out": [[0, 1, 2], [3, 4, 5]], "big": LARGE}


def bad_arguments_suite():
    from engine_native import _core
    hvd = checks.init("shm")
    errors = []
    for call in (lambda: hvd.send(np.ones(1), 2), lambda: hvd.recv(-1),
                 lambda: hvd.send(np.ones(1), hvd.rank()), lambda: hvd.recv(1 - hvd.rank(), tag=-3),
                 # from 2**40 up the bindings' own tags (gradients, pipeline hand-offs)
                 lambda: hvd.isend(np.ones(1), 1 - hvd.rank(), tag=1 << 40),
                 lambda: hvd.P2POp(hvd.isend, np.ones(1), 1 - hvd.rank(), 1.5),
                 lambda: hvd.send(np.array(["text"]), 1 - hvd.rank()),
                 lambda: _core.p2p_send(1 - hvd.rank(), 0, 7, (4,), np.ones(2, np.float32))):
        try:
            call()
            errors.append(None)
        except (ValueError, TypeError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    hvd.send(np.ones(1), 1 - hvd.rank(), tag=np.int64(5))  # the world is intact (NumPy tags)
    ok = float(hvd.recv(1 - hvd.rank(), tag=5)[0]) == 1.0
    hvd.shutdown()
    return errors, ok


def test_bad_arguments_are_refused_on_the_calling_rank():
    for r in run_ranks(bad_arguments_suite, 2, timeout=60):
        errors, ok = r.value
        other = 1 - r.rank
        assert ok and errors == [
            "ValueError: send to rank 2 (tag 0): no such rank; ranks are 0..1",
            "ValueError: recv from rank -1 (tag 0): no such rank; ranks are 0..1",
            (f"ValueError: send to rank {r.rank} (tag 0): this is the rank itself; "
             "point-to-point needs another rank"),
            "ValueError: recv: tag must be an int in [0, 2**40), got -3",
            "ValueError: isend: tag must be an int in [0, 2**40), got 1099511627776",
            "ValueError: P2POp: tag must be an int in [0, 2**40), got 1.5",
            (f"TypeError: send('to rank {other}, tag 0'): unsupported dtype <U4; supported: "
             + errors[6].split("supported: ", 1)[1]),
            (f"ValueError: send(to rank {other}, tag 0): the buffer holds 8 bytes, its dtype "
             "and shape need 16")], errors


def killed_peer_suite(folder):
    hvd = checks.init("shm")
    if hvd.rank() == 0:
        faults.await_event(folder, "receiving")
        os.kill(os.getpid(), signal.SIGKILL)
    request = hvd.irecv(0, tag=1)
    faults.announce(folder, "receiving")
    start = time.monotonic()
    try:
        request.wait()
        return None, 0.0
    except hvd.HorovodInternalError as exc:
        return str(exc), time.monotonic() - start


def test_a_killed_peer_fails_the_receive_at_once(tmp_path):
    res = run_ranks(killed_peer_suite, 2, args=(str(tmp_path),), timeout=60, check=False,
                    env={"HVD_TIMEOUT": "30"})
    assert res[0].returncode == -signal.SIGKILL, res[0].describe()
    error, took = res[1].value
    # the lost connection, not the receive's timeout (30 s), and which receive it ended
    assert error and error.startswith("recv from rank 0 (tag 1): lost connection to rank 0") \
        and took < 5, (error, took)


def stopped_peer_suite(folder, own_pid_namespace=False):
    """Rank 0 stops; rank 1's receive from it times out. ``own_pid_namespace``: rank 0 says it
    is in another pid namespace (a container on the same kernel), where its pid would name
    some other process here, so rank 1 must not read that pid's state."""
    if own_pid_namespace and int(os.environ["HVD_RANK"]) == 0:
        from engine_native import bootstrap
        bootstrap.pid_namespace = lambda: "pid:[another container]"
    hvd = checks.init("shm")
    if hvd.rank() == 0:
        faults.write_pid(folder, "stopped")
        os.kill(os.getpid(), signal.SIGSTOP)
        hvd.shutdown()
        return None
    start = time.monotonic()
    try:
        hvd.recv(0, tag=9)
        error = None
    except hvd.HorovodInternalError as exc:
        error = str(exc)
    took = time.monotonic() - start
    faults.kill_by_pid_file(folder, "stopped")
    return error, took


def test_a_stopped_peer_times_the_receive_out_naming_peer_and_tag(tmp_path):
    res = run_ranks(stopped_peer_suite, 2, args=(str(tmp_path),), timeout=60, check=False,
                    env={"HVD_TIMEOUT": "2"})
    assert res[0].returncode == -signal.SIGKILL, res[0].describe()
    error, took = res[1].value
    # rank 0 shares this machine: its state says why (runtime/stopped_ranks.h)
    assert re.fullmatch(r"recv from rank 0 \(tag 9\): no byte came from that rank for 2 s "
                        r"\(HVD_TIMEOUT\): it is stopped, stuck, or never sends this tag; rank "
                        r"0 \(pid \d+\) is stopped \(SIGSTOP or a debugger\)", error), error
    assert 2 <= took < 2 + 1, took


def test_a_peer_of_another_pid_namespace_is_not_judged_by_its_pid(tmp_path):
    res = run_ranks(stopped_peer_suite, 2, args=(str(tmp_path), True), timeout=60, check=False,
                    env={"HVD_TIMEOUT": "2"})
    assert res[0].returncode == -signal.SIGKILL, res[0].describe()
    error, _ = res[1].value
    assert error == ("recv from rank 0 (tag 9): no byte came from that rank for 2 s "
                     "(HVD_TIMEOUT): it is stopped, stuck, or never sends this tag"), error


def stopped_receiver_suite(folder):
    hvd = checks.init("shm")
    if hvd.rank() == 1:
        faults.write_pid(folder, "stopped")
        os.kill(os.getpid(), signal.SIGSTOP)
        return None
    start = time.monotonic()
    try:  # far more than the connection's socket buffers take without a reader
        hvd.send(np.ones(8 * LARGE, np.uint8), 1, tag=2)
        error = None
    except hvd.HorovodInternalError as exc:
        error = str(exc)
    took = time.monotonic() - start
    faults.kill_by_pid_file(folder, "stopped")
    return error, took


def test_a_send_to_a_stopped_receiver_fails_the_rank_naming_peer_and_tag(tmp_path):
    """Note [Point-to-point] D: the half-written frame makes the connection unusable."""
    res = run_ranks(stopped_receiver_suite, 2, args=(str(tmp_path),), timeout=60, check=False,
                    env={"HVD_TIMEOUT": "2"})
    assert res[1].returncode == -signal.SIGKILL, res[1].describe()
    error, took = res[0].value
    assert error and ("send to rank 1 (tag 2): the peer took no byte for 2 s (HVD_TIMEOUT): it "
                      "is stopped, stuck, or not reading") in error, error
    assert re.search(r"; rank 1 \(pid \d+\) is stopped \(SIGSTOP", error), error
    assert took < 2 + 2, took


def abort_suite(folder):
    import engine_native
    hvd = checks.init("shm")
    if hvd.rank() == 0:
        faults.await_event(folder, "receiving")
        engine_native.abort("test abort")
        return "aborted"
    request = hvd.irecv(0, tag=1)
    faults.announce(folder, "receiving")
    try:
        request.wait()
    except hvd.HorovodInternalError as exc:
        return str(exc)


def test_abort_fails_a_pending_receive_on_the_peer(tmp_path):
    res = run_ranks(abort_suite, 2, args=(str(tmp_path),), timeout=60)
    assert res[0].value == "aborted"
    assert "aborted on rank 0: test abort" in res[1].value, res[1].value


def dropped_requests_suite():
    """Requests dropped unfinished keep their arrays while the core may still use them, and
    only while it may: a world's end (shutdown, init) lets them go. Returns how many arrays are
    kept before and after shutdown()."""
    import engine_native.p2p as p2p
    hvd = checks.init("shm")
    out = np.empty(1 << 20, np.float32)
    hvd.irecv(1 - hvd.rank(), tag=5, out=out)  # never sent: dropped unfinished
    hvd.barrier()
    kept = len(p2p._in_use)
    hvd.shutdown()
    return kept, len(p2p._in_use)


def test_arrays_of_dropped_requests_go_when_the_world_ends():
    res = run_ranks(dropped_requests_suite, 2, timeout=60)
    assert [r.value for r in res] == [(1, 0), (1, 0)]
