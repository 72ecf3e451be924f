"""GPU pinning by each launcher (#16): hvdrun (its own ranks, and through mpiexec + rankwrap),
hvd_magic.run, HorovodRunner(np < 0) and Spark's GPU-scheduled tasks all pin through
engine_native.gpu.pin_gpu: one GPU per local rank (CUDA_VISIBLE_DEVICES narrowed), sharing said
once, ``--gpus none`` / ``gpus="none"`` hides the GPUs, a machine without GPUs pays nothing,
and Horovod's ``torch.cuda.set_device(hvd.local_rank())`` still lands on the rank's GPU.

No GPU: a fake nvidia-smi on PATH lists two; the ranks import a tiny fake torch package whose
``torch.cuda.calls`` shows what set_device received (tests/gpu_fakes.py)."""
import io
import json
import os
import sys
import types

import pytest
from gpu_fakes import cuda_tracer, fake_smi, fake_torch

from hvd_magic import gpu_pinning
from hvd_magic.launch import run
from hvd_magic.runner import HorovodRunner
from hvd_magic.spark.task import assigned_gpus

from .conftest import hvdrun

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

# What every rank prints or returns: its local rank, CUDA_VISIBLE_DEVICES, the pinned GPU and
# what torch.cuda.set_device(hvd.local_rank()) asked of CUDA.
PROBE = '''
import json, os

def probe():
    import torch
    local = int(os.environ.get("HVD_LOCAL_RANK") or os.environ.get("MPI_LOCALRANKID"))
    torch.cuda.set_device(local)
    pin = json.loads(os.environ.get("HVD_GPU_PIN", "null")) or {}
    return [local, os.environ.get("CUDA_VISIBLE_DEVICES"), pin.get("gpu_index"),
            torch.cuda.calls]

if __name__ == "__main__" and os.environ.get("HVD_PROBE_PRINT"):
    print("PROBE " + json.dumps(probe()))
'''


@pytest.fixture
def gpus2(tmp_path, monkeypatch):
    """Two fake GPUs on PATH and the fake torch first on PYTHONPATH, for everything started."""
    monkeypatch.setenv("PATH", fake_smi(tmp_path / "smi", 2) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("PYTHONPATH", fake_torch(tmp_path / "torch"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return str(script)


def _probes(stdout: str) -> dict:
    """rank -> probe result from hvdrun's tagged output."""
    out = {}
    for line in stdout.splitlines():
        tag, _, text = line.partition("<stdout>:")
        if text.startswith("PROBE "):
            out[int(tag.strip("[]"))] = json.loads(text[6:])
    return out


def test_hvdrun_pins_one_gpu_per_local_rank_and_says_sharing_once(gpus2, no_leaks):
    res = hvdrun("-np", "3", sys.executable, gpus2, env={"HVD_PROBE_PRINT": "1"})
    assert res.returncode == 0, res.stderr
    # ranks 0 and 2 share GPU 0; set_device(local rank) lands on cuda:0, the pinned GPU
    assert _probes(res.stdout) == {0: [0, "0", 0, [0]], 1: [1, "1", 1, [0]],
                                   2: [2, "0", 0, [0]]}, res.stdout
    assert (res.stdout + res.stderr).count("3 ranks on this host share 2 GPU(s)") == 1, res.stderr


def test_hvdrun_fake_hosts_on_one_machine_do_not_share_a_gpu(gpus2, no_leaks):
    res = hvdrun("-np", "2", "-H", "localhost:1,127.0.0.1:1", sys.executable, gpus2,
                 env={"HVD_PROBE_PRINT": "1"})
    assert res.returncode == 0, res.stderr
    assert _probes(res.stdout) == {0: [0, "0", 0, [0]], 1: [0, "1", 1, [0]]}, res.stdout
    assert "share" not in res.stdout + res.stderr


def test_hvdrun_gpus_none_hides_the_gpus(gpus2, no_leaks):
    res = hvdrun("-np", "2", "--gpus", "none", sys.executable, gpus2,
                 env={"HVD_PROBE_PRINT": "1"})
    assert res.returncode == 0, res.stderr
    # no pin: set_device(local rank) goes to CUDA unchanged (a real CUDA has no GPU to give)
    assert _probes(res.stdout) == {0: [0, "", None, [0]], 1: [1, "", None, [1]]}, res.stdout


@pytest.mark.mpi
def test_hvdrun_through_mpiexec_pins_on_the_ranks_host(gpus2, no_leaks):
    res = hvdrun("-np", "2", "--mpi", "-H", "localhost:2", sys.executable, gpus2,
                 env={"HVD_PROBE_PRINT": "1"})
    assert res.returncode == 0, res.stderr
    assert _probes(res.stdout) == {0: [0, "0", 0, [0]], 1: [1, "1", 1, [0]]}, res.stdout


def _notebook():
    ns = {"__name__": "__main__"}  # cloudpickle ships functions of __main__ by value
    exec(compile(PROBE, "<notebook cell>", "exec"), ns)
    return ns


def test_run_pins_each_rank_before_fn_and_says_sharing_once(gpus2, no_leaks):
    err = io.StringIO()
    results = run(_notebook()["probe"], np=3, stderr=err, stdout=io.StringIO())
    assert results == [[0, "0", 0, [0]], [1, "1", 1, [0]], [2, "0", 0, [0]]]
    assert err.getvalue().count("3 ranks on this host share 2 GPU(s)") == 1, err.getvalue()


def test_horovod_runner_pins_and_gpus_none_hides(gpus2, no_leaks):
    probe = _notebook()["probe"]
    assert HorovodRunner(np=-2).run(probe) == [0, "0", 0, [0]]
    assert HorovodRunner(np=-2, gpus="none").run(probe) == [0, "", None, [0]]
    with pytest.raises(ValueError, match="HorovodRunner: gpus must be one of auto, none"):
        HorovodRunner(np=-2, gpus="0,1")


CPU_PROBE = '''
def cpu_probe():
    import os, torch
    x = torch.ones(3) * 2  # CPU training
    return (os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("HVD_GPU_PIN"),
            torch.cuda.is_initialized(), list(torch.cuda._hvd_touched), float(x.sum()))
'''


def test_run_without_gpus_pays_nothing(tmp_path, monkeypatch, no_leaks):
    monkeypatch.setenv("PATH", fake_smi(tmp_path / "smi", 0) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("PYTHONPATH", cuda_tracer(tmp_path / "tracer"))  # real torch, traced
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    ns = {"__name__": "__main__"}
    exec(compile(CPU_PROBE, "<notebook cell>", "exec"), ns)
    for (visible, pin, initialised, touched, total) in run(ns["cpu_probe"], np=2):
        assert (visible, initialised, touched, total) == (None, False, [], 6.0)
        assert json.loads(pin)["device"] == "cpu"


def test_spark_tasks_given_gpus_use_those(tmp_path):
    env = {"PATH": fake_smi(tmp_path, 4)}
    pin = assigned_gpus({"gpu": types.SimpleNamespace(addresses=["3"])}, env, local_rank=1)
    assert (env["CUDA_VISIBLE_DEVICES"], pin["gpu_index"], pin["local_rank"]) == ("3", 3, 1)
    assert not pin["staged"]  # alone on its assigned GPU, whatever the local size
    assert gpu_pinning.pin(1, 2, environ=env) == pin  # the rank keeps it (launch/task.py)
    assert assigned_gpus({}, env := {"PATH": env["PATH"]}, 0) is None and env == {
        "PATH": str(tmp_path)}
    hidden = {"CUDA_VISIBLE_DEVICES": ""}
    assert assigned_gpus({"gpu": types.SimpleNamespace(addresses=["0"])}, hidden, 0) is None
