"""Rank processes forked from a warm interpreter instead of started cold.

A cold rank pays ~3 s of CPU to import torch before its test function runs; a 4-rank test on
two cores waits ~6 s for imports alone, and the suite starts thousands of ranks. The zygote is
one interpreter per test process that has imported numpy and torch (nothing of this project:
its import reads the rank's environment) and forks a rank per request, in ~20 ms.

A forked rank is a cold rank in what the tests look at: its own session and process group
(teardown kills the group), stdout/stderr in the harness's files, the request's environment
(``os.environ``, so ``getenv`` in the core sees it), its cwd, random seeds of its own, SIGKILL
when its parent dies, and the interpreter's exit (threads joined, atexit run, streams flushed;
not the C library's exit, nor module teardown: :func:`exit_after_python`; a test of a clean
process exit starts its ranks cold). What a fork cannot give is what the interpreter or the
preloaded modules read at start-up: a request whose
environment differs from the zygote's in such a variable (``LD_*``, ``PYTHON*``, locale, the
thread counts of OpenMP/BLAS, torch's own) is started cold by the harness instead
(:func:`forkable`), and so is a rank on the fake CUDA libraries when the zygote has a real
CUDA library mapped (a CUDA build of torch; the fakes' libcudart dependency would bind to the
real one; a CPU build maps none). Known differences: PRELOAD and tests/multiproc/checks.py
(its tables computed) are in ``sys.modules``, their weakref finalizers are not run at the
rank's exit (the zygote's objects); every forked rank has the zygote's string-hash
secret (set iteration order is the same on all ranks; a test about that needs
``PYTHONHASHSEED`` in its environment, which makes its ranks cold); ``/proc/<pid>/cmdline``
and ``/proc/<pid>/environ`` show the zygote's, and ``os.getppid()`` is the zygote.

Protocol (a socketpair; length-prefixed pickles, the test process is the only peer; the
zygote's side is zygote_server.py):
  a. the zygote preloads, then sends ``{"ready": pid, "threads": n, "cuda_mapped": bool}``
     (a real CUDA/NCCL library mapped); with more than one thread it must not fork (a lock
     held by another thread stays held in the child), so the client then starts ranks cold;
  b. the client sends ``{"argv", "env", "cwd", "stdout", "stderr"}``; the zygote forks, waits
     until the child has its own session (so a kill of its group cannot miss it), and answers
     ``{"spawned": pid}``;
  c. whenever a child exits the zygote reaps it and sends ``{"exited": pid, "code": n}``
     (``n`` as ``Popen.returncode``: negative for a signal);
  d. EOF from the client ends the zygote; its children die with it (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

# The zygote's own side is zygote_server.py; its PRELOAD, die_with (a rank's harness calls
# zygote.die_with) and exit_after_python stay reachable from here.
try:  # multiproc.zygote in the test process, zygote in a rank (its folder comes first)
    from .zygote_server import PRELOAD, die_with, exit_after_python, receive, send  # noqa: F401
except ImportError:
    from zygote_server import PRELOAD, die_with, exit_after_python, receive, send  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))

# Read when the interpreter or a preloaded module starts: a different value needs a cold rank.
_STARTUP_PREFIXES = ("LD_", "PYTHON", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "TORCH",
                     "PYTORCH_", "MALLOC_", "GLIBC_", "NUMPY_", "NPY_", "LANG", "LC_", "TZ",
                     "HOME", "TMPDIR")


def _fake_device(key: str) -> bool:
    """A variable of a rank on the fake CUDA/NCCL libraries (tests/fakecuda)."""
    return key.startswith("FAKE_") or (key.startswith("HVD_") and key.endswith("_LIBRARY"))


def forkable(zygote_env: dict, env: dict, fakes_ok: bool) -> bool:
    """True when a rank with ``env`` can be forked from a zygote started with ``zygote_env``;
    ``fakes_ok``: the zygote has no real CUDA library mapped, so a rank on the fakes may fork
    (with one mapped, the fakes' own libcudart dependency would bind to the real runtime)."""
    for key in set(zygote_env) | set(env):
        if (_fake_device(key) and not fakes_ok) or (key.startswith(_STARTUP_PREFIXES)
                                                   and zygote_env.get(key) != env.get(key)):
            return False
    return True


class ForkedRank:
    """The part of ``subprocess.Popen`` the harness uses, for a rank the zygote forked."""

    def __init__(self, zygote: "Zygote", pid: int):
        self._zygote, self.pid, self.returncode = zygote, pid, None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"forked rank {self.pid}", timeout)
        return self.returncode


class Zygote:
    """The test process's end: starts the zygote, asks it for ranks, collects their exits.
    One thread at a time: a wait holds the lock (the harness never runs ranks from threads)."""

    def __init__(self, env: dict, cwd: str):
        self.env = dict(env)
        ours, theirs = socket.socketpair()
        self._sock, self._exits, self._dead = ours, {}, False
        self._lock = threading.Lock()
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "zygote_server.py"), str(theirs.fileno()),
             str(os.getpid())],
            pass_fds=[theirs.fileno()], env=self.env, cwd=cwd, stdin=subprocess.DEVNULL,
            stdout=self._log, stderr=self._log, start_new_session=True)
        theirs.close()
        ready = self._next(timeout=120)
        if not ready or "ready" not in ready:
            self.close()
            raise RuntimeError("the rank zygote did not start:\n" + self.log())
        self.pid = ready["ready"]
        self.usable = ready["threads"] == 1
        self.fakes_ok = not ready["cuda_mapped"]

    def spawn(self, argv: list, env: dict, cwd: str, stdout: str, stderr: str) -> ForkedRank:
        with self._lock, self._breaks_on_interruption():
            send(self._sock, {"argv": argv, "env": env, "cwd": cwd, "stdout": stdout,
                               "stderr": stderr})
            while True:
                message = self._next(timeout=60)
                if self._dead or message is None:
                    raise RuntimeError(f"the rank zygote {'exited' if self._dead else 'hangs'}"
                                       f" (set HVD_HARNESS_ZYGOTE=0 to start ranks cold):\n"
                                       + self.log())
                if "error" in message:
                    raise RuntimeError(message["error"])
                if "spawned" in message:  # an exit filed for an earlier holder of this pid
                    self._exits.pop(message["spawned"], None)  # is not this rank's
                    return ForkedRank(self, message["spawned"])

    def exit_code(self, pid: int, timeout: Optional[float]) -> Optional[int]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock, self._breaks_on_interruption():
            while pid not in self._exits:
                if self._dead:  # its ranks died with it (PR_SET_PDEATHSIG)
                    return -signal.SIGKILL
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if self._next(timeout=left) is None and left is not None \
                        and time.monotonic() >= deadline:
                    return None
            return self._exits.pop(pid)

    @contextlib.contextmanager
    def _breaks_on_interruption(self):
        """An exception mid-exchange (a test's time limit, Ctrl-C) may leave half a message on
        the socket: the zygote is ended then (its ranks with it), and the next run starts a
        new one, so no later rank reads a stale reply as its own."""
        try:
            yield
        except BaseException:
            self._dead = True
            self._proc.kill()
            raise

    def _next(self, timeout: Optional[float]) -> Optional[dict]:
        """One message (exits are filed as they come); None when none came in time; {} once
        the zygote is gone (``_dead``)."""
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        if not poller.poll(None if timeout is None else int(timeout * 1000)):
            return None
        message = receive(self._sock)
        if message is None:
            self._dead = True
            return {}
        if "exited" in message:
            self._exits[message["exited"]] = message["code"]
        return message

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def alive(self) -> bool:
        return not self._dead and self._proc.poll() is None

    def close(self) -> None:
        self._sock.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


_warm: Optional[Zygote] = None
_refused = False  # a zygote failed to start: every later rank starts cold


def warm_for(env: dict, base_env: dict, cwd: str) -> Optional[Zygote]:
    """This process's zygote if a rank with ``env`` can be forked from it, else None (start it
    cold). Started on first use with ``base_env``, and again when ``base_env`` changes a start-up
    variable, by the main thread only: it dies with the thread that started it.
    ``HVD_HARNESS_ZYGOTE=0`` starts every rank cold."""
    global _warm, _refused
    if _refused or os.environ.get("HVD_HARNESS_ZYGOTE", "1") == "0" \
            or not forkable(base_env, env, fakes_ok=True):
        return None
    if _warm is None or not _warm.alive() or not forkable(_warm.env, base_env, fakes_ok=True):
        if threading.current_thread() is not threading.main_thread():
            return None
        if _warm is not None:  # the test process's own environment changed a start-up variable
            _warm.close()
        try:
            _warm = Zygote(base_env, cwd)
        except RuntimeError as exc:  # slower, not wrong
            _refused = True
            print(f"harness: ranks start cold from now on: {exc}", file=sys.stderr)
            return None
        atexit.register(_warm.close)
    return _warm if _warm.usable and forkable(_warm.env, env, _warm.fakes_ok) else None
