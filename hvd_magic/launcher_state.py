"""What ipyparallel's engine launchers report: how an engine ended, their output, the pids
they watch. Their dicts change in callbacks on the cluster's loop thread, so
:class:`hvd_magic.cluster.HvdCluster` calls these there (``LoopThread.call``).
"""

from __future__ import annotations

import os
import re
import signal


def describe_exit(code) -> str:
    """``killed by SIGKILL`` / ``exited with code 3`` from a (psutil-style) exit code."""
    if code is None or code == "unknown":
        return "exited (status unknown)"
    code = int(code)
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def launcher_pids(engine_sets) -> list[int]:
    """The pids of the engines the sets' launchers still watch, and of the launchers."""
    pids = []
    for es in engine_sets:
        pids.extend(e.pid for e in getattr(es, "launchers", {}).values() if e.pid > 0)
        if getattr(es, "pid", -1) > 0:
            pids.append(es.pid)
    return pids


def launcher_output(engine_set) -> str:
    """The launcher's output so far (``get_output()`` caches its first read, so a single
    output file is read afresh)."""
    if engine_set is None:
        return ""
    path = getattr(engine_set, "output_file", "")
    if path and os.path.isfile(path):
        with open(path, errors="replace") as f:
            return f.read()
    return engine_set.get_output()


_MPI_PIPE = re.compile(r"Pipe closed, parent (\d+) has status: (\w+)")
_MPI_EXIT = re.compile(r"EXIT STRING: (.+)|KILLED BY SIGNAL: (\d+)|EXIT CODE: (\d+)")


def mpi_exit_reason(output: str, pid: int) -> str:
    """How an MPI rank ended, from mpiexec's report and the nannies' log lines."""
    first = next((int(m.group(1)) for m in _MPI_PIPE.finditer(output)), None)
    reason = "exited (status unknown)"
    for m in _MPI_EXIT.finditer(output):
        if m.group(1):
            reason = m.group(1).strip().rstrip(".")
            break
        if m.group(2):
            reason = describe_exit(-int(m.group(2)))
        elif m.group(3) and reason.startswith("exited (status"):
            reason = describe_exit(int(m.group(3)))
    if first is not None and first != pid:
        return f"stopped by mpiexec after pid {first} died ({reason})"
    return reason
