"""Horovod's MPI queries tell the truth about the launch in use (#18).

``mpi_built()``: mpi4py is importable. ``mpi_enabled()``: init() found the ranks through MPI
(started by mpiexec, or given an mpi4py communicator), False before init, after shutdown and
for ranks that met through the rendezvous store. ``mpi_threads_supported()``: MPI's thread
level is MPI_THREAD_MULTIPLE; Horovod's ValueError whenever MPI is not enabled.
"""
import pytest

from multiproc.harness import run_mpi, run_ranks


def _answers(hvd):
    """(mpi_built, mpi_enabled, mpi_threads_supported or the ValueError's text)."""
    try:
        threads = hvd.mpi_threads_supported()
    except ValueError as exc:
        threads = str(exc)
    return hvd.mpi_built(), hvd.mpi_enabled(), threads


def rank_queries(explicit_comm):
    import engine_native
    import engine_native.torch as hvd
    before = _answers(hvd)
    if explicit_comm:
        from mpi4py import MPI
        hvd.init(comm=MPI.COMM_WORLD)
    else:
        hvd.init()
    from mpi4py import MPI
    level = MPI.Query_thread()
    during = _answers(hvd), _answers(engine_native)
    hvd.shutdown()
    after = _answers(hvd)
    return {'before': before, 'during': during, 'after': after,
            'multiple': level == MPI.THREAD_MULTIPLE}


NOT_ENABLED = "Horovod MPI is not enabled"


@pytest.mark.parametrize('thread_level', ['multiple', 'single'])
@pytest.mark.parametrize('explicit_comm', [False, True], ids=['mpiexec', 'comm'])
def test_queries_under_mpiexec(explicit_comm, thread_level):
    results = run_mpi(rank_queries, 2, args=(explicit_comm,), timeout=120,
                      env={'MPI4PY_RC_THREAD_LEVEL': thread_level})
    for r in results:
        facts = r.value
        assert facts['multiple'] is (thread_level == 'multiple'), facts
        built, enabled, threads = facts['before']
        assert built is True and enabled is False and NOT_ENABLED in threads, facts
        for answers in facts['during']:  # engine_native.torch, then engine_native
            assert answers == (True, True, facts['multiple']), facts
        built, enabled, threads = facts['after']
        assert built is True and enabled is False and NOT_ENABLED in threads, facts


def rank_queries_rendezvous():
    import engine_native.torch as hvd
    hvd.init()
    answers = _answers(hvd)
    hvd.shutdown()
    return answers


def test_queries_without_mpiexec():
    """Ranks started without mpiexec (hvdrun's way) meet through the rendezvous: no MPI."""
    for r in run_ranks(rank_queries_rendezvous, 2, timeout=60):
        built, enabled, threads = r.value
        assert built is True and enabled is False, r.value
        assert NOT_ENABLED in threads and 'mpiexec' in threads, r.value
