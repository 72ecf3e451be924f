"""Fixtures for driving the hvd magics through a real IPython shell against real clusters.

- ``shell``: one InteractiveShell for the session with ``%load_ext hvd_magic``.
- ``run``: runs a cell and returns a CellResult (value, error, stdout, stderr, seconds).
- ``local_cluster``: one 3-rank local cluster for the whole session (a dead rank is restarted
  before the next test that asks); ``mpi_cluster`` (per module) and ``no_cluster`` park it
  while a test needs the shell's single cluster slot.
- Nothing leaks: every cluster a test starts is recorded; the session finalizer kills any
  process still carrying one of their cluster ids (controller, engines, nannies, mpiexec) and
  our reaper watchdogs, even when a test failed or timed out, and fails if it had to.
"""

import contextlib

import pytest
from cluster_harness import kill_strays, magics, run_cell, start_cluster, stop_cluster


@pytest.fixture(scope="session")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_cell("%load_ext hvd_magic", store_history=False)
    yield ip
    import hvd_magic

    if hvd_magic._magics is not None and hvd_magic._magics.cluster is not None:
        hvd_magic._magics._stop_quietly()
    leaked = kill_strays()
    assert not leaked, f"cluster processes were left running: {leaked}"


@pytest.fixture(scope="session")
def run(shell):
    return lambda code: run_cell(shell, code)


@pytest.fixture(scope="session")
def shared_local_cluster(shell):
    """Three ranks on the local launcher, shared by every module that asks (a start costs
    7-10 s on an idle 2-core machine, several times that on a loaded one). ``--framework
    torch`` is the default, named here so that the flag itself is started once
    (test_collectives.py::test_namespace_has_hvd_and_torch checks every rank's binding)."""
    res = start_cluster(shell, "-n 3 --launcher local --gpus none --framework torch "
                               "--env HVD_MAGIC_TEST=yes")
    yield res
    stop_cluster(shell)


@pytest.fixture
def local_cluster(shared_local_cluster, shell):
    """The shared cluster with every rank alive: a test that killed a rank and failed before
    its own %hvd_restart must fail alone, not take every later test down with it."""
    if magics().cluster.dead_ranks():
        res = run_cell(shell, "%hvd_restart")
        assert res.error is None, res.text
    return shared_local_cluster


@contextlib.contextmanager
def parked_cluster(shell):
    """Let a test start clusters of its own: the shared cluster (if any) is set aside, not
    stopped, and comes back afterwards; whatever the test started is stopped."""
    m = magics()
    saved, m.cluster = m.cluster, None
    try:
        yield
    finally:
        if m.cluster is not None:
            stop_cluster(shell)
        m.cluster = saved


@pytest.fixture
def no_cluster(shell):
    with parked_cluster(shell):
        yield


@pytest.fixture(scope="module")
def mpi_cluster(shell):
    """Two MPI ranks (mpiexec), for one module; the shared local cluster is parked meanwhile."""
    with parked_cluster(shell):
        yield start_cluster(shell, "-n 2")
