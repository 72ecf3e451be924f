"""``%hvd_start``'s MPS daemon (issue #19, Note [MPS by default]): by default, when this
machine's ranks outnumber its GPUs, the cluster starts one private MPS daemon before the ranks
touch CUDA, gives them its variables, keeps it across ``%hvd_restart`` and stops it with the
cluster: ``%hvd_stop``, the kernel's exit (the magics' atexit hook) and, if the kernel dies,
the reaper (which watches the daemon's pids).
Engines ``%hvd_scale`` adds join the same daemon. A daemon that cannot start fails ``--mps``,
and is said and passed over without it.

No GPU here: a fake nvidia-smi lists one GPU and a fake ``nvidia-cuda-mps-control``
(tests/fake_mps.py) records what it was asked."""

import json
import os

import pytest
from cluster_harness import magics, run_cell, start_cluster, stop_cluster
from fake_mps import fake_mps_control, records
from gpu_fakes import fake_smi

pytestmark = [pytest.mark.timeout(300)]

# Every rank's MPS variable and whether the daemon's FIFO exists (the cell's value, on rank 0).
PROBE = """%%hvd
import os
p = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
hvd.allgather_object([hvd.rank(), p, bool(p) and os.path.exists(os.path.join(p, "control"))])
"""


@pytest.fixture
def fake_mps(monkeypatch, tmp_path):
    """Returns use(gpus): ``gpus`` fake GPUs and the fake control program on PATH; the record
    file's path."""
    record = str(tmp_path / "mps-record")

    def use(gpus):
        monkeypatch.setenv("PATH", os.pathsep.join([
            fake_mps_control(tmp_path / "mps"), fake_smi(tmp_path / "smi", gpus),
            os.environ["PATH"]]))
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
        monkeypatch.setenv("FAKE_MPS_RECORD", record)
        return record
    return use


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _what(record):
    return [what for what, _ in records(record)]


def test_hvd_start_mps_daemon_lives_with_the_cluster(no_cluster, shell, run, fake_mps):
    record = fake_mps(1)
    try:
        started = start_cluster(shell, "-n 2 --launcher local --timeout 120")  # no flag: auto
        assert started.text.count("2 ranks share 1 GPU(s)") == 1, started.text
        res = run(PROBE)
        assert res.error is None, res.text
        pipe = res.value[0][1]
        assert res.value == [[0, pipe, True], [1, pipe, True]] and pipe
        cluster = magics().cluster
        pids = cluster.mps.pids()
        assert pids and all(_alive(p) for p in pids)
        with open(cluster._reaper.path) as fh:
            assert set(pids) <= set(json.load(fh)["pids"]), "the reaper kills it with the kernel"
        assert run_cell(shell, "%hvd_restart").error is None
        res = run(PROBE)
        assert res.value == [[0, pipe, True], [1, pipe, True]], "the restart kept the daemon"
        assert run_cell(shell, "%hvd_scale -n 3").error is None
        res = run(PROBE)
        assert res.value == [[r, pipe, True] for r in range(3)], "an added rank joins it too"
        assert _what(record).count("start") == 1
    finally:
        stop_cluster(shell)
    assert _what(record)[-2:] == ["quit", "exit"]
    assert not any(_alive(p) for p in pids) and not os.path.exists(os.path.dirname(pipe))


def test_kernel_exit_stops_the_daemon_and_a_failed_daemon_stops_the_start(
        no_cluster, shell, run, fake_mps, monkeypatch):
    record = fake_mps(1)
    try:
        start_cluster(shell, "-n 2 --launcher local --mps --no-dashboard --timeout 120")
        pids = magics().cluster.mps.pids()
        magics()._stop_quietly()  # what the kernel's exit runs (atexit)
        assert magics().cluster is None
        assert _what(record)[-2:] == ["quit", "exit"]
        assert not any(_alive(p) for p in pids)
        monkeypatch.setenv("FAKE_MPS_FAIL", "exit")
        res = run_cell(shell, "%hvd_start -n 2 --launcher local --mps --no-dashboard")
        assert res.error is not None and "-d` failed (1)" in str(res.error), res.text
        assert magics().cluster is None
        started = start_cluster(shell, "-n 2 --launcher local --no-dashboard --timeout 120")
        assert "-d` failed (1)" in started.text and "without MPS" in started.text, started.text
        assert [v[1] for v in run(PROBE).value] == [None, None], "time-sliced, as said"
    finally:
        if magics().cluster is not None:
            stop_cluster(shell)


def test_hvd_start_mps_with_a_gpu_per_rank_starts_nothing(no_cluster, shell, run, fake_mps):
    record = fake_mps(2)
    try:
        started = start_cluster(shell, "-n 2 --launcher local --mps --no-dashboard "
                                       "--timeout 120")
        assert started.text.count("no GPU is shared, so no MPS daemon was started") == 1
        assert [v[1] for v in run(PROBE).value] == [None, None]
        assert _what(record) == []
    finally:
        stop_cluster(shell)
