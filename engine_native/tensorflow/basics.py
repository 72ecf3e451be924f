"""Horovod's basics for ``engine_native.tensorflow``: ``init`` with Horovod's TensorFlow
arguments, on the framework-neutral ``engine_native.basics`` (one core per process, whatever
framework calls it)."""
from engine_native import basics as _basics


def init(comm=None, process_sets=None):
    """Initialize the core on this process (Horovod's ``hvd.init``); a repeated call is a no-op.

    Parameters
    ----------
    comm : mpi4py communicator, optional
        Bootstrap through this communicator instead of the launcher's environment or
        MPI_COMM_WORLD.
    process_sets : list of ProcessSet or "dynamic", optional
        Process sets to register at start-up; "dynamic" is accepted (``add_process_set``
        always works here).
    """
    if isinstance(comm, (list, tuple)):
        raise ValueError(f"init(comm={comm!r}): a list of ranks is not supported by "
                         "engine_native.tensorflow; pass an mpi4py communicator")
    if isinstance(process_sets, str):
        if process_sets != "dynamic":
            raise ValueError(f'init(process_sets={process_sets!r}): expected a list of '
                             'ProcessSet or "dynamic"')
        process_sets = None
    _basics.init(comm=comm, process_sets=process_sets)
