"""HVD_GPU_PATH=nccl with ranks sharing a GPU (Note [Device path choice] F), on the fake CUDA
runtime and NCCL, which answers as NCCL does: 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1 takes two
ranks per GPU, anything else refuses duplicates. init() sets the variable under
HVD_GPU_PATH=nccl; the core names the obstacle (an old NCCL, the variable off on a rank, a third
rank on the GPU, ranks demanding different paths) on every rank before NCCL is asked.
tests/gpu/test_nccl_shared_gpu.py runs the same path through real NCCL on a GPU.
"""
import os

import numpy as np
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import device_ops
from multiproc.harness import run_ranks

fake_cuda = _fake_cuda  # the session fixture, under its name
NCCL_2_32 = {"FAKE_NCCL_VERSION": "23203", "HVD_GPU_PATH": "nccl"}


def allreduce_and_path():
    hvd = device_ops.init()
    try:
        out = device_ops.allreduce(np.full(5, hvd.rank() + 1.0, np.float32), hvd.Sum, "x")
    except Exception as exc:  # noqa: BLE001 - the error is the result
        return {"error": str(exc)}
    return {"path": device_ops.gpu_path(), "out": out.tolist(),
            "multi_rank": os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE")}


def _run(fake, np_, extra, rank_env=None, ipc=False):
    kwargs = device_ops.rank_envs(fake, np_, True, extra, ipc=ipc)
    for r, env in (rank_env or {}).items():
        kwargs["rank_env"][r].update(env)
    return [r.value for r in run_ranks(allreduce_and_path, np_, timeout=60, **kwargs)]


def test_nccl_2_30_takes_two_ranks_on_one_gpu_when_asked(fake_cuda, monkeypatch):
    monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE", raising=False)  # init() must set it
    for value in _run(fake_cuda, 2, NCCL_2_32):
        assert value == {"path": "nccl", "out": [3.0] * 5, "multi_rank": "1"}, value


def test_an_old_nccl_is_named_with_the_version_that_would_do(fake_cuda):
    for value in _run(fake_cuda, 2, {"HVD_GPU_PATH": "nccl"}):  # the fake's default 2.28.9
        error = value["error"]
        assert "HVD_GPU_PATH=nccl" in error and "NCCL 2.28.9 (rank 0) refuses" in error, error
        assert "NCCL 2.30 or newer" in error and device_ops.SHARED_BUS_ID in error, error


def test_the_variable_switched_off_on_one_rank_is_named(fake_cuda):
    values = _run(fake_cuda, 2, NCCL_2_32, {1: {"NCCL_MULTI_RANK_GPU_ENABLE": "0"}})
    for value in values:
        assert "NCCL_MULTI_RANK_GPU_ENABLE=1, which rank 1 has set to 0" in value["error"], value


def test_a_rank_sharing_the_gpu_without_the_demand_is_named(fake_cuda):
    for value in _run(fake_cuda, 2, NCCL_2_32, {1: {"HVD_GPU_PATH": "auto"}}):
        assert "rank 1 does not set HVD_GPU_PATH=nccl" in value["error"], value


def test_left_to_choose_ranks_sharing_a_gpu_still_take_cuda_ipc(fake_cuda):
    """F is never chosen by itself: NCCL 2.30+ with the variable on changes nothing."""
    extra = {"FAKE_NCCL_VERSION": "23203", "NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    for value in _run(fake_cuda, 2, extra, ipc=True):
        assert value["path"] == "cuda-ipc" and value["out"] == [3.0] * 5, value


def test_a_third_rank_on_the_gpu_is_refused(fake_cuda):
    for value in _run(fake_cuda, 3, NCCL_2_32):
        error = value["error"]
        assert "ranks 0, 1 and 2 share GPU" in error and "at most 2 ranks per GPU" in error, error


def test_ranks_demanding_different_paths_are_told_so(fake_cuda):
    for value in _run(fake_cuda, 2, NCCL_2_32, {1: {"HVD_GPU_PATH": "ipc"}}):
        assert "the ranks disagree: HVD_GPU_PATH=nccl on rank 0, HVD_GPU_PATH=ipc on rank 1" \
            in value["error"], value


def test_a_mixed_set_that_asks_for_nccl_takes_one_communicator(fake_cuda):
    """Two fake GPUs with two ranks on each, every rank asking: one NCCL communicator over the
    four (F), not the mixed path's IPC within each GPU (E)."""
    kwargs = device_ops.rank_envs(fake_cuda, 4, True, NCCL_2_32)
    for r in range(4):
        kwargs["rank_env"][r]["FAKE_CUDA_BUS_IDS"] = f"0000:0{1 + r // 2}:00.0"
    for res in run_ranks(allreduce_and_path, 4, timeout=90, **kwargs):
        assert res.value == {"path": "nccl", "out": [10.0] * 5, "multi_rank": "1"}, res.value
