"""Stop the cluster when the notebook kernel dies, even by SIGKILL.

ipyparallel stops clusters at interpreter exit (``atexit``), which a killed or crashed kernel
never reaches: its controller, mpiexec and engines would run on. :class:`Reaper` (driver side)
starts one small watchdog process in its own session and keeps a JSON file with the pids to
clean up, in a folder only this user can enter (its rewrite goes through a fixed name there); the watchdog (``python -m hvd_magic.reaper``) checks once a second that the kernel
still lives and, when it does not, terminates each pid with its whole process tree (SIGTERM,
then SIGKILL after 3 s). Removing the file (``close()``, on ``%hvd_stop``) ends the watchdog;
close() also closes the watchdog's stdin, which wakes it at once instead of at its next check.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

POLL_SECONDS = 1.0
KILL_AFTER = 3.0


class Reaper:
    """Driver side: spawn the watchdog and tell it which pids belong to the cluster."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="hvd-reaper-")  # mode 0700
        self.path = os.path.join(self.folder, "pids.json")
        self.watch([])
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hvd_magic.reaper", str(os.getpid()), self.path],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, cwd=os.path.dirname(os.path.dirname(__file__)))

    def watch(self, pids) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"pids": sorted({int(p) for p in pids})}, f)
        os.replace(tmp, self.path)

    def close(self) -> None:
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        self.process.stdin.close()  # the watchdog wakes on EOF and finds the file gone
        try:
            self.process.wait(POLL_SECONDS * 3)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _tree(pids):
    import psutil

    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs.extend(p.children(recursive=True))
            procs.append(p)
        except psutil.NoSuchProcess:
            pass
    return procs


def reap(pids) -> None:
    """Terminate ``pids`` and all their descendants; kill what survives ``KILL_AFTER`` s."""
    import psutil

    procs = _tree(pids)
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=KILL_AFTER)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def main(parent: int, path: str) -> None:
    import psutil

    try:
        kernel = psutil.Process(parent)
    except psutil.NoSuchProcess:
        kernel = None
    stdin_open = True
    while True:
        if not os.path.exists(path):
            return
        if kernel is None or not kernel.is_running() or kernel.status() == psutil.STATUS_ZOMBIE:
            try:
                with open(path) as f:
                    pids = json.load(f)["pids"]
            except (OSError, ValueError, KeyError):
                pids = []
            reap(pids)
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
            return
        # close() ends the pipe; so does the kernel's death, unless a child inherited it
        if not stdin_open:
            time.sleep(POLL_SECONDS)
        elif select.select([0], [], [], POLL_SECONDS)[0]:
            stdin_open = os.read(0, 64) != b""


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
