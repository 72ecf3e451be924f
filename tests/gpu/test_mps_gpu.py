"""Ranks sharing one real GPU under a private MPS daemon (issue #19): the daemon that
hvd_magic.launch.mps starts for a job really serves the ranks (its server list names an MPS
server once they ran), CUDA IPC between MPS clients gives the same answers as the CPU path
(every dtype x op with scales, a tensor above the IPC slot), in both step orders, and every
collective works. Marker ``gpu``; skipped when ``nvidia-cuda-mps-control`` is absent (the
H100 machine has it, not started).
"""
import importlib
import os
import shutil
import sys
import types

import pytest
from multiproc.harness import run_ranks

from gpu.test_gpu_collectives import rank_collectives
from gpu.test_ipc_gpu import IPC, _env, rank_every_op

pytestmark = pytest.mark.gpu
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _mps():
    """launch/mps.py on its own (standard library only; the GPU machine may lack the
    driver-side packages that importing hvd_magic pulls in): a stand-in package over the
    launch folder, whose ``__init__`` never runs, lets its relative import of procfs.py
    resolve to the file."""
    package = "hvd_mps_for_test"
    if package not in sys.modules:
        stand_in = types.ModuleType(package)
        stand_in.__path__ = [os.path.join(REPO, "hvd_magic", "launch")]
        sys.modules[package] = stand_in
    return importlib.import_module(package + ".mps")


@pytest.fixture(scope="module")
def daemon():
    if shutil.which("nvidia-cuda-mps-control") is None:
        pytest.skip("nvidia-cuda-mps-control is not on PATH")
    with _mps().MpsDaemon() as d:
        yield d


@pytest.mark.parametrize("order", ["host", "device"])
def test_every_dtype_and_op_under_mps(daemon, order):
    env = _env(dict(daemon.env, HVD_IPC_ORDER=order))
    results = run_ranks(rank_every_op, 2, env=env, timeout=400)
    assert [r.value for r in results] == [IPC] * 2
    assert daemon.served(), "no MPS server or client in its log: the ranks did not use MPS"


def test_every_collective_under_mps(daemon):
    results = run_ranks(rank_collectives, 2, env=_env(daemon.env), timeout=300)
    assert [r.value for r in results] == [IPC] * 2
