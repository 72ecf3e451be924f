"""Helpers for the cluster tests: run cells in an IPython shell, find and kill the processes
of the clusters a test started, kill one rank's engine, read the dashboard's rows (imported by
conftest.py and by test modules)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

STARTED_CLUSTER_IDS: set[str] = set()


@dataclass
class CellResult:
    value: object
    error: BaseException | None
    out: str
    err: str
    seconds: float
    interrupted_after: float | None = None  # seconds into the cell, with interrupt_on
    @property
    def text(self) -> str:
        return self.out + self.err


def cluster_processes(cluster_ids=None, tag: str | None = None) -> list[psutil.Process]:
    """Processes of our clusters: ipyparallel puts the cluster id in the environment
    (``IPP_CLUSTER_ID``) of the controller, engines, nannies and mpiexec. Without
    ``cluster_ids``, also the reaper watchdogs carrying this process's pid. With ``tag``:
    every process whose environment has ``HVD_TEST_TAG=tag`` (a kernel we started and all
    it spawned)."""
    ids = STARTED_CLUSTER_IDS if cluster_ids is None else set(cluster_ids)
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.info["pid"] == os.getpid():
            continue
        cmd = p.info["cmdline"] or []
        if "hvd_magic.reaper" in cmd:
            if cluster_ids is None and str(os.getpid()) in cmd:  # session sweep only
                found.append(p)
            continue
        with contextlib.suppress(psutil.Error):
            env = p.environ()
            if env.get("IPP_CLUSTER_ID") in ids or (tag and env.get("HVD_TEST_TAG") == tag):
                found.append(p)
    return found


def kill_strays(cluster_ids=None, tag: str | None = None) -> list[int]:
    procs = cluster_processes(cluster_ids, tag)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=5)
    return [p.pid for p in procs]


class _Watched(io.StringIO):
    """A cell's stdout that sets ``seen`` once ``marker`` has been written to it."""

    def __init__(self, marker: str):
        super().__init__()
        self.marker, self.seen = marker, threading.Event()

    def write(self, text):
        n = super().write(text)
        if self.marker in self.getvalue():
            self.seen.set()
        return n


def _ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)


def run_cell(shell, code: str, interrupt_on: str | None = None, interrupt=_ctrl_c,
             ready_timeout: float = 60.0) -> CellResult:
    """Run a cell, capturing its output. With ``interrupt_on``, ``interrupt()`` (by default
    Ctrl-C: SIGINT to this process) is called from another thread once the cell's streamed
    output contains that text: the cell prints it when the state the test interrupts (ranks
    asleep, a collective pending) is reached, a readiness handshake instead of a guessed delay.
    Without it by ``ready_timeout`` the interrupt comes all the same (so a stuck cell ends) and
    an AssertionError names the missing marker. What ``interrupt()`` raises is raised here."""
    out, err = (_Watched(interrupt_on) if interrupt_on else io.StringIO()), io.StringIO()
    t0 = time.perf_counter()
    interrupted, failed = [], []

    def watch():
        ready = out.seen.wait(ready_timeout)
        interrupted.append((time.perf_counter() - t0, ready))
        try:
            interrupt()
        except BaseException as exc:  # raised in the caller below, not lost in this thread
            failed.append(exc)

    watcher = threading.Thread(target=watch, daemon=True) if interrupt_on else None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if watcher:
            watcher.start()
        res = shell.run_cell(code, store_history=False)
    seconds = time.perf_counter() - t0
    if watcher:
        watcher.join()
        if failed:
            raise failed[0]
        assert interrupted[0][1], (f"the cell never printed {interrupt_on!r} within "
                                   f"{ready_timeout} s: {out.getvalue()[-2000:]}")
    error = res.error_in_exec or res.error_before_exec
    return CellResult(res.result, error, out.getvalue(), err.getvalue(), seconds,
                      interrupted[0][0] if watcher else None)


def magics():
    import hvd_magic

    return hvd_magic._magics


def start_cluster(shell, line: str) -> CellResult:
    res = run_cell(shell, f"%hvd_start {line}")
    cluster = magics().cluster
    if cluster is not None and cluster.ipp is not None:
        STARTED_CLUSTER_IDS.add(cluster.ipp.cluster_id)
    assert res.error is None and cluster is not None, res.text
    return res


def stop_cluster(shell) -> None:
    cluster = magics().cluster
    cid = cluster.ipp.cluster_id if cluster is not None and cluster.ipp else None
    run_cell(shell, "%hvd_stop")
    if cid:
        deadline = time.monotonic() + 10
        while cluster_processes([cid]) and time.monotonic() < deadline:
            time.sleep(0.2)
        kill_strays([cid])


def wait_for(predicate, timeout=20.0, what="condition"):
    tick, deadline = threading.Event(), time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout:.0f} s"
        tick.wait(0.05)


def kill_rank(rank: int) -> int:
    """SIGKILL the engine of ``rank`` in the shell's cluster and wait until the cluster has
    noticed (``dead_ranks()``); returns the engine's pid."""
    cluster = magics().cluster
    victim = cluster.ranks[rank].pid
    os.kill(victim, signal.SIGKILL)
    wait_for(cluster.dead_ranks, what=f"rank {rank}'s death noticed")
    return victim


def dashboard_rows():
    """The dashboard's rows as its view would draw them now."""
    return magics().dashboard.hub.model.rows(time.monotonic())


def traceback_text(res: CellResult) -> str:
    """What the notebook shows for the cell's error, without colour codes."""
    from hvd_magic.errors import strip_ansi

    return strip_ansi("\n".join(res.error._render_traceback_()))


def assert_allreduce_works(run) -> None:
    """The shared 3-rank cluster still answers a collective."""
    res = run("%%hvd\nhvd.allreduce(torch.ones(2) * (hvd.rank() + 1), op=hvd.Sum).tolist()")
    assert res.error is None, res.text
    assert res.value == [6.0, 6.0]


def run_notebook(nb, folder: str, settle_s: float = 15.0, **client_args):
    """Execute ``nb`` headless through nbclient, its kernel in ``folder``. Every process the
    kernel spawns carries a fresh ``HVD_TEST_TAG``; whatever still runs ``settle_s`` after the
    last cell is killed and fails the test. Returns ``nb`` with its outputs."""
    import uuid

    from nbclient import NotebookClient

    tag = uuid.uuid4().hex
    client = NotebookClient(nb, timeout=300, allow_errors=False,
                            resources={"metadata": {"path": folder}}, **client_args)
    try:
        client.execute(env={**os.environ, "HVD_TEST_TAG": tag})
    finally:
        deadline = time.monotonic() + settle_s
        while cluster_processes([], tag) and time.monotonic() < deadline:
            time.sleep(0.25)
        leaked = kill_strays([], tag)
    assert not leaked, f"the notebook left processes running: {leaked}"
    return nb
