"""How a dead rank's end is described (``HvdCluster.dead_ranks``). The hub can see a local
engine go before the local launcher's thread has reaped it (CI62: "exited (status unknown)"
for an engine killed by SIGKILL): the reason waits, bounded, for a launcher that still
watches the engine's pid, and is at once "status unknown" where none watches it."""
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from hvd_magic import cluster as cluster_mod
from hvd_magic.cluster import HvdCluster
from hvd_magic.loop import LoopThread
from hvd_magic.preflight import StartError
from hvd_magic.rankinfo import RankInfo


class _LateEngineSet:
    """A local engine set whose launcher reaps engine ``pid`` only at the ``reaped_at``-th
    look at its reports (as its thread would, some time after the engine died)."""

    def __init__(self, pid: int, reaped_at: int):
        self.pid, self.reaped_at, self.looks = pid, reaped_at, 0
        self.launchers = {"engine-0": SimpleNamespace(pid=pid)}

    @property
    def stop_data(self):
        self.looks += 1
        if self.looks < self.reaped_at:
            return {}
        self.launchers = {}  # as _notice_engine_stopped pops the launcher
        return {"engines": {"engine-0": {"pid": self.pid, "exit_code": -signal.SIGKILL}}}


def _cluster(engine_set) -> HvdCluster:
    c = HvdCluster.__new__(HvdCluster)  # nothing started
    c._loop = None  # no loop thread runs the launchers' callbacks
    c.launcher = "local"
    c.ipp = SimpleNamespace(engines={"set": engine_set})
    c.client = SimpleNamespace(ids=[0, 2])  # rank 1's engine is gone
    c.ranks = [RankInfo(rank=r, engine_id=r, host="vm", pid=100 + r) for r in range(3)]
    return c


def test_a_kill_the_launcher_reaps_late_is_still_named():
    engine_set = _LateEngineSet(pid=101, reaped_at=3)
    c = _cluster(engine_set)
    assert c.dead_ranks() == {1: "killed by SIGKILL"}
    assert engine_set.looks == 3


def test_an_engine_no_launcher_watches_is_not_waited_for():
    engine_set = _LateEngineSet(pid=999, reaped_at=10 ** 9)  # watches another process
    c = _cluster(engine_set)
    assert c.dead_ranks() == {1: "exited (status unknown)"}
    assert engine_set.looks == 1


def test_the_wait_for_a_report_is_bounded(monkeypatch):
    monkeypatch.setattr(cluster_mod, "LAUNCHER_REPORT_WAIT", 0.2)
    engine_set = _LateEngineSet(pid=101, reaped_at=10 ** 9)  # its thread never reaps it
    c = _cluster(engine_set)
    assert c.dead_ranks() == {1: "exited (status unknown)"}
    assert engine_set.looks > 1


class _SilentEngineSet:
    """A local engine set watching ``pids`` whose thread never reports; counts its looks."""

    def __init__(self, pids):
        self.looks = 0
        self.launchers = {f"engine-{i}": SimpleNamespace(pid=pid) for i, pid in enumerate(pids)}

    @property
    def stop_data(self):
        self.looks += 1
        return {}


def test_ranks_dead_at_once_share_one_wait(monkeypatch):
    """Eight ranks gone and no report: one bounded wait for all of them, not one each (a fake
    clock that a sleep advances, so the count of looks is exact)."""
    clock = SimpleNamespace(now=0.0)
    fake_time = SimpleNamespace(monotonic=lambda: clock.now,
                                sleep=lambda s: setattr(clock, "now", clock.now + s))
    monkeypatch.setattr(cluster_mod, "time", fake_time)
    monkeypatch.setattr(cluster_mod, "LAUNCHER_REPORT_WAIT", 0.2)
    engine_set = _SilentEngineSet([100 + r for r in range(8)])
    c = _cluster(engine_set)
    c.client = SimpleNamespace(ids=[])
    c.ranks = [RankInfo(rank=r, engine_id=r, host="vm", pid=100 + r) for r in range(8)]
    assert c.dead_ranks() == {r: "exited (status unknown)" for r in range(8)}
    assert clock.now < 0.3  # one wait of 0.2 s, not eight
    assert engine_set.looks == 5 + 7  # the first rank's 5, then one each past the deadline


def test_the_launchers_reports_are_read_on_the_loop_thread():
    """ipyparallel changes its launchers' dicts in callbacks on the cluster's loop thread: read
    from the notebook's thread, one could change size mid-iteration (CI130: a start whose
    engines died reported only "dictionary changed size during iteration")."""
    readers = []

    class Recording(_LateEngineSet):
        @property
        def stop_data(self):
            readers.append(threading.current_thread().name)
            return super().stop_data

    loop = LoopThread(name="launchers-loop")
    try:
        c = _cluster(Recording(pid=101, reaped_at=2))
        c._loop = loop
        assert c.dead_ranks() == {1: "killed by SIGKILL"}
    finally:
        loop.close()
    assert readers and set(readers) == {"launchers-loop"}, readers


def test_a_failed_starts_launcher_output_is_read_on_the_loop_thread():
    """CI130's path: engines that died before registering; the error quotes the launcher's
    output, which ipyparallel's get_output() gathers by iterating its launchers."""
    readers = []

    class ExitedSet:
        state, output_file = "after", ""

        @property
        def stop_data(self):
            readers.append(threading.current_thread().name)
            return {"exit_code": 1}

        def get_output(self):
            readers.append(threading.current_thread().name)
            return "Fatal Python error: init_fs_encoding"

    loop = LoopThread(name="launchers-loop")
    try:
        c = _cluster(ExitedSet())
        c._loop, c.client, c.n, c.timeout = loop, SimpleNamespace(ids=[]), 2, 60
        with pytest.raises(StartError, match="(?s)launcher exited .*Fatal Python error"):
            c._wait_for_engines(None, set())
    finally:
        loop.close()
    assert len(readers) >= 2 and set(readers) == {"launchers-loop"}, readers


def test_a_held_loop_does_not_stop_the_reports():
    """A stop that timed out can leave ipyparallel's loop blocked in a launcher's join: the
    reports are then read here (stop() must still end, and say how ranks ended)."""
    loop = LoopThread(name="held-loop")
    release = threading.Event()
    loop.loop.call_soon_threadsafe(lambda: release.wait(30))  # holds the loop's thread
    try:
        c = _cluster(_LateEngineSet(pid=101, reaped_at=1))
        c._loop = loop
        start = time.monotonic()
        assert c.dead_ranks() == {1: "killed by SIGKILL"}
        assert time.monotonic() - start < 10  # the loop's 2 s, not its 30 s hold
    finally:
        release.set()
        loop.close()
