"""Rank-side set-ups of the fault tests, and the check they share: a rank that stops or dies
while its executor runs a chosen op, a pid file through which one rank kills another, and a
hung peer (SIGSTOP) that the others must time out on naming it.

A rank cannot be killed from the test process at a chosen point of an op (the parent does not
see the op), so the ranks do it themselves: they poll the core's metrics for the op the
executor is running (``metrics()["current"]``).
"""
from __future__ import annotations

import os
import re
import signal
import threading
import time

import numpy as np


def timed_wait(handle) -> tuple:
    """``(error text or None, seconds)`` of waiting on a core handle that may fail."""
    from engine_native import _core
    t0 = time.monotonic()
    try:
        _core.wait(handle)
        error = None
    except _core.HorovodInternalError as exc:
        error = str(exc)
    return error, time.monotonic() - t0


def wait_until_running(hvd, name: str, handle=None, timeout: float = 60.0) -> bool:
    """Poll until this rank's executor runs an op whose name contains ``name``: True then;
    False when ``handle`` completed or ``timeout`` passed first."""
    deadline = time.monotonic() + timeout
    while name not in ((hvd.metrics()["current"] or {}).get("name") or ""):
        if (handle is not None and hvd.poll(handle)) or time.monotonic() > deadline:
            return False
        threading.Event().wait(0.0005)  # a bounded poll of the core's state, not a nap
    return True


def wait_until_pending(hvd, name: str, waits_for=None, timeout: float = 60.0) -> None:
    """Poll until this rank's ``metrics()["pending"]`` lists an op named ``name`` (and, with
    ``waits_for``, missing exactly those ranks: on the board, Note [One round] G); the list is
    refreshed every 200 ms. AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not any(p["name"] == name and (waits_for is None or p["missing_ranks"] == waits_for)
                  for p in hvd.metrics()["pending"]):
        assert time.monotonic() < deadline, \
            f"{name!r} not pending here after {timeout} s: {hvd.metrics()['pending']}"
        threading.Event().wait(0.01)  # a bounded poll of the core's state, not a nap


def announce(folder: str, event: str) -> None:
    """Tell the other ranks that ``event`` happened here (they :func:`await_event` it): an
    explicit handshake, where a sleep would only make one order likely."""
    with open(os.path.join(folder, event + ".tmp"), "w"):
        pass
    os.replace(os.path.join(folder, event + ".tmp"), os.path.join(folder, event))


def await_event(folder: str, event: str, timeout: float = 60.0) -> None:
    """Return once some rank announced ``event``; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(os.path.join(folder, event)):
        assert time.monotonic() < deadline, f"no rank announced {event!r} in {timeout} s"
        threading.Event().wait(0.01)  # a bounded poll of a file, not a nap


def send_once_posted(hvd, folder: str, messages) -> str:
    """Rank 0's side of a receive-into-out fault test: once rank 1 announced "posted", send it
    each of ``messages`` (tag 3, 4, ...), then leave with the others."""
    await_event(folder, "posted")
    for k, message in enumerate(messages):
        hvd.send(message, 1, tag=3 + k)
    hvd.barrier()
    hvd.shutdown()
    return "sent"


def failed_receive_into(hvd, folder: str, like):
    """Rank 1's side: post a receive from rank 0 (tag 3) into zeros shaped ``like``, announce
    "posted" and wait. ``(error text or None, out)``."""
    out = np.zeros_like(like)
    request = hvd.irecv(0, tag=3, out=out)
    announce(folder, "posted")
    try:
        request.wait()
        return None, out
    except hvd.HorovodInternalError as exc:
        return str(exc), out


def write_pid(pid_dir: str, role: str) -> None:
    """Leave this process's pid where :func:`kill_by_pid_file` finds it."""
    with open(os.path.join(pid_dir, role), "w") as fh:
        fh.write(str(os.getpid()))


def _pid_of(pid_dir: str, role: str) -> int:
    with open(os.path.join(pid_dir, role)) as fh:
        return int(fh.read())


def kill_by_pid_file(pid_dir: str, role: str) -> None:
    """SIGKILL the rank that wrote its pid as ``role`` (a stopped rank cannot kill itself).
    Every survivor does so; one that comes after the harness reaped the victim finds no such
    process, which is the outcome it wanted (the parent checks the victim died by SIGKILL)."""
    try:
        os.kill(_pid_of(pid_dir, role), signal.SIGKILL)
    except ProcessLookupError:
        pass


def resume_by_pid_file(pid_dir: str, role: str, timeout: float = 60.0) -> None:
    """SIGCONT the rank that wrote its pid as ``role`` once it is stopped: it announces its
    stop before it sends itself SIGSTOP, and a SIGCONT that came first would be lost."""
    pid = _pid_of(pid_dir, role)
    deadline = time.monotonic() + timeout
    while _state(pid) not in ("T", "t") and time.monotonic() < deadline:
        threading.Event().wait(0.005)  # a bounded poll of the process state, not a nap
    os.kill(pid, signal.SIGCONT)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:  # "pid (comm) S ...": the state follows the comm
        return fh.read().rsplit(")", 1)[1].split()[0]


def hung_peer(hvd, victim: int, pid_dir: str, op, op_async, before_kill=None) -> tuple:
    """Rank ``victim`` stops (SIGSTOP) while its executor runs a long op; every other rank runs
    the same op and returns ``(error, seconds)``: the HorovodInternalError's text (None if the
    op succeeded) and how long the op took. ``op(name)`` runs the op and waits,
    ``op_async(name)`` submits it. Retried under a new name when the op ended before the stop
    landed. Then the survivors SIGKILL the victim, which the test's harness reports; each
    calls ``before_kill()`` first, where given (e.g. to wait until every survivor failed)."""
    error, took = None, 0.0
    for attempt in range(5):  # retried only if the stop missed the op
        name = f"big.{attempt}"
        if hvd.rank() == victim:
            write_pid(pid_dir, "victim")
            handle = op_async(name)
            if wait_until_running(hvd, name, handle) and not hvd.poll(handle):
                os.kill(os.getpid(), signal.SIGSTOP)
            hvd.synchronize(handle)
            continue
        start = time.monotonic()
        try:
            op(name)
        except hvd.HorovodInternalError as exc:
            error, took = str(exc), time.monotonic() - start
            break
    if before_kill is not None:
        before_kill()
    kill_by_pid_file(pid_dir, "victim")
    return error, took


def assert_hung_peer_named(res, timeout: float) -> dict:
    """Parent side of :func:`hung_peer` with the last rank the victim: it was killed, every
    survivor failed within 2 x HVD_TIMEOUT + 5 s, and at least one timed out over shm naming
    it. Returns ``{rank: seconds}`` of the survivors that timed out.

    The first survivor to time out fails its core and closes its connections, so a slower
    survivor may see that hang-up first and report the lost survivor instead."""
    victim = len(res) - 1
    assert res[victim].returncode == -signal.SIGKILL, res[victim].describe()
    timed_out = {}
    for r in res[:victim]:
        assert r.ok, r.describe()
        error, took = r.value
        assert error, f"rank {r.rank}: no error"
        assert took < 2 * timeout + 5, f"rank {r.rank}: {error!r} after {took} s"
        if "timed out" in error:
            assert "over shm" in error and re.search(rf"\brank {victim}\b", error), error
            timed_out[r.rank] = took
        else:
            assert "lost connection" in error, f"rank {r.rank}: {error!r}"
    assert timed_out, "no survivor timed out"
    return timed_out
