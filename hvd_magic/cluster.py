"""Cluster lifecycle on ipyparallel: start, wait for registration, stop, restart, deaths.

:class:`HvdCluster` wraps one ``ipyparallel.Cluster`` (controller + one engine set started by
ipyparallel's launchers: ``mpi`` by default, ``local``, ``slurm``, ``pbs``, ``ssh``, ...) and
its connected ``Client``. Who is which rank, the core and GPUs are set up by
:mod:`hvd_magic.ranksetup`. Every method runs on the notebook's main thread; the ipyparallel
coroutines run on a private loop thread (:mod:`hvd_magic.loop`). Engines and controller are
started by ipyparallel in their own session (``start_new_session=True``), so a Jupyter
interrupt, which signals the kernel's process group, never reaches them or mpiexec.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from . import frameworks, mpi_shm, preflight, ranksetup, reaper, ssh_engines
from .cluster_mps import ClusterMps
from .launcher_state import describe_exit, launcher_output, launcher_pids, mpi_exit_reason
from .launch import hosts as hostlib
from .loop import LoopThread
from .rankinfo import RankInfo

log = logging.getLogger("hvd_magic")

ENGINE_STOP_WAIT = 5.0  # seconds for the hub to notice engines that were stopped
# seconds for the launcher to report how a rank that died ended: mpiexec writes its report as
# it exits; a local engine's launcher notices the exit on its own thread, after the hub may
# already have seen the engine go
LAUNCHER_REPORT_WAIT = 3.0
# The hub registers an engine only on the heartbeat after the engine's heart first answers,
# so ipyparallel's 3 s period made every start and restart wait 3-6 s for nothing. A 0.5 s
# period with 60 allowed misses keeps its 30 s before a silent engine is declared dead.
HEART_PERIOD_MS = 500
HEART_MISSES = 60


_UNREPORTED = object()  # no launcher has reported the exit (yet)


class HvdCluster:
    """A running set of ranks.

    Parameters
    ----------
    n : int
        Number of ranks.
    launcher : str
        ipyparallel engine launcher (``mpi``, ``local``, ``slurm``, ``pbs``, ``ssh``, ...).
    gpus : {"auto", "none"}
        Pin one GPU per local rank when GPUs exist, or hide GPUs from the engines.
    timeout : float
        Seconds to wait for registration and for the core to initialise.
    env : dict
        Extra environment for the engines.
    mps : str or bool
        "auto" (default): run this machine's ranks under a private MPS daemon when they share
        GPUs, or say why not; "on"/True: the same, a daemon that cannot start fails the start;
        "off"/False: never (hvd_magic.cluster_mps).
    """

    def __init__(self, n: int, launcher: str = "mpi", gpus: str = "auto",
                 timeout: float = 60.0, env: dict | None = None, hosts: str | None = None,
                 mps="auto", framework: str | None = None):
        self.n, self.launcher, self.gpus, self.timeout = n, launcher, gpus, timeout
        # hvd_magic.frameworks: the binding every rank imports (default: torch, else numpy)
        self.framework = framework or frameworks.default()
        self.hosts = hosts  # "a:2,b:2" for the ssh launcher (hvd_magic.ssh_engines)
        self.slots = None
        self.env = dict(env or {})
        self.ipp = None
        self.client = None
        self.ranks: list[RankInfo] = []
        self.setup: ranksetup.RankSetup | None = None
        self.started_at: float | None = None
        self.ready_seconds: float | None = None
        self.dashboard = None  # hvd_magic.dashboard.Dashboard, set by the magics
        self.elastic = None  # hvd_magic.elastic.ElasticWorld, once %hvd_scale resized it
        self._loop = LoopThread()
        self._reaper: reaper.Reaper | None = None
        self.mps = ClusterMps(mps)
        self._mpi_files: set[str] = set()  # hvd_magic.mpi_shm: MPICH's files the ranks map

    # -- start / stop -----------------------------------------------------------------------

    def start(self, progress=None) -> list[str]:
        """Start controller and engines, wait for them, set up ranks. Returns notes to show.

        Raises StartError (after cleaning up) with the reason and the fix.
        """
        import ipyparallel as ipp

        t0 = time.perf_counter()
        preflight.check_launcher(self.launcher)
        self.slots = ssh_engines.parse(self.hosts, self.n, self.launcher)
        kwargs = {}
        if self.launcher not in ("local", "mpi"):  # engines on other hosts (else loopback)
            kwargs["controller_ip"] = self._controller_address()
        kwargs["controller_args"] = [f"--HeartMonitor.period={HEART_PERIOD_MS}",
                                     f"--HeartMonitor.max_heartmonitor_misses={HEART_MISSES}"]
        if self.slots is not None:
            kwargs["config"] = ssh_engines.config(self.slots)
        self.ipp = ipp.Cluster(engines=self.launcher, n=self.n, log_level=logging.ERROR,
                               engine_timeout=int(self.timeout), **kwargs)
        try:
            self._loop.run(self.ipp.start_controller(), self.timeout)
            self.client = self._loop.run(self.ipp.connect_client(), self.timeout)
            self._reaper = reaper.Reaper()
            notes = self._start_engines(progress)
        except BaseException:
            self.stop()
            raise
        self.started_at = time.time()
        self.ready_seconds = time.perf_counter() - t0
        return notes

    def _controller_address(self) -> str:
        """Where the controller listens for engines on other hosts: ``HVD_CONTROLLER_ADDRESS``
        when set (an address of this machine, or ``*`` for every interface: a login node
        whose default route is not the compute nodes' network), else the interface toward the
        ssh launcher's hosts, or the default route's for slurm/pbs, whose hosts are not known
        before the engines start (as the Spark driver does); never every interface unless
        asked, which would take connections from networks the job does not use (issue #35)."""
        chosen = os.environ.get("HVD_CONTROLLER_ADDRESS", "").strip()
        return chosen or hostlib.address_toward([s.host for s in self.slots or ()])

    def _start_engines(self, progress) -> list[str]:
        self.setup = ranksetup.RankSetup(self, ranksetup.engine_env(self))
        # Engines that register while start_engines() still runs are ours too: the ssh
        # launcher starts them one by one over ssh, so the first ones register before it
        # returns (taking the snapshot after it lost them: "only 2 of 4 registered").
        before = set(self.client.ids)
        self._loop.run(self.ipp.start_engines(self.n, environment=self.setup.launch_env),
                       self.timeout)
        self.update_reaper()
        engine_ids = self._wait_for_engines(progress, before)
        self.ranks, notes = self.setup.setup_ranks(engine_ids)
        self.update_reaper()
        if self.launcher == "mpi":
            self._mpi_files |= mpi_shm.mapped_by(self._local_pids())
        return notes

    def _local_pids(self) -> list[int]:
        return [r.pid for r in self.ranks if r.host == os.uname().nodename]

    def _shutdown_cores(self) -> None:
        """Shut the cores down cleanly while every rank can still agree on it; otherwise
        each engine's exit would wait for its dead or busy peers (the core's atexit)."""
        if self.client is not None and self.ranks and not self.dead_ranks():
            try:
                self.setup.shutdown_cores(timeout=2.0)
            except Exception as exc:
                log.debug("core shutdown before stopping engines failed: %s", exc)

    def stop(self) -> None:
        """Stop engines and controller (best effort, never raises)."""
        self._shutdown_cores()
        if self.setup is not None:
            self.setup.close()
        self._drop_elastic()
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.ipp is not None:
            try:  # engines first: stopping the controller first makes them log heartbeat loss
                self._stop_engines()
                self._loop.run(self.ipp.stop_controller(), 30)
            except Exception as exc:
                log.warning("hvd: stopping the cluster: %s", exc)
            self.ipp = None
        self.mps.stop()  # after the engines: a daemon told to quit waits for its clients
        self._mpi_files -= set(mpi_shm.remove_unmapped(self._mpi_files))
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None
        self._loop.close()
        self.ranks = []

    def restart(self, progress=None) -> list[str]:
        """Stop every engine and start ``n`` new ones; ranks, core and GPUs set up again."""
        t0 = time.perf_counter()
        self._shutdown_cores()
        if self.setup is not None:
            self.setup.close()
        self._stop_engines()
        self._drop_elastic()
        deadline = time.monotonic() + ENGINE_STOP_WAIT
        while self.client.ids and time.monotonic() < deadline:
            time.sleep(0.05)
        self._mpi_files -= set(mpi_shm.remove_unmapped(self._mpi_files))
        self.ranks = []
        notes = self._start_engines(progress)
        self.ready_seconds = time.perf_counter() - t0
        return notes

    # -- what other modules change, only through these ---------------------------------------

    def set_ranks(self, ranks: list) -> None:
        """The ranks in rank order, after a start, %hvd_scale or an elastic re-forming."""
        self.ranks, self.n = list(ranks), len(ranks)

    def set_timeout(self, seconds: float) -> None:
        self.timeout = seconds

    def set_elastic(self, world) -> None:
        """The ElasticWorld (hvd_magic.elastic) the ranks belong to from now on."""
        self.elastic = world

    def attach_dashboard(self, dashboard) -> None:
        self.dashboard = dashboard

    def detach_dashboard(self, only=None):
        """Forget the dashboard (only if it is ``only``, when given); returns the one attached."""
        attached = self.dashboard
        if only is None or attached is only:
            self.dashboard = None
        return attached

    def _drop_elastic(self) -> None:
        if self.elastic is not None:
            self.elastic.close()
            self.elastic = None

    def _stop_engines(self) -> None:
        """SIGTERM every engine at once, then let ipyparallel reap them: its launchers wait
        for each engine in turn (seconds each while torch unloads), so signalling first makes
        the wait the slowest engine's instead of the sum."""
        for es in self.ipp.engines.values():
            try:
                es.signal(signal.SIGTERM)
            except Exception as exc:  # already gone
                log.debug("SIGTERM to engine set: %s", exc)
        self._loop.run(self.ipp.stop_engines(), 60)

    # -- registration -----------------------------------------------------------------------

    def _engine_set(self):
        return next(iter(self.ipp.engines.values()), None) if self.ipp else None

    def _wait_for_engines(self, progress, old: set, count: int | None = None,
                          engine_set=None) -> list[int]:
        """``count`` (default n) engines not in ``old``; ``engine_set``: the set starting them
        (default the first), watched for an early exit."""
        count = self.n if count is None else count
        deadline = time.monotonic() + self.timeout
        while True:
            new = sorted(set(self.client.ids) - old)
            if progress:
                progress(len(new), count)
            if len(new) >= count:
                return new[:count]
            exited = self._on_loop(self._launcher_exit, engine_set)
            if exited or time.monotonic() > deadline:
                output = self._on_loop(lambda: launcher_output(engine_set or self._engine_set()))
                raise preflight.registration_failure(count, len(new), self.timeout,
                                                     self.launcher, output, exited)
            time.sleep(0.05)

    def _on_loop(self, fn, *args):
        """``fn(*args)`` where the launchers' dicts change (LoopThread.call); here when there
        is no loop thread (nothing runs callbacks then)."""
        return fn(*args) if self._loop is None else self._loop.call(fn, *args)

    def _launcher_exit(self, es=None) -> str | None:
        es = es or self._engine_set()
        if es is None:
            return "no engine set"
        stop = getattr(es, "stop_data", None) or {}
        if getattr(es, "state", "") == "after":
            return describe_exit(stop.get("exit_code"))
        for data in (stop.get("engines") or {}).values():  # one engine of a local set died
            return f"an engine {describe_exit(data.get('exit_code'))}"
        return None

    # -- views and health -------------------------------------------------------------------

    @property
    def size(self) -> int:
        return len(self.ranks)

    def engine_ids(self, ranks) -> list[int]:
        return [self.ranks[r].engine_id for r in ranks]

    def view(self, ranks=None):
        ranks = range(self.size) if ranks is None else ranks
        v = self.client.direct_view(targets=self.engine_ids(ranks))
        v.block = False
        return v

    def dead_ranks(self) -> dict[int, str]:
        """Ranks whose engine is gone, with how it ended (exit code or signal, when known)."""
        if self.client is None:
            return {}
        alive = set(self.client.ids)
        gone = [r for r in self.ranks if r.engine_id not in alive]
        deadline = time.monotonic() + LAUNCHER_REPORT_WAIT  # one wait for all, not one each
        return {r.rank: self._exit_reason(r, deadline) for r in gone}

    def busy_ranks(self) -> list[int]:
        """Ranks still running something we sent earlier (an interrupt they ignored)."""
        busy = []
        outstanding = getattr(self.client, "_outstanding_dict", {})
        engines = getattr(self.client, "_engines", {})
        for r in self.ranks:
            if outstanding.get(engines.get(r.engine_id)):
                busy.append(r.rank)
        return busy

    def _exit_reason(self, info: RankInfo, deadline: float) -> str:
        while True:
            code, watched = self._on_loop(self._launcher_report, info.pid)
            if code is not _UNREPORTED:
                return describe_exit(code)
            if not watched or time.monotonic() >= deadline:
                break
            time.sleep(0.05)  # the launcher's thread has yet to see the exit: give it time
        es = self._engine_set()
        if self.launcher == "mpi" and es is not None:
            while getattr(es, "state", "") != "after" and time.monotonic() < deadline:
                time.sleep(0.05)  # mpiexec writes its report last
            return mpi_exit_reason(self._on_loop(launcher_output, es), info.pid)
        return "exited (status unknown)"

    def _launcher_report(self, pid: int):
        """(exit code, or _UNREPORTED; whether a launcher still watches ``pid``): the local
        launcher's per-engine report, from any engine set (%hvd_scale adds sets)."""
        watched = False
        for each in (self.ipp.engines.values() if self.ipp else ()):
            stop = getattr(each, "stop_data", None) or {}
            for data in (stop.get("engines") or {}).values():
                if data.get("pid") == pid:
                    return data.get("exit_code"), False
            launchers = getattr(each, "launchers", None) or {}
            watched = watched or any(getattr(one, "pid", None) == pid
                                     for one in launchers.values())
        return _UNREPORTED, watched

    def signal_ranks(self, ranks, sig=signal.SIGINT) -> None:
        """Signal ranks through their KernelNanny (launcher-independent, unlike mpiexec)."""
        alive = set(self.client.ids)
        targets = [e for e in self.engine_ids(ranks) if e in alive]
        if targets:
            self.client.send_signal(sig, targets=targets, block=False)

    def update_reaper(self) -> None:
        if self._reaper is None or self.ipp is None:
            return
        pids = []
        if self.ipp.controller is not None and getattr(self.ipp.controller, "pid", -1) > 0:
            pids.append(self.ipp.controller.pid)
        pids.extend(self._on_loop(lambda: launcher_pids(self.ipp.engines.values())))
        pids.extend(self._local_pids())
        self._reaper.watch(pids + self.mps.pids())
