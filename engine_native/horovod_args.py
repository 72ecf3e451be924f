"""Horovod's argument conventions that every binding's API shares, framework-neutral (no
framework import): the deprecated ``average=`` beside ``op=``, and ``init``'s ``comm`` and
``process_sets``."""
import warnings

from engine_native._dtypes import Average, Sum


def resolve_op(op, average):
    """Horovod's deprecated ``average=`` handling: ``op`` wins, mixing both is an error, and
    neither means Average. Call it from the public function (the warning names its caller)."""
    if op is not None:
        if average is not None:
            raise ValueError('The op parameter supersedes average. '
                             'Please provide only one of them.')
        return op
    if average is not None:
        warnings.warn('Parameter `average` has been replaced with `op` and will be removed in v1.0',
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return Average


def init_arguments(comm, process_sets):
    """``hvd.init``'s ``(comm, process_sets)`` as ``engine_native.basics.init`` takes them:
    a list of MPI_COMM_WORLD ranks becomes an mpi4py communicator, and ``"dynamic"`` becomes
    None (add/remove_process_set always work in engine_native)."""
    if isinstance(process_sets, str):
        if process_sets != 'dynamic':
            raise ValueError('init(process_sets=%r): expected a list of ProcessSet or '
                             '"dynamic"' % (process_sets,))
        process_sets = None
    return _communicator(comm), process_sets


def _communicator(comm):
    """Horovod's ``comm``: None, an mpi4py communicator, or a list of MPI_COMM_WORLD ranks."""
    if not isinstance(comm, (list, tuple)):
        return comm
    ranks = sorted(int(r) for r in comm)
    try:
        from mpi4py import MPI
    except ImportError:
        raise ValueError('init(comm=%r): a list of ranks needs mpi4py and a job started by '
                         'mpiexec' % (comm,)) from None
    world = MPI.COMM_WORLD
    if ranks == list(range(world.Get_size())):
        return world
    if world.Get_rank() not in ranks:
        raise ValueError('init(comm=%r): rank %d of MPI_COMM_WORLD is not in comm'
                         % (comm, world.Get_rank()))
    return world.Create_group(world.Get_group().Incl(ranks))
