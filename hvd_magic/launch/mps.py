"""A private NVIDIA MPS control daemon for the ranks of one job that share GPUs (issue #19).

Ranks that share a GPU each own a CUDA context, and the GPU time-slices between contexts: a
4-byte copy in one rank waits ~150 µs for its turn (benchmarks/RESULTS.md, "Ranks sharing one
GPU over CUDA IPC"). Under NVIDIA's Multi-Process Service the ranks' work runs in one server
context, concurrently. :class:`MpsDaemon` starts one control daemon for one job, on this
machine, with its own pipe and log directories under a fresh temp dir, so it never meets
another user's (or another job's) daemon; ranks reach it through the environment it returns.

Protocol (``start``):

A. ``nvidia-cuda-mps-control`` must be on PATH, and no visible GPU may be in a compute mode
   where MPS cannot run (Prohibited, Exclusive_Thread): otherwise :class:`MpsError`, with the fix.
B. ``nvidia-cuda-mps-control -d`` with ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY``
   set to the job's folders; it forks the daemon and returns.
C. ``get_server_list`` is sent until the daemon answers (``START_TIMEOUT``); no answer: the
   daemon's log tail goes into the error and whatever was started is stopped.
D. The daemon's pids (the control daemon and, later, its server) are found by their
   environment (read from /proc: :mod:`hvd_magic.launch.procfs`), so that a kernel's reaper
   can kill them if the notebook dies.

``stop`` sends ``quit`` (the daemon then ends its server once the clients are gone), waits
``STOP_TIMEOUT``, kills what is left with its children and removes the folders. Stop the
ranks first: a daemon told to quit waits for its clients. Note [MPS clients]: CUDA in a rank
whose ``CUDA_MPS_PIPE_DIRECTORY`` names no live daemon falls back to its own context (the
documented behaviour), so a daemon that never came up costs speed, not correctness; a daemon
that answers but whose server cannot serve a client fails that client's CUDA calls.

Note [MPS by default]: on one H100 (benchmarks/RESULTS.md, "Runs 3–4"), two ranks sharing the
GPU did a 4-byte allreduce in 76–121 µs under MPS against 477–788 µs time-sliced, and 256 MiB
at 200 GB/s against 106–121. So the launchers (hvdrun, ``%hvd_start``, ``run()``) use MPS when
a machine's ranks share its GPU, in one of three modes, planned by :func:`plan`:

- ``auto`` (the default) starts a daemon where that was verified — one GPU, the launch's
  ``CUDA_VISIBLE_DEVICES`` unset — and elsewhere, or when the daemon cannot start, says why
  and what it costs and goes on time-sliced. Not verified: several GPUs per host (a daemon
  renumbers the GPUs its clients see, so the ranks' GPU pins must agree with its numbering:
  :meth:`MpsDaemon._control_env` starts it on every GPU in PCI order, as the pins count).
- ``on`` (``--mps``) starts one wherever GPUs are shared, and a daemon that cannot start, or
  a ``CUDA_MPS_PIPE_DIRECTORY`` naming no live daemon, is an error.
- ``off`` (``--no-mps``) starts nothing.

A live daemon the user runs already (``CUDA_MPS_PIPE_DIRECTORY``, or the system one at
``/tmp/nvidia-mps``) is used as it is, never doubled, and named to the ranks so that
``metrics()`` sees it. Elastic jobs never get one: under MPS a fatal GPU error in one client
reaches every client of that GPU, which would defeat losing one rank.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

from . import procfs

CONTROL = "nvidia-cuda-mps-control"
PIPE_ENV, LOG_ENV = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
START_TIMEOUT = 15.0  # seconds for the daemon to answer
STOP_TIMEOUT = 10.0  # seconds for it to quit before it is killed
POLL = 0.1
REFUSED_MODES = ("prohibited", "exclusive_thread")

DEFAULT_PIPE = "/tmp/nvidia-mps"  # where a daemon started without CUDA_MPS_PIPE_DIRECTORY listens
MODES = ("auto", "on", "off")
# Latency with and without MPS on one GPU: benchmarks/RESULTS.md, "GPU: one H100".
WITHOUT_COST = ("each small op then waits for the GPU's time slices (several times its latency "
                "under MPS)")

__all__ = ["LOG_ENV", "MODES", "PIPE_ENV", "MpsDaemon", "MpsError", "Plan", "UsersDaemon",
           "decide", "gpu_count", "mode_of", "plan", "start_for_job"]


class MpsError(RuntimeError):
    """The MPS daemon could not be started; the message says why and what to do."""


def mode_of(value, what: str = "mps") -> str:
    """A launcher's MPS choice as one of MODES: True is "on", False "off", None "auto"."""
    if value is None or isinstance(value, bool):
        return {True: "on", False: "off", None: "auto"}[value]
    mode = str(value).lower()
    if mode not in MODES:
        raise ValueError(f"{what}={value!r}: choose auto (MPS when ranks share a GPU, the "
                         f"default), on (the same, and an error when it cannot start) or off")
    return mode


def decide(ranks_here: int, gpus_here: int, host: str = "this machine") -> tuple:
    """``(start, note)``: start a daemon when the ranks of a host outnumber its GPUs."""
    if gpus_here <= 0:
        return False, (f"MPS: no GPU visible on {host}, so no MPS daemon was started "
                       f"(the ranks run on CPU)")
    if ranks_here <= gpus_here:
        return False, (f"MPS: the {ranks_here} rank(s) on {host} have {gpus_here} GPU(s), "
                       f"one each: no GPU is shared, so no MPS daemon was started")
    return True, (f"MPS: {ranks_here} ranks share {gpus_here} GPU(s) on {host}: they run "
                  f"under a private MPS daemon (--no-mps: time-sliced instead)")


class Plan:
    """What a launch does about MPS: ``action`` is "none" (no note), "use" (a live daemon the
    user runs, at ``pipe``), "start" (a private one), "without" (time-sliced, said) or
    "error" (mode "on" only); ``note`` says it. (A plain class: benchmarks and GPU tests load
    this file on its own, outside any package, where a dataclass cannot be made.)"""

    def __init__(self, action: str, note: str | None = None, pipe: str | None = None):
        self.action, self.note, self.pipe = action, note, pipe


def plan(mode: str, ranks_here: int, gpus_here: int, environ: dict,
         host: str = "this machine") -> Plan:
    """Note [MPS by default]: what to do, decided without starting anything (dry runs print
    it too)."""
    start, text = decide(ranks_here, gpus_here, host)
    if mode == "off" or not start:
        return Plan("none", text if mode == "on" else None)
    shared = _shared(ranks_here, gpus_here, host)
    exe = shutil.which(CONTROL, path=environ.get("PATH"))
    mine = environ.get(PIPE_ENV)
    if mine:
        if exe is None or _answers(exe, environ, mine):
            checked = "" if exe else f" (not checked: {CONTROL} is not on PATH)"
            return Plan("use", f"MPS: {shared}: they use your MPS daemon at {mine} "
                               f"({PIPE_ENV}){checked}", mine)
        why = (f"{PIPE_ENV}={mine} names no live MPS daemon: start that daemon, or unset the "
               f"variable to let hvd start one")
        return Plan("error", f"MPS: {why}") if mode == "on" else \
            Plan("without", f"MPS: {shared}, without MPS: {why}. {WITHOUT_COST}")
    # Asked only when its control FIFO exists: no subprocess per launch on a machine without one.
    if exe is not None and os.path.exists(os.path.join(DEFAULT_PIPE, "control")) \
            and _answers(exe, environ, DEFAULT_PIPE):
        return Plan("use", f"MPS: {shared}: they use the system's MPS daemon at {DEFAULT_PIPE}",
                    DEFAULT_PIPE)
    if mode == "auto":
        unverified = ("MPS with several GPUs on a host is not verified yet" if gpus_here > 1 else
                      "with CUDA_VISIBLE_DEVICES set, MPS is not verified yet"
                      if environ.get("CUDA_VISIBLE_DEVICES") else None)
        if unverified:
            return Plan("without", f"MPS: {shared}, not started: {unverified} (--mps starts it "
                                   f"anyway). Time-sliced, {WITHOUT_COST}")
    return Plan("start", text)


class UsersDaemon:
    """A live MPS daemon this job uses but did not start: its variable for the ranks; never
    stopped by us."""

    def __init__(self, pipe: str):
        self.env = {PIPE_ENV: pipe}
        self.pids: list[int] = []

    def stop(self) -> None:
        pass


def start_for_job(mode: str, ranks_here: int, gpus_here: int, environ: dict, note,
                  host: str = "this machine"):
    """:func:`plan` carried out, its note said through ``note``: a daemon whose ``env`` the
    ranks get (ours, or a :class:`UsersDaemon`) or None. MpsError only in mode "on" (nothing
    left running)."""
    chosen = plan(mode, ranks_here, gpus_here, environ, host)
    if chosen.action == "error":
        raise MpsError(chosen.note + " (or run with --no-mps)")
    if chosen.action == "use":
        note(chosen.note)
        return UsersDaemon(chosen.pipe)
    if chosen.action != "start":
        if chosen.note:
            note(chosen.note)
        return None
    daemon = MpsDaemon(environ)
    try:
        daemon.start()
    except MpsError as exc:
        if mode == "on":
            raise
        note(f"{exc}\nMPS: {_shared(ranks_here, gpus_here, host)}, without MPS: {WITHOUT_COST}. "
             f"--no-mps silences this")
        return None
    note(chosen.note)
    return daemon


def _shared(ranks_here: int, gpus_here: int, host: str) -> str:
    return f"{ranks_here} ranks share {gpus_here} GPU(s) on {host}"


def _answers(exe: str, environ: dict, pipe: str, timeout: float = 5.0) -> bool:
    """Whether a live MPS control daemon answers on ``pipe``."""
    return _ask(exe, dict(environ, **{PIPE_ENV: pipe}), "get_server_list", timeout)[0] == 0


def _ask(exe: str, env: dict, text: str, timeout: float) -> tuple:
    """``(exit code, answer)`` of one control command sent with ``env``."""
    try:
        proc = subprocess.run([exe], input=text + "\n", text=True, capture_output=True,
                              env=env, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return -1, ""
    if "cannot find mps control daemon" in (proc.stdout + proc.stderr).lower():
        return proc.returncode or 1, proc.stdout  # said so, whatever its exit code
    return proc.returncode, proc.stdout


def gpu_count(environ: dict) -> int:
    """GPUs the ranks started with ``environ`` see (nvidia-smi; never initialises CUDA)."""
    if environ.get("CUDA_VISIBLE_DEVICES") == "":  # --gpus none
        return 0
    from engine_native import gpu

    return len(gpu.visible_devices(environ)[0])


def compute_modes(environ: dict) -> dict:
    """``{nvidia-smi index: compute mode}`` of the GPUs ``environ`` can see ({} unknown)."""
    exe = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if exe is None:
        return {}
    try:
        proc = subprocess.run([exe, "--query-gpu=index,compute_mode", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20, env=dict(environ),
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    modes = {}
    for line in proc.stdout.splitlines() if proc.returncode == 0 else ():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            modes[int(parts[0])] = parts[1]
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and all(t.strip().isdigit() for t in visible.split(",") if t.strip()):
        keep = {int(t) for t in visible.split(",") if t.strip()}
        modes = {i: m for i, m in modes.items() if i in keep}
    return modes


class MpsDaemon:
    """One job's MPS control daemon on this machine; a context manager (start/stop).

    Parameters
    ----------
    environ : the environment to start it from (PATH finds the control program; default
        ``os.environ``).
    start_timeout : seconds for the daemon to answer.
    """

    def __init__(self, environ: dict | None = None, start_timeout: float = START_TIMEOUT):
        self.base = dict(os.environ if environ is None else environ)
        self.start_timeout = start_timeout
        self.exe: str | None = None
        self.folder: str | None = None
        self.env: dict = {}
        self.pids: list[int] = []

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- start (steps A-D) ----------------------------------------------------------------

    def start(self) -> dict:
        """Start and check the daemon (steps A-D); returns the variables the ranks need."""
        self.exe = shutil.which(CONTROL, path=self.base.get("PATH"))
        if self.exe is None:
            raise MpsError(f"MPS: {CONTROL} is not on PATH. It comes with the NVIDIA driver's "
                           f"utilities (e.g. the nvidia-utils / nvidia-compute-utils package); "
                           f"install them and put the program on PATH, or run with --no-mps")
        for index, mode in sorted(compute_modes(self.base).items()):
            if mode.lower().replace(" ", "_") in REFUSED_MODES:
                raise MpsError(f"MPS: GPU {index} is in compute mode {mode}, where MPS cannot "
                               f"run. Fix: `nvidia-smi -i {index} -c DEFAULT` (or "
                               f"EXCLUSIVE_PROCESS; needs root), or run with --no-mps")
        try:
            self.folder = tempfile.mkdtemp(prefix="hvd-mps-")
            self.env = {PIPE_ENV: os.path.join(self.folder, "pipe"),
                        LOG_ENV: os.path.join(self.folder, "log")}
            for path in self.env.values():
                os.makedirs(path)
            self._launch()
            self._wait_answer()
            self.pids = self._find_pids()
        except OSError as exc:
            self.stop()
            raise MpsError(f"MPS: the daemon could not be started: {exc}. Fix that (e.g. a "
                           f"writable TMPDIR), or run with --no-mps") from None
        except BaseException:
            self.stop()
            raise
        return dict(self.env)

    def _control_env(self) -> dict:
        # Every GPU, in PCI order: the ranks pin theirs by nvidia-smi index (PCI order), and a
        # client's CUDA_VISIBLE_DEVICES counts within the GPUs its daemon sees.
        env = dict(self.base, **self.env)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        return env

    def _launch(self) -> None:
        # The forked daemon inherits our descriptors: give it a file, never a pipe we read to
        # EOF (that read would last as long as the daemon).
        with open(os.path.join(self.env[LOG_ENV], "hvd-launch.out"), "wb") as out:
            try:
                code = subprocess.run([self.exe, "-d"], stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT, env=self._control_env(),
                                      timeout=self.start_timeout, check=False).returncode
            except subprocess.TimeoutExpired:
                code = "no exit"
        if code != 0:
            raise MpsError(f"MPS: `{CONTROL} -d` failed ({code}).{self._log_tail()} "
                           f"Fix: see the log above, or run with --no-mps")

    def _wait_answer(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.command("get_server_list", timeout=5.0) == 0:
                return
            if time.monotonic() > deadline:
                raise MpsError(f"MPS: the MPS daemon did not come up: it did not answer "
                               f"within {self.start_timeout:g} s.{self._log_tail()} Fix: see "
                               f"its log, or run with --no-mps")
            time.sleep(POLL)

    def command(self, text: str, timeout: float = 5.0) -> int:
        """Send one control command (``quit``, ``get_server_list``); the client's exit code
        (nonzero when no daemon answers on our pipe directory)."""
        return self.ask(text, timeout)[0]

    def ask(self, text: str, timeout: float = 5.0) -> tuple:
        """``(exit code, answer)`` of one control command (``get_server_list``: the pids of
        the MPS servers, which exist once a rank's CUDA connected)."""
        return _ask(self.exe, self._control_env(), text, timeout)

    def served(self) -> list[str]:
        """Evidence that ranks used the daemon: the MPS servers it runs now
        (``get_server_list``) and its log's lines about servers and clients ([] without)."""
        code, answer = self.ask("get_server_list")
        found = [f"server {pid}" for pid in answer.split()] if code == 0 else []
        path = os.path.join(self.env.get(LOG_ENV, ""), "control.log")
        if os.path.isfile(path):
            with open(path, errors="replace") as fh:
                found += [ln.strip() for ln in fh if "server" in ln.lower() or
                          "client" in ln.lower()]
        return found

    def _find_pids(self) -> list[int]:
        """Processes started for our pipe directory (daemon, server): found by environment."""
        pipe = self.env.get(PIPE_ENV)
        return sorted(pid for pid in procfs.pids() if pid != os.getpid() and
                      any(os.path.basename(a).startswith("nvidia-cuda-mps")
                          for a in procfs.cmdline(pid)[:2])
                      and procfs.environ(pid).get(PIPE_ENV) == pipe)

    def _log_tail(self, lines: int = 10) -> str:
        found = []
        folder = self.env.get(LOG_ENV)
        for name in ("control.log", "hvd-launch.out"):
            path = os.path.join(folder, name) if folder else ""
            if path and os.path.isfile(path):
                with open(path, errors="replace") as fh:
                    tail = [ln.rstrip() for ln in fh.read().splitlines() if ln.strip()][-lines:]
                found += [f"    {name}: {ln}" for ln in tail]
        return (" Its log's last lines:\n" + "\n".join(found) + "\n") if found else \
            " It wrote no log."

    # -- stop -----------------------------------------------------------------------------

    def stop(self) -> None:
        """``quit``, wait, kill what is left (with its children), remove the folders. Never
        raises; safe to call twice."""
        if self.folder is None:
            return
        procs = set()
        for pid in set(self.pids) | set(self._find_pids()):
            procs |= {pid} | procfs.descendants(pid)
        if self.exe is not None:
            self.command("quit", timeout=STOP_TIMEOUT)
        alive = procfs.wait_gone(procs, STOP_TIMEOUT, POLL)
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        procfs.wait_gone(alive, STOP_TIMEOUT, POLL)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder, self.env, self.pids = None, {}, []
