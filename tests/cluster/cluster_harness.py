"""Helpers for the cluster tests: run cells in an IPython shell, find and kill the processes
of the clusters a test started (imported by conftest.py and by test modules)."""

from __future__ import annotations

import contextlib
import io
import os
import sys
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


def run_cell(shell, code: str) -> CellResult:
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        res = shell.run_cell(code, store_history=False)
    error = res.error_in_exec or res.error_before_exec
    return CellResult(res.result, error, out.getvalue(), err.getvalue(),
                      time.perf_counter() - t0)


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
