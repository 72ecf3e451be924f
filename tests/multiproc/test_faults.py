"""Failures must be errors, never hangs: lost ranks, mismatches, misuse, stalls, hostile peers."""
import os
import re
import signal
import threading
import time

import numpy as np
import pytest

from multiproc import checks, faults
from multiproc.checks import Failures
from multiproc.harness import run_ranks

HVD_TIMEOUT = 4.0
FAULT_ENV = {"HVD_TIMEOUT": str(HVD_TIMEOUT)}


def _big_as_executed(hvd):
    """How "big" ended on this rank, from the core's recent-events ring: ``(op, error,
    duration_us)`` of the span the executor recorded, or None when it never ran (it failed
    before every rank had submitted it). The ring is fed by the timeline's writer thread
    every 20-80 ms, so an event recorded at the failure may take that long to show."""
    deadline = time.monotonic() + 5
    while True:
        spans = [e for e in hvd.timeline_events() if "big" in e[1] and e[2] == "op"]
        if spans or time.monotonic() > deadline:
            return (spans[-1][3], spans[-1][5], spans[-1][4]) if spans else None
        threading.Event().wait(0.02)


def killed_rank_suite(transport, mode):
    """The last rank dies by SIGKILL, before "big" (mode "before") or while its bytes move
    ("during"); survivors must fail within HVD_TIMEOUT naming it, and keep failing fast (not
    hang) on the next op and in shutdown. Each survivor also says whether "big" had started
    executing when it failed (the proof of where the kill landed)."""
    hvd = checks.init(transport)
    n, me = hvd.size(), hvd.rank()
    victim = n - 1
    big = np.ones(16 << 20, np.float32)  # 64 MiB: many chunks, a transfer of tens of ms
    hvd.allreduce(np.ones(8), name="warm-up")
    if me == victim:
        if mode == "during":  # once every rank submitted "big" and its chunks are moving;
            # if it finishes first, the survivors' checks report that the kill came too late
            faults.wait_until_running(hvd, "big", hvd.allreduce_async(big, op=hvd.Sum, name="big"))
        os.kill(os.getpid(), signal.SIGKILL)
    errors, times = [], []
    for name in ("big", "next-op"):
        start = time.monotonic()
        try:
            hvd.allreduce(big if name == "big" else np.ones(4), op=hvd.Sum, name=name)
            errors.append(None)
        except hvd.HorovodInternalError as exc:
            errors.append(str(exc))
        times.append(time.monotonic() - start)
    executed = _big_as_executed(hvd)
    start = time.monotonic()
    hvd.shutdown()
    times.append(time.monotonic() - start)
    return errors, times, executed


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("mode", ["before", "during"])
def test_killed_rank_fails_survivors_in_bounded_time(transport, mode):
    res = run_ranks(killed_rank_suite, 3, args=(transport, mode), timeout=90, check=False,
                    **checks.world_kwargs(3, transport, FAULT_ENV))
    victim = res[-1]
    assert victim.returncode == -signal.SIGKILL, victim.describe()
    for r in res[:-1]:
        assert r.ok and r.returncode == 0, r.describe()
        errors, times, executed = r.value
        assert errors[0] is not None, (f"rank {r.rank}: 'big' succeeded: the kill landed after "
                                       f"its transfer ended ({executed})")
        if mode == "during":
            assert executed is not None, (
                f"rank {r.rank}: the kill landed before 'big' started moving bytes (it failed "
                f"without being executed: {errors[0]!r})")
            op, error, _ = executed
            assert op == "ALLREDUCE" and error, (
                f"rank {r.rank}: 'big' ran as {op!r} with error {error!r}: not a transfer cut "
                f"off by the kill")
        else:
            assert executed is None, f"rank {r.rank}: 'big' was executed ({executed})"
        assert all(errors), f"rank {r.rank}: an op succeeded after rank 2 died: {errors}"
        assert re.search(r"\brank 2\b", errors[0]), f"rank {r.rank}: {errors[0]!r}"
        bound = 2 * HVD_TIMEOUT + 5
        assert max(times) < bound, f"rank {r.rank}: took {times} s (bound {bound} s)"


def mismatch_suite(transport):
    """Every kind of cross-rank mismatch: the same error on every rank; the next op works."""
    hvd = checks.init(transport)
    n, me = hvd.size(), hvd.rank()
    cases = {
        "shape": lambda: hvd.allreduce(np.ones(me + 2, np.float32), name="m.shape"),
        "dtype": lambda: hvd.allreduce(np.ones(4, np.float64 if me == 0 else np.float32),
                                       name="m.dtype"),
        "op": lambda: hvd.allreduce(np.ones(4), op=hvd.Max if me == 0 else hvd.Sum,
                                    name="m.op"),
        "root": lambda: hvd.broadcast(np.ones(4), root_rank=me, name="m.root"),
        "ndim": lambda: hvd.allgather(np.ones((2, me + 1)), name="m.gather"),
    }
    outcome = {}
    for case, call in cases.items():
        try:
            call()
            outcome[case] = None
        except hvd.HorovodInternalError as exc:
            outcome[case] = str(exc)
        out = hvd.allreduce(np.full(3, me, np.int64), op=hvd.Sum, name=f"after.{case}")
        outcome[case + ".next"] = bool(np.all(out == n * (n - 1) // 2))
    hvd.shutdown()
    return outcome


@pytest.mark.parametrize("np_, transport", [(3, "shm"), (2, "tcp")], ids=["shm-np3", "tcp-np2"])
def test_mismatches_fail_identically_everywhere(np_, transport):
    res = run_ranks(mismatch_suite, np_, args=(transport,), timeout=120,
                    **checks.world_kwargs(np_, transport))
    words = {"shape": "shape", "dtype": "type", "op": "op", "root": "root", "ndim": "shape"}
    for case in ("shape", "dtype", "op", "root", "ndim"):
        messages = [r.value[case] for r in res]
        assert all(messages), f"{case}: some rank got no error: {messages}"
        assert len(set(messages)) == 1, f"{case}: ranks got different errors: {messages}"
        assert re.search(r"\branks? \d", messages[0]), f"{case}: no rank named: {messages[0]}"
        assert words[case] in messages[0].lower(), f"{case}: {messages[0]}"
        assert all(r.value[case + ".next"] for r in res), f"next op after {case} failed"


def local_misuse_suite():
    """Duplicate in-flight names and bad alltoall splits: ValueError locally, nothing sent.

    Rank r tests the duplicate on op ``dup.r``, which rank r+1 withholds until r is done, so
    the op is provably still in flight on r (ordering by the rendezvous, not by sleeping)."""
    hvd = checks.init()
    n, me = hvd.size(), hvd.rank()
    oob = checks.out_of_band()
    fails = Failures()
    handles = {me: hvd.allreduce_async(np.ones(4), op=hvd.Sum, name=f"dup.{me}")}
    try:
        hvd.allreduce_async(np.ones(4), name=f"dup.{me}")
        fails.items.append("duplicate in-flight name: no error")
    except ValueError as exc:
        fails.expect("duplicate named", f"dup.{me}" in str(exc), str(exc))
    oob.set(f"dup-tested/{me}", b"1")
    for q in range(n):
        if q != me:
            if me == (q + 1) % n:
                oob.get(f"dup-tested/{q}", timeout=30)
            handles[q] = hvd.allreduce_async(np.ones(4), op=hvd.Sum, name=f"dup.{q}")
    for q, h in handles.items():
        fails.expect(f"dup.{q} result", np.all(hvd.synchronize(h) == n))
    for splits in ([1] * (n + 1), [-1] + [1] * (n - 1), [100] * n, [0.5] * n):
        try:
            hvd.alltoall(np.ones(n), splits=splits, name="bad-splits")
            fails.items.append(f"splits {splits}: no error")
        except (ValueError, TypeError):
            pass
    out, received = hvd.alltoall(np.full(n, me), splits=[1] * n, name="good-splits")
    fails.expect("alltoall after bad splits", list(out) == list(range(n)), f"{out}")
    oob.close()
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_", [2, 3])
def test_duplicate_names_and_bad_splits_are_local_value_errors(np_):
    run_ranks(local_misuse_suite, np_, timeout=120)


def stall_suite():
    """Ranks 0 and 1 submit 'stall_me'; rank 2 holds back until rank 0's stderr shows the stall
    warning (rank 0 reads its own stderr file), then submits, and everything completes."""
    hvd = checks.init()
    me = hvd.rank()
    oob = checks.out_of_band()
    if me == 2:
        oob.get("stall-seen", timeout=40)
    handle = hvd.allreduce_async(np.ones(4), op=hvd.Sum, name="stall_me")
    if me == 0:
        err_path = os.readlink("/proc/self/fd/2")
        deadline = time.monotonic() + 30
        seen = False
        while not seen and time.monotonic() < deadline:
            with open(err_path, errors="replace") as fh:
                seen = "Missing ranks" in fh.read()
            if not seen:
                time.sleep(0.2)  # polling a log file for the expected line
        oob.set("stall-seen", b"1")
    out = hvd.synchronize(handle)
    oob.close()
    hvd.shutdown()
    return float(out[0])


def test_stall_warning_names_missing_rank():
    res = run_ranks(stall_suite, 3, timeout=90, env={"HVD_STALL_CHECK_TIME": "2"})
    assert [r.value for r in res] == [3.0, 3.0, 3.0]
    err = res[0].stderr
    assert "Missing ranks" in err, err[-3000:]
    assert re.search(r"^.*\b2: \[[^\]]*stall_me", err, re.M), err[-3000:]
    assert not re.search(r"^.*\b1: \[[^\]]*stall_me", err, re.M), "rank 1 was not missing"


def _send_hello_with_wrong_secret(address, acceptor_rank):
    """Step A of the core's mesh handshake (csrc/transport/tcp/handshake.cc) done right, then a
    made-up proof: the acceptor must hang up."""
    import socket
    import struct

    job = (os.environ["HVD_JOB_ID"] + "-1").encode()
    with socket.create_connection(address, timeout=HVD_TIMEOUT + 10) as s:
        hello = struct.pack("<IHBBii", 0x48445648, 1, 1, len(job), 0, acceptor_rank)
        try:
            s.sendall(hello + os.urandom(32) + job)
            if s.recv(4 + 32 + 32):  # a challenge: answer it with a made-up proof
                s.sendall(os.urandom(32))
        except (ConnectionResetError, BrokenPipeError):
            return True  # dropped before the challenge
        return _closed(s)


def _closed(sock):
    """True once the peer hung up (EOF or reset); a socket timeout propagates as a failure."""
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def hostile_suite(transport):
    """Garbage, silence and a wrong-secret handshake against every rank's listener, while the
    job keeps running collectives."""
    import socket

    hvd = checks.init(transport)
    n, me = hvd.size(), hvd.rank()
    fails = Failures()
    host, port = hvd.listen_address()
    try:  # connect, say nothing, hold the connections open
        silent = [socket.create_connection((host, port), timeout=5) for _ in range(3)]
    except ConnectionRefusedError as exc:
        raise AssertionError(f"rank {me}: nothing listens on {host}:{port} once the mesh "
                             f"formed ({exc}): the attacks below would test nothing") from None
    with socket.create_connection((host, port), timeout=HVD_TIMEOUT + 10) as s:
        s.sendall(os.urandom(4096))
        fails.expect("random bytes dropped", _closed(s))
    with socket.create_connection((host, port), timeout=HVD_TIMEOUT + 10) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        fails.expect("http dropped", _closed(s))
    fails.expect("wrong secret dropped", _send_hello_with_wrong_secret((host, port), me))
    for i in range(5):
        out = hvd.allreduce(np.full(1000, me, np.int64), op=hvd.Sum, name=f"during-attack.{i}")
        fails.expect(f"allreduce {i}", np.all(out == n * (n - 1) // 2))
    for s in silent:
        s.settimeout(HVD_TIMEOUT + 30)
        fails.expect("silent connection eventually dropped", _closed(s))
        s.close()
    out = hvd.allreduce(np.ones(3), op=hvd.Sum, name="after-attack")
    fails.expect("after attack", np.all(out == n))
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_, transport", [(2, "shm"), (3, "tcp")], ids=["shm-np2", "tcp-np3"])
def test_hostile_connections_are_dropped_and_job_continues(np_, transport):
    run_ranks(hostile_suite, np_, args=(transport,), timeout=120,
              **checks.world_kwargs(np_, transport, FAULT_ENV))


def silent_crowd_at_init(count):
    """Rank 1 opens ``count`` connections to rank 0's listener that never speak, then joins."""
    import json
    import socket

    import engine_native as hvd
    from engine_native.rendezvous import RendezvousClient

    silent = []
    if os.environ["HVD_RANK"] == "1":
        # Where rank 0 listens, as its init() publishes it (engine_native/bootstrap.py).
        with RendezvousClient(os.environ["HVD_RENDEZVOUS"],
                              bytes.fromhex(os.environ["HVD_SECRET"])) as store:
            key = f"{os.environ['HVD_JOB_ID']}/init1/0"
            _, host, port = json.loads(store.get(key, timeout=60))[:3]
        silent = [socket.create_connection((host, port), timeout=5) for _ in range(count)]
    hvd.init()
    out = hvd.allreduce(np.ones(3), op=hvd.Sum, name="after-crowd")
    for s in silent:
        s.close()
    hvd.shutdown()
    return bool(np.all(out == 2))


def test_silent_connections_during_init_do_not_delay_the_ranks():
    # Each of the 20 would hold a one-at-a-time acceptor for 2 s: 40 s against HVD_TIMEOUT=4.
    results = run_ranks(silent_crowd_at_init, 2, args=(20,), timeout=90, env=FAULT_ENV)
    assert [r.value for r in results] == [True, True]
