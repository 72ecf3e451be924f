"""Cluster lifecycle: preflight errors, engines that never register, the MPI launcher, a rank
killed with SIGKILL (reported with its signal, then ``%hvd_restart``), and ``%hvd_stop``
leaving no process behind."""

import os
import time

import pytest
from cluster_harness import cluster_processes, kill_rank, magics

from hvd_magic import preflight
from hvd_magic.errors import RanksDead, StartError

pytestmark = pytest.mark.timeout(240)


def test_missing_mpiexec_is_explained(monkeypatch):
    monkeypatch.setattr(preflight.shutil, "which", lambda name: None)
    with pytest.raises(StartError, match=r"needs `mpiexec`.*pip install mpich mpi4py"):
        preflight.check_launcher("mpi")


def test_mismatched_mpi_is_explained(monkeypatch):
    monkeypatch.setattr(preflight.shutil, "which", lambda name: "/usr/bin/mpiexec")
    monkeypatch.setattr(preflight, "mpiexec_version", lambda _: "mpiexec (OpenRTE) 4.1.2")
    monkeypatch.setattr(preflight, "mpi4py_library", lambda _: "MPICH Version: 4.2.0")
    with pytest.raises(StartError, match="mismatched MPI.*rank 0 of 1"):
        preflight.check_launcher("mpi")


def test_separate_mpi_worlds_are_detected():
    infos = [{"mpi_rank": 0, "mpi_size": 1, "mpi_library": "Open MPI v4"}] * 2
    with pytest.raises(StartError, match="2 separate MPI worlds of size 1"):
        preflight.check_mpi_world(infos, 2)
    preflight.check_mpi_world([{"mpi_rank": r, "mpi_size": 2} for r in (1, 0)], 2)


def test_engines_that_cannot_start_are_reported_with_launcher_output(no_cluster, run):
    t0 = time.monotonic()
    res = run("%hvd_start -n 2 --launcher local --timeout 60 --env PYTHONHOME=/nonexistent")
    assert res.error is not None and magics().cluster is None
    text = str(res.error)
    assert "launcher exited" in text and "Launcher output" in text and "Fix:" in text
    assert "encodings" in text or "Fatal Python error" in text
    assert time.monotonic() - t0 < 30  # noticed when the engines died, not at the timeout


@pytest.mark.mpi
class TestMPI:
    def test_engines_are_one_mpi_world(self, mpi_cluster, run):
        res = run("%%hvd\nfrom mpi4py import MPI\n(MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size)")
        assert res.error is None, res.text
        assert res.value == (0, 2)
        assert "mpi launcher" in mpi_cluster.out

    def test_sigkilled_rank_is_reported_and_restart_recovers(self, mpi_cluster, run):
        from hvd_magic import mpi_shm
        mpich_files = mpi_shm.mapped_by(r.pid for r in magics().cluster.ranks)
        assert mpich_files  # MPICH's shared memory between the two ranks
        victim = kill_rank(1)
        res = run("%%hvd\nprint('hello')")
        assert isinstance(res.error, RanksDead), res.text
        text = "\n".join(res.error._render_traceback_())
        assert "signal 9" in text and f"pid {victim}" in text and "%hvd_restart" in text
        res = run("%hvd_status")
        assert "dead" in res.out
        res = run("%hvd_restart")
        assert res.error is None, res.text
        res = run("%%hvd\nimport os\nos.getpid()")
        assert res.error is None and res.value != victim
        # the killed world never finalized: its file went with the restart, not left in RAM
        assert not [f for f in mpich_files if os.path.exists(f)]

    def test_stop_leaves_nothing_running(self, mpi_cluster, run):
        cids = {magics().cluster.ipp.cluster_id}
        assert "cluster stopped" in run("%hvd_stop").out
        deadline = time.monotonic() + 10
        while cluster_processes(cids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not cluster_processes(cids)  # controller, mpiexec, engines, nannies, reaper
