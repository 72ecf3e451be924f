"""Horovod's basics for ``engine_native.tensorflow``: ``init`` with Horovod's arguments, on the
framework-neutral ``engine_native.basics`` (one core per process, whatever framework calls
it)."""
from engine_native import basics as _basics
from engine_native.horovod_args import init_arguments


def init(comm=None, process_sets=None):
    """Initialize the core on this process (Horovod's ``hvd.init``); a repeated call is a no-op.

    Parameters
    ----------
    comm : list of int or mpi4py communicator, optional
        Ranks (of MPI_COMM_WORLD) or the communicator to run on (the ranks need mpi4py and a
        job started by mpiexec); default: every process.
    process_sets : list of ProcessSet or "dynamic", optional
        Process sets to register at start-up; "dynamic" is accepted (``add_process_set``
        always works here).
    """
    comm, process_sets = init_arguments(comm, process_sets)
    _basics.init(comm=comm, process_sets=process_sets)
