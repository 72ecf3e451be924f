"""Child processes of a launcher: spawn, stream their output, notice exits, stop them all.

:func:`spawn` starts one process in its own session (so a whole process group can be signalled
and a terminal's Ctrl-C reaches only the launcher) that dies with the launcher (Linux
``PR_SET_PDEATHSIG``). :class:`ProcessJob` runs one event loop on the calling thread over every
child's stdout/stderr pipe and exit (``pidfd``), with no polling, and applies the job rules:

A. Each whole output line goes to :meth:`ProcessJob.handle_line` (by default: the rank's
   prefixed line in :class:`~hvd_magic.launch.output.RankOutput`).
B. The first rank that exits non-zero (or by a signal) fails the job (it is
   ``JobResult.failed``, unless a SIGKILLed rank is reaped after it: Note [Report window] e;
   ranks with a process stopped then, by SIGSTOP/SIGTSTP or held by a debugger or tracer,
   are ``JobResult.frozen``: their peers' waits on them time out). The
   others get ``report_window`` seconds to exit by themselves (Note [Report window]); every
   process group still alive then gets SIGTERM (and SIGCONT, so that one stopped by a signal
   acts on it now, not at the SIGKILL; a debugger's hold ends only there), and SIGKILL
   ``grace`` seconds later. A rank exiting 0 starts nothing.
C. Ctrl-C (KeyboardInterrupt on the launcher's thread), :meth:`ProcessJob.stop` from another
   thread, or ``timeout`` sends SIGTERM at once (also inside a report window), SIGKILL after
   ``grace``; a second Ctrl-C kills at once.
D. When a rank's main process exits, what is left of its process group is killed (nothing
   outlives the job), and the loop ends once every pipe is drained.

Note [Report window]
A rank that is SIGKILLed (the OOM killer, a user's ``kill -9``) prints nothing; what explains
the failure is its peers' errors ("lost connection to rank 1", a pipeline's stage and
micro-batch), which the core raises within tens of milliseconds of the death. SIGTERM at the
first failure, as mpiexec does (horovodrun has no window either), kills the peers while they
print them. So the launcher waits, but briefly and boundedly:

a. The window opens at the first non-zero exit only (rule B); it ends early once every rank
   has exited, so a job whose ranks all fail with errors ends without waiting.
b. Ranks that exit inside it exit on their own, with their output forwarded as always.
c. It is short (``REPORT_WINDOW``, 2 s), not HVD_TIMEOUT. Measured (bench_pipeline_faults.py's
   kill case, torch, np 3 on 2 cores with a load average of 2-6): the peers of a SIGKILLed
   rank print their errors 0.00-0.01 s after its death and exit 0.8-2.0 s after it, most of
   that in torch's interpreter teardown (0.6 s alone). A peer that has not noticed by then
   (waiting in a rendezvous, in pure Python) will not in time; waiting longer only delays the
   stop, and a peer stopped in its teardown has printed its error already.
d. It does not apply to rule C (the user asked for the stop), nor where exits do not go
   through :meth:`ProcessJob.rank_exited` with a window: MpiJob (``report_window=0``: mpiexec
   kills every rank itself when one fails), the elastic driver (it keeps survivors running
   on purpose), and the one-rank supervisors of rankwrap and the Spark task.
e. The first exit seen need not be the first failure: the peers of a SIGKILLed rank may be
   reaped before it (seen in CI under load: its peer's "exited with code 1" was blamed). A
   rank SIGKILLed while the window is open (the launcher has sent no signal yet) takes the
   blame from a first rank that exited with a code of its own. SIGKILL only: it comes from
   outside (the OOM killer, ``kill -9``), while a rank that aborts or crashes in its teardown
   after a peer's own error (SIGABRT, SIGSEGV) is not the cause. Never where the launcher
   stopped the ranks at the first failure (MpiJob: mpiexec's SIGTERM reaches every rank).
"""

from __future__ import annotations

import ctypes
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from . import procfs
from .output import LineSplitter, RankOutput

__all__ = ["REPORT_WINDOW", "JobResult", "ProcessJob", "exit_status", "spawn"]

REPORT_WINDOW = 2.0  # seconds; Note [Report window]

_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
except (OSError, AttributeError):  # pragma: no cover - exotic libc
    _prctl = None


def _die_with_parent(parent: int) -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(1)


def spawn(cmd, env: dict, cwd: str | None = None, pass_fds=(),
          stdin=subprocess.DEVNULL) -> subprocess.Popen:
    """Start ``cmd`` with piped stdout/stderr, no stdin (or the given fd), its own session,
    dying with us."""
    parent = os.getpid()
    preexec = (lambda: _die_with_parent(parent)) if _prctl is not None else None
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=pass_fds,
                            start_new_session=True, preexec_fn=preexec)


def exit_status(code: int | None) -> int:
    """A Popen returncode as a shell exit status (killed by signal N → 128 + N)."""
    if code is None:
        return 1
    return 128 - code if code < 0 else code


def describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class JobResult:
    codes: dict = field(default_factory=dict)  # rank (or key) -> Popen returncode
    failed: int | None = None               # the rank whose failure stopped the job
    interrupted: bool = False                  # Ctrl-C / stop() / timeout
    reason: str = ""
    stopped: list = field(default_factory=list)  # keys the launcher signalled (rules B, C)
    frozen: list = field(default_factory=list)   # keys with a stopped process at the failure

    @property
    def ok(self) -> bool:
        return self.failed is None and not self.interrupted and all(
            c == 0 for c in self.codes.values())


class _Child:
    def __init__(self, key, proc: subprocess.Popen):
        self.key, self.proc = key, proc
        self.exited = False
        self.pidfd: int | None = None


class ProcessJob:
    """Supervise child processes (one per rank, or one mpiexec) until all are gone."""

    def __init__(self, output: RankOutput, grace: float = 3.0,
                 report_window: float = REPORT_WINDOW):
        self.output = output
        self.grace = grace
        self.report_window = report_window
        self.result = JobResult()
        self._children: dict = {}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None, None))
        self._pipes = 0
        self._stop_request: str | None = None
        self._lock = threading.Lock()
        self._kill_at: float | None = None
        self._window_end: float | None = None  # Note [Report window]
        self._timeout: float | None = None

    # -- hooks (overridden by the mpiexec and Spark flavours) --------------------------------
    def handle_line(self, key, stream: str, text: str) -> None:
        self.output.line(key, stream, text)

    def handle_exit(self, key, code: int) -> None:
        self.rank_exited(key, code)

    # -- setup --------------------------------------------------------------------------------
    def add(self, key, proc: subprocess.Popen) -> None:
        child = self._children[key] = _Child(key, proc)
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            os.set_blocking(pipe.fileno(), False)
            splitter = LineSplitter(lambda text, k=key, s=stream: self.handle_line(k, s, text))
            self._sel.register(pipe, selectors.EVENT_READ, ("pipe", child, splitter))
            self._pipes += 1
        try:
            child.pidfd = os.pidfd_open(proc.pid)
            self._sel.register(child.pidfd, selectors.EVENT_READ, ("exit", child, None))
        except (AttributeError, OSError):  # no pidfd (old kernel): the loop polls instead
            child.pidfd = None

    # -- job rules ----------------------------------------------------------------------------
    def rank_exited(self, rank, code: int) -> None:
        """Rule B: a non-zero exit of ``rank`` fails the job (the first one, or a SIGKILLed rank
        after it: Note [Report window] e) and opens the report window, after which the ranks
        left are stopped."""
        self.result.codes[rank] = code
        if code != 0 and self.result.failed is None and not self.result.interrupted:
            self._blame(rank, code)
            self.result.frozen = self._frozen()
            if self.report_window > 0:
                self._window_end = time.monotonic() + self.report_window
            else:
                self._terminate_all()
        elif code == -signal.SIGKILL and self._killed_first(rank):
            self._blame(rank, code)

    def _blame(self, rank, code: int) -> None:
        self.result.failed = rank
        self.result.reason = f"rank {rank} {describe_exit(code)}"

    def _killed_first(self, rank) -> bool:
        """Whether ``rank``, SIGKILLed after the job failed, is its cause all the same: the
        launcher has signalled nothing yet (the report window is open), and the rank blamed
        so far exited with a code of its own, as a peer that lost ``rank`` does. Under load
        the peers' exits can be reaped before the death that caused them (Note [Report
        window] e)."""
        failed = self.result.failed
        return failed is not None and not self.result.interrupted and \
            self._kill_at is None and (self.result.codes.get(failed) or 0) > 0

    def stop(self, reason: str = "stopped") -> None:
        """Rule C, from any thread: stop every process (SIGTERM, then SIGKILL after grace)."""
        with self._lock:
            self._stop_request = reason
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _interrupt(self, reason: str) -> None:
        if not self.result.interrupted and self.result.failed is None:
            self.result.interrupted = True
            self.result.reason = reason
        self._terminate_all()

    def _terminate_all(self) -> None:
        if self._kill_at is None:
            self._kill_at = time.monotonic() + self.grace
            self.result.stopped = [k for k, c in self._children.items() if not c.exited]
            self._signal_all(signal.SIGTERM)
            self._signal_all(signal.SIGCONT)  # a process stopped by a signal acts on it now

    def _frozen(self) -> list:
        """Keys of the children with a process in state T or t (stopped by a signal, or held
        by a debugger or tracer). One pass over /proc, matched by session: each child leads
        its own (spawn), and its pid, the session's id, is not reused while it is unreaped."""
        live = {c.proc.pid: k for k, c in self._children.items() if not c.exited}
        found = set()
        try:
            for pid in procfs.pids():
                fields = procfs.stat(pid)  # state, ppid, pgrp, session, ...
                if len(fields) > 3 and fields[0] in ("T", "t") and int(fields[3]) in live:
                    found.add(live[int(fields[3])])
        except (OSError, ValueError):  # no /proc to read: name nobody, fail nothing
            return []
        return [key for key in self._children if key in found]

    def _signal_all(self, sig: int) -> None:
        for child in self._children.values():
            if not child.exited:
                try:
                    os.killpg(child.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    # -- the loop ------------------------------------------------------------------------------
    def run(self, timeout: float | None = None) -> JobResult:
        """Run rules A-D until every child has exited and its pipes are drained."""
        self._timeout = timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        store_log = logging.getLogger("engine_native.rendezvous")
        store_log.addFilter(self._quiet_while_stopping)
        try:
            self._loop(deadline)
        except KeyboardInterrupt:
            self._interrupt("interrupted (Ctrl-C)")
            try:
                self._loop(None)
            except KeyboardInterrupt:  # a second Ctrl-C: no more grace
                self._signal_all(signal.SIGKILL)
                self._loop(None)
            raise
        finally:
            store_log.removeFilter(self._quiet_while_stopping)
            self._signal_all(signal.SIGKILL)
            self._close()
        return self.result

    def _quiet_while_stopping(self, record) -> bool:
        # Ranks killed mid-handshake make the launcher's rendezvous store log a dropped
        # connection: expected once a rank failed or the job is stopping, noise for the user.
        return self._kill_at is None and self._window_end is None

    def _loop(self, deadline: float | None) -> None:
        drain_until = None
        while True:
            now = time.monotonic()
            if all(c.exited for c in self._children.values()):
                if self._pipes == 0:
                    return
                drain_until = drain_until or now + 2.0
                if now >= drain_until:
                    return
            if deadline is not None and now >= deadline:
                self._interrupt(f"timed out after {self._timeout:g} s")
                deadline = None
            if self._kill_at is None and self._window_end is not None \
                    and now >= self._window_end:
                self._terminate_all()  # rule B: the report window is over
            if self._kill_at is not None and now >= self._kill_at:
                self._signal_all(signal.SIGKILL)
                self._kill_at = float("inf")
            window = self._window_end if self._kill_at is None else None
            wait = [t - now for t in (deadline, self._kill_at, drain_until, window)
                    if t is not None and t != float("inf")]
            if any(c.pidfd is None and not c.exited for c in self._children.values()):
                wait.append(0.05)
            events = self._sel.select(max(0.0, min(wait)) if wait else None)
            for key, _ in events:
                self._dispatch(key)
            self._poll_exits()

    def _dispatch(self, key) -> None:
        kind, child, splitter = key.data
        if kind == "wake":
            try:
                os.read(self._wake_r, 4096)
            except BlockingIOError:
                pass
            with self._lock:
                reason, self._stop_request = self._stop_request, None
            if reason:
                self._interrupt(reason)
        elif kind == "pipe":
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if data:
                splitter.feed(data)
            else:
                splitter.flush()
                self._sel.unregister(key.fileobj)
                key.fileobj.close()
                self._pipes -= 1
        elif kind == "exit":
            self._reap(child)

    def _poll_exits(self) -> None:
        for child in self._children.values():
            if not child.exited and child.pidfd is None and child.proc.poll() is not None:
                self._reap(child)

    def _reap(self, child: _Child) -> None:
        # Rule D: the group's leftovers go while the leader is still a zombie, so its pid
        # (the group id) cannot have been reused yet.
        try:
            os.killpg(child.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        code = child.proc.wait()
        child.exited = True
        if child.pidfd is not None:
            self._sel.unregister(child.pidfd)
            os.close(child.pidfd)
            child.pidfd = None
        self.handle_exit(child.key, code)

    def _close(self) -> None:
        for child in self._children.values():
            if not child.exited:
                try:
                    child.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            if child.pidfd is not None:
                os.close(child.pidfd)
                child.pidfd = None
            for pipe in (child.proc.stdout, child.proc.stderr):
                if pipe is not None and not pipe.closed:
                    pipe.close()
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

