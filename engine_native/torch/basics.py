"""Horovod's basics for ``engine_native.torch``: init/shutdown, topology, build queries and
the timeline switch, on top of the framework-neutral ``engine_native.basics``.

Called on the user's thread. ``init()`` and ``shutdown()`` also reset the torch layer's handle
table (see ``runtime``, Note [Handle lifetime]).
"""
import os

from engine_native import basics as _basics
from engine_native.build_info import (  # noqa: F401
    ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, nccl_built, rocm_built)
from engine_native.horovod_args import init_arguments
from engine_native.torch import runtime as rt
from engine_native.torch.runtime import is_initialized, rank, size  # noqa: F401


def init(comm=None, process_sets=None):
    """Initialize the core on this process (Horovod's ``hvd.init``).

    Parameters
    ----------
    comm : list of int or mpi4py communicator, optional
        Ranks (of MPI_COMM_WORLD) or the communicator to run on; default: every process.
    process_sets : list of ProcessSet or "dynamic", optional
        Process sets to register at start-up, or "dynamic" to allow ``add_process_set`` later.
    """
    if rt.is_initialized():
        return  # Horovod: a repeated init() is a no-op
    comm, process_sets = init_arguments(comm, process_sets)
    _basics.init(comm=comm, process_sets=process_sets)


def shutdown():
    """Shut the core down; ``init()`` may be called again afterwards (the torch API's handles
    and counters go with the world: runtime._reset_handles)."""
    _basics.shutdown()


def local_size():
    """Number of processes on this host."""
    rt._require_init()
    return _basics.local_size()


def local_rank():
    """Rank of this process among those on its host."""
    rt._require_init()
    return _basics.local_rank()


def cross_size():
    """Number of hosts with a process of this local rank."""
    rt._require_init()
    return _basics.cross_size()


def cross_rank():
    """Rank of this process's host among those with the same local rank."""
    rt._require_init()
    return _basics.cross_rank()


def is_homogeneous():
    """True when every host runs the same number of processes."""
    rt._require_init()
    fn = getattr(_basics, 'is_homogeneous', None)
    if fn is not None:
        return bool(fn())
    return size() == local_size() * cross_size()


# MPI queries (the other build queries: engine_native.build_info). MPI (through mpi4py)
# launches and bootstraps ranks started by mpiexec; tensors travel over shm/tcp/NCCL.

def mpi_threads_supported():
    """Whether MPI runs with ``MPI_THREAD_MULTIPLE``, so that mpi4py may be used from other
    threads alongside the core. ValueError (Horovod's) unless :func:`mpi_enabled`."""
    return _basics.mpi_threads_supported()


def mpi_enabled():
    """True while this job runs on MPI: ``init()`` found its ranks through MPI (started by
    mpiexec, or ``init(comm=...)`` with an mpi4py communicator), as with Horovod's MPI
    controller. False before ``init()`` and for ranks started by ``hvdrun``'s own rendezvous
    (where Horovod would run Gloo). MPI only bootstraps: collectives use shm/tcp/NCCL."""
    return _basics.mpi_enabled()


def mpi_built():
    """True when mpi4py is importable: this installation can run ranks started by mpiexec
    and take an mpi4py communicator in ``init(comm=...)`` (the core itself is never compiled
    against MPI)."""
    return _basics.mpi_built()


def start_timeline(file_path, mark_cycles=False):
    """Start writing a Chrome-trace timeline to ``file_path`` (rank 0 writes it)."""
    rt._require_init()
    return _basics.start_timeline(file_path, mark_cycles=mark_cycles)


def stop_timeline():
    """Stop the timeline started with ``start_timeline``."""
    rt._require_init()
    return _basics.stop_timeline()


def elastic_enabled():
    """True when the launcher runs this job in elastic mode (Horovod's HOROVOD_ELASTIC=1)."""
    return os.environ.get('HOROVOD_ELASTIC') == '1' or os.environ.get('HVD_ELASTIC') == '1'
