"""Framework-neutral lifecycle, topology and process sets of the native core.

Shared by the numpy API (``engine_native``) and the torch API (``engine_native.torch``): one
core per process, whatever framework calls it.
What the core reports about itself (``metrics``, ``config_table``, ``timeline_events``,
``autotune_state``) lives in :mod:`engine_native.core_info` and is importable from here.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import threading
from typing import Optional, Sequence

import numpy as np

from . import _core, bootstrap, gpu, horovod_env
from ._core import HorovodInternalError

try:  # the core and this package ship together: a core without these was built elsewhere
    from ._core import (set_autotune as _core_set_autotune,
                        start_timeline as _core_start_timeline,
                        stop_timeline as _core_stop_timeline)
except ImportError as exc:
    raise ImportError(f"{exc}: engine_native._core does not match this engine_native package; "
                      f"rebuild it from this checkout (pip install -e ., or ./dev.sh test)"
                      ) from exc
from .core_info import autotune_state, config_table, metrics, timeline_events

_NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."
_lock = threading.RLock()
_world: Optional[bootstrap.World] = None
_atexit_registered = False
# What the API modules keep per world (the numpy API's unnamed-op counters): cleared at every
# init() and shutdown(), so every rank of a new world starts from the same state, whatever the
# last world (an aborted one, other process sets under the same ids) left behind.
_per_world_resets: list = []


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
        horovod_env.warn_unread_once()
        gpu.prepare_nccl_environment()
        for reset in _per_world_resets:
            reset()
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
        try:
            _core.shutdown()
        finally:  # the world is gone even when its shutdown failed
            _world = None
            _check_counter = 0  # a new world (maybe with fresh processes) counts checks from 0
            for reset in _per_world_resets:
                reset()
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


def registered_process_set(ranks) -> Optional[ProcessSet]:
    """The registered process set whose members are exactly ``ranks``, or None (the same
    answer on every rank: sets are registered by every rank alike)."""
    ranks = sorted(ranks)
    return next((ps for ps in _process_sets.values() if sorted(ps.ranks) == ranks), None)


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
    "is_homogeneous", "mpi_built", "mpi_enabled", "mpi_threads_supported", "listen_address",
    "add_process_set", "registered_process_set", "remove_process_set", "metrics",
    "config_table", "start_timeline", "stop_timeline", "timeline_events", "autotune_state",
    "set_autotune",
]
