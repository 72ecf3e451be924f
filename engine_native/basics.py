"""Framework-neutral lifecycle, topology and process sets of the native core.

Shared by the numpy API (``engine_native``) and the torch API (``engine_native.torch``): one
core per process, whatever framework calls it.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import threading
from typing import Optional, Sequence

import numpy as np

from . import _core, bootstrap
from ._core import HorovodInternalError

try:  # the core and this package ship together: a core without these was built elsewhere
    from ._core import (autotune_state as _core_autotune_state,
                        set_autotune as _core_set_autotune,
                        start_timeline as _core_start_timeline,
                        stop_timeline as _core_stop_timeline,
                        timeline_events as _core_timeline_events)
except ImportError as exc:
    raise ImportError(f"{exc}: engine_native._core does not match this engine_native package; "
                      f"rebuild it from this checkout (pip install -e ., or ./dev.sh test)"
                      ) from exc

_NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."
_lock = threading.RLock()
_world: Optional[bootstrap.World] = None
_atexit_registered = False


class ProcessSet:
    """A subset of ranks that runs collectives among themselves (Horovod's ``ProcessSet``).

    Example
    -------
    >>> evens = hvd.add_process_set([0, 2])        # every rank makes the same call
    >>> hvd.allreduce(x, process_set=evens)         # only ranks 0 and 2 take part
    """

    def __init__(self, ranks_or_comm: Sequence[int]):
        self.ranks = sorted(int(r) for r in ranks_or_comm)
        self.process_set_id: Optional[int] = None
        self.invalidated_by: Optional[str] = None

    def _invalidate(self, why: Optional[str] = None) -> None:
        self.process_set_id = None
        self.invalidated_by = why  # named in the error when the stale object is used

    def size(self) -> Optional[int]:
        return len(self.ranks) if self.process_set_id is not None else None

    def rank(self) -> Optional[int]:
        if self.process_set_id is None:
            return None
        me = rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> Optional[bool]:
        return None if self.process_set_id is None else rank() in self.ranks

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
_process_sets: dict[int, ProcessSet] = {}


def init(comm=None, process_sets: Optional[Sequence[ProcessSet]] = None, *,
         rank: Optional[int] = None, size: Optional[int] = None,
         rendezvous: Optional[str] = None, secret: Optional[str] = None,
         job_id: Optional[str] = None) -> None:
    """Initialise the core: find the other ranks, connect, start the background thread.

    A repeated call is a no-op; after ``shutdown()`` it initialises again (same processes).

    Parameters
    ----------
    comm : mpi4py communicator, optional
        Bootstrap through this communicator instead of COMM_WORLD.
    process_sets : list of ProcessSet, optional
        Registered right after init, in order, on every rank.
    rank, size, rendezvous, secret, job_id : optional
        Explicit bootstrap (otherwise MPI, then ``HVD_*``/``HOROVOD_*`` environment).
    """
    global _world, _atexit_registered
    with _lock:
        if _core.is_initialized():
            return
        _world = bootstrap.bootstrap(comm, rank, size, rendezvous, secret, job_id)
        global_process_set.ranks = list(range(_world.size))
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
    for ps in process_sets or []:
        add_process_set(ps)


def shutdown(reason: Optional[str] = None) -> None:
    """Shut the core down (agreeing with the other ranks, bounded by ``HVD_TIMEOUT``).
    ``reason`` (e.g. an elastic reset) is named when a process set of this world is used
    afterwards."""
    global _world, _check_counter
    with _lock:
        _core.shutdown()
        _world = None
        _check_counter = 0  # a new world (maybe with fresh processes) counts checks from 0
        for ps in _process_sets.values():
            ps._invalidate(reason)
        _process_sets.clear()


def abort(reason: str = "") -> None:
    """Cancel every op in flight here and on every other rank (best effort through rank 0).

    Pending and later ops fail with HorovodInternalError until ``shutdown()`` + ``init()``,
    which work in the same processes.
    """
    _core.abort(reason)


def is_initialized() -> bool:
    return _core.is_initialized()


def _require_world() -> bootstrap.World:
    world = _world
    if world is None or not _core.is_initialized():
        raise ValueError(_NOT_INITIALIZED)
    return world


def rank() -> int:
    return _require_world().rank


def size() -> int:
    return _require_world().size


def local_rank() -> int:
    return _require_world().local_rank


def local_size() -> int:
    return _require_world().local_size


def cross_rank() -> int:
    return _require_world().cross_rank


def cross_size() -> int:
    return _require_world().cross_size


def is_homogeneous() -> bool:
    world = _require_world()
    counts = {h: world.host_ids.count(h) for h in world.host_ids}
    return len(set(counts.values())) == 1


# MPI queries (Horovod's mpi_built / mpi_enabled / mpi_threads_supported). MPI here is the
# launch and bootstrap layer (DESIGN §4): ranks started by mpiexec find each other through
# mpi4py's COMM_WORLD; collectives then travel over the core's shm/tcp/NCCL transports.

_MPI_NOT_ENABLED = ("Horovod MPI is not enabled; Please make sure it's installed and enabled. "
                    "engine_native uses MPI when the ranks are started by mpiexec (with mpi4py "
                    "installed) or init() is given an mpi4py communicator; check "
                    "hvd.mpi_enabled() first.")


def mpi_built() -> bool:
    """True when this installation can run on MPI: mpi4py is importable.

    Horovod's says it was compiled against MPI; the core never is: its MPI support is mpi4py
    (bootstrap under ``mpiexec``, ``init(comm=...)``). Imports nothing (``mpi4py.MPI`` would
    initialise MPI).
    """
    try:
        return importlib.util.find_spec("mpi4py") is not None
    except (ImportError, ValueError):
        return False


def mpi_enabled() -> bool:
    """True while the core runs on an MPI job: ``init()`` found its ranks through MPI.

    That is the case when the ranks were started by ``mpiexec``/``mpirun`` (and mpi4py is
    installed, and no ``HVD_RANK`` overrides it) or ``init(comm=...)`` got an mpi4py
    communicator, as with Horovod's MPI controller. MPI is then initialised in this process
    and may be used through mpi4py alongside the core. False before ``init()``, after
    ``shutdown()``, and for ranks that found each other through the rendezvous store
    instead (``hvdrun`` on one host, a notebook cluster not started by the MPI launcher), as
    Horovod's is under Gloo. Either way the tensors travel over the core's shm/tcp/NCCL
    transports, never through MPI.
    """
    world = _world
    return world is not None and world.source == "mpi" and _core.is_initialized()


def mpi_threads_supported() -> bool:
    """Whether MPI runs with ``MPI_THREAD_MULTIPLE`` (mpi4py's default request): then any
    thread may call mpi4py. The core itself makes no MPI call after ``init()``.

    Raises
    ------
    ValueError
        When :func:`mpi_enabled` is False (before ``init()`` too), with Horovod's message.
    """
    if not mpi_enabled():
        raise ValueError(_MPI_NOT_ENABLED)
    from mpi4py import MPI  # already imported and initialised by the bootstrap
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def listen_address() -> tuple:
    """(address, port) of this rank's core listener (for diagnostics and tests)."""
    return _require_world().listen_address


def add_process_set(process_set) -> ProcessSet:
    """Register a process set on every rank (a collective: all ranks make the same calls). An
    empty rank list means every rank, as in Horovod: a set of its own, with its own id.

    Raises ValueError when ranks disagree about the members or the set already exists.
    """
    _require_world()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"add_process_set(): {ps} is already registered")
    if not ps.ranks:  # Horovod's core reads an empty list as every rank (a new set)
        ps.ranks = list(range(size()))
    for existing in _process_sets.values():
        if existing.ranks == ps.ranks:
            raise ValueError(f"add_process_set(): a process set with ranks {ps.ranks} already "
                             f"exists (id {existing.process_set_id})")
    _check_same_on_all_ranks("add_process_set", ps.ranks)
    ps.process_set_id = _core.add_process_set(ps.ranks)
    _process_sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Remove a registered process set on every rank. Returns True when it was removed."""
    _require_world()
    if process_set.process_set_id in (None, 0):
        return False
    _check_same_on_all_ranks("remove_process_set", [process_set.process_set_id])
    _core.remove_process_set(process_set.process_set_id)
    _process_sets.pop(process_set.process_set_id, None)
    process_set._invalidate()
    return True


_check_counter = 0


def _check_same_on_all_ranks(what: str, values: list) -> None:
    """Allgather ``values`` over the global set and fail on every rank if any rank differs."""
    global _check_counter
    _check_counter += 1
    row = np.full(64, -1, dtype=np.int64)
    if len(values) > 64:
        raise ValueError(f"{what}(): at most 64 ranks per call are supported here")
    row[: len(values)] = values
    handle = _core.enqueue(_core.ALLGATHER, f"{what}.check.{_check_counter}", 4, (1, 64),
                           row.ctypes.data, 0)
    buffer, shape = _core.wait(handle)
    rows = np.frombuffer(buffer, dtype=np.int64).reshape(shape)
    for other, theirs in enumerate(rows):
        if not np.array_equal(theirs, row):
            mine = [int(v) for v in row if v >= 0]
            others = [int(v) for v in theirs if v >= 0]
            raise ValueError(f"{what}(): ranks disagree: rank {rank()} passed {mine}, rank "
                             f"{other} passed {others}; every rank must make the same call")


def metrics() -> dict:
    """Snapshot of the core's counters (ops/bytes per collective, time split, pending ops).

    Time split: ``negotiate_seconds``, ``communicate_seconds`` (the background loop),
    ``idle_seconds`` (the loop waiting for work; ``wait_seconds`` is the same value under its
    earlier name) and ``handle_wait_seconds`` (framework threads blocked in ``wait()``);
    ``main_blocked_seconds`` is how long the main thread has been blocked in its current
    ``wait()`` (0 when it is not waiting: what the notebook uses to tell a rank stuck in a
    collective from one still computing);
    ``caller_driven_ops`` counts waits whose op ran on the waiting thread itself, and
    ``caller_spin_us`` is how long such a thread polls before it sleeps (0 where callers never
    drive: a peer over TCP), ``spin_yields`` whether such polls, and the collectives' own
    short spins, yield the core between tries because this host's ranks outnumber its cores
    (Note [Yielding spins]), ``caller_spin_skipped`` how many driven waits did not spin
    (all of them where ``caller_spin_us`` is 0; otherwise those whose spin was backed off
    because it kept running out: Note [Spin backoff]).
    ``transports`` names, per global rank, the data path to it (``"self"``, ``"shm"``,
    ``"tcp"``); ``control_transports`` how negotiation messages travel to it (``"shm"``
    between a worker and rank 0 on one host, ``"tcp"`` across hosts or with
    ``HVD_TRANSPORT=tcp``, ``"none"`` where there is no control channel: a worker has one, to
    rank 0).
    Also ``timeline`` (a file is being written here), ``autotune`` (the dashboard's view of
    :func:`autotune_state`, None when tuning never ran) and ``events`` (collectives finished
    since the previous ``metrics()`` call in this process: ``{"op", "name", "start_ago_s",
    "dur_s", "error"}``).
    ``mps_pipe_directory``: the MPS daemon this process's CUDA connects to
    (``CUDA_MPS_PIPE_DIRECTORY``, set by ``hvdrun`` / ``%hvd_start`` / ``run()`` for ranks
    sharing a GPU when they use one; "" without MPS): the dashboard then labels the GPU path
    "... under MPS".
    """
    out = _core.metrics()
    out["mps_pipe_directory"] = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
    return out


def config_table() -> list:
    """Every ``HVD_*`` knob: (name, Horovod alias, type, default, doc)."""
    return _core.config_table()


def start_timeline(file_path, mark_cycles: bool = False) -> None:
    """Start writing a Chrome-trace timeline (Horovod's layout) to ``file_path``.

    Only rank 0 writes (as in Horovod); every rank may make the call. A running timeline is
    closed first. The file is valid JSON whenever it is read, also while it is being written.
    Unlike Horovod, ``HOROVOD_TIMELINE=DYNAMIC`` is not required beforehand.

    Parameters
    ----------
    file_path : str or path-like
        Where rank 0 writes; truncated.
    mark_cycles : bool
        Add a ``CYCLE_START`` marker per background-loop cycle.

    Raises
    ------
    ValueError
        Before ``init()``, or when rank 0 cannot open the file.

    Example
    -------
    >>> hvd.start_timeline("/tmp/timeline.json")
    >>> hvd.allreduce(np.ones(4), name="x")
    >>> hvd.stop_timeline()            # chrome://tracing or Perfetto opens the file
    """
    _require_world()
    _core_start_timeline(os.fspath(file_path), bool(mark_cycles))


def stop_timeline() -> None:
    """Stop the timeline started by ``start_timeline`` or ``HVD_TIMELINE``; the file stays
    valid JSON. A no-op when none is running."""
    _require_world()
    _core_stop_timeline()


def timeline_events(since_us: int = 0) -> list:
    """This rank's collectives of the last seconds, oldest first, recorded whether or not a
    file is written (``HVD_TIMELINE_LIVE``, on by default), for the dashboard's strip.

    One event per executed response: a fused batch is one event named after its first tensor
    (``"grad.0 (+199 fused)"``). Negotiation and activity detail goes to the file only.

    Returns
    -------
    list of tuple
        ``(ts_us, name, phase, op, duration_us, error)``: start in microseconds since the Unix
        epoch, tensor name, ``"op"``, the collective (``ALLREDUCE``, ``BROADCAST``, ...; ``ERROR``
        for an op that failed in negotiation), duration, error text ("" when none). Only events
        starting at or after ``since_us``.
    """
    return _core_timeline_events(int(since_us))


def autotune_state() -> dict:
    """The autotuner's state on this rank (any time, also before ``init()``).

    Rank 0 owns the tuner and reports its full state; the other ranks report the parameters
    applied last and the phase that came with them.

    Returns
    -------
    dict
        ``enabled``, ``tuner`` (True on rank 0 while it owns a tuner), ``phase`` (``"off"``,
        ``"warmup"``, ``"bayes"``, ``"categorical"``, ``"done"``; rank 0's is live and may be
        a batch ahead of ``applied_phase``, the phase that came with the parameters in force,
        on which every rank agrees after the same collective), ``trial``/``trials`` (setting
        k of n in this phase), ``planned_settings``, ``samples`` (of the current setting),
        ``applied`` (the parameters this rank runs with: ``fusion_threshold_bytes``,
        ``cycle_time_ms``, ``cache_enabled``, ``hierarchical_allreduce``), ``switches`` (every
        change applied here: ``{"responses_before", "params", "phase"}``, identical on every
        rank), and on rank 0 ``current``, ``best``, ``best_score`` (bytes/s) and ``history``
        (``{"params", "score", "phase"}`` per scored setting; the Bayesian phase ends by
        re-measuring its finalists in turn, so they appear twice).

    Example
    -------
    >>> hvd.autotune_state()["phase"]
    'bayes'
    """
    return _core_autotune_state()


def set_autotune(enabled: bool) -> None:
    """Switch autotuning on or off at run time (rank 0 decides; other ranks follow).

    On: rank 0 starts a tuning run from the parameters in force (knobs the user set stay
    fixed). Off: rank 0 settles on the best setting scored so far and every rank switches to it
    with the next batch of collectives.
    """
    _require_world()
    _core_set_autotune(bool(enabled))


__all__ = [
    "HorovodInternalError", "ProcessSet", "global_process_set", "init", "shutdown", "abort",
    "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "is_homogeneous", "mpi_built", "mpi_enabled", "mpi_threads_supported", "listen_address", "add_process_set", "remove_process_set", "metrics",
    "config_table", "start_timeline", "stop_timeline", "timeline_events", "autotune_state",
    "set_autotune",
]
