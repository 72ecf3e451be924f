"""CUDA tensors between ranks sharing one real GPU, over CUDA IPC with the reductions compiled
at run time (NVRTC): the path the core chooses by itself when 2 or 4 ranks share the GPU.
Marker ``gpu``: skipped unless torch.cuda.is_available() (``HVD_REQUIRE=gpu`` makes that a
failure). The rank functions are the staged/NCCL tests' (test_nccl_gpu.py,
test_gpu_collectives.py, test_gpu_faults.py) plus every op with scales; each returns or checks
values only a working collective produces, read back from the device.
"""
import os

import pytest
from multiproc.harness import run_ranks

from gpu.test_gpu_collectives import rank_collectives
from gpu.test_gpu_faults import rank_abort_in_flight
from gpu.test_nccl_gpu import rank_allreduce, rank_fusion, rank_stream_order

pytestmark = pytest.mark.gpu
NPS = pytest.mark.parametrize("np", [2, 4], ids=["np2-one-gpu", "np4-one-gpu"])
# Note [IPC step protocol]: host-ordered (the default) and device-ordered (interprocess events)
ORDERS = pytest.mark.parametrize("order", ["host", "device"])
IPC = "cuda-ipc"


def _env(extra=None):
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    return dict({"CUDA_VISIBLE_DEVICES": first}, **(extra or {}))


def _path():
    import engine_native
    return engine_native.metrics()["gpu_paths"][0]["path"]


def rank_every_op():
    """Every dtype x op (Min, Product, Sum with pre/postscale, Average) against the CPU path's
    answer on the same inputs, plus a tensor above the largest IPC slot (chunked)."""
    import torch

    import engine_native.torch as hvd
    hvd.init()
    torch.cuda.set_device(0)
    r = hvd.rank()
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
              torch.int32, torch.int64, torch.uint8]
    for dtype in dtypes:
        base = (torch.arange(4097, dtype=torch.float64) % 5 + 1 + (r % 2)).to(dtype)
        for op, pre, post in ((hvd.Min, 1.0, 1.0), (hvd.Max, 1.0, 1.0), (hvd.Product, 1.0, 1.0),
                              (hvd.Sum, 0.5, 4.0), (hvd.Average, 1.0, 1.0)):
            name = f"op.{dtype}.{op}.{pre}.{post}"
            want = hvd.allreduce(base.clone(), op=op, name=name + ".cpu", prescale_factor=pre,
                                 postscale_factor=post)
            got = hvd.allreduce(base.cuda(), op=op, name=name, prescale_factor=pre,
                                postscale_factor=post)
            tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
            torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol, msg=name)
    big = torch.full((80 << 18,), float(r + 1), device="cuda")  # 80 MiB > the 64 MiB slot
    n = hvd.size()
    assert bool((hvd.allreduce(big, op=hvd.Sum, name="big") == n * (n + 1) / 2).all())
    return _path()


@ORDERS
@NPS
def test_every_dtype_and_op_with_scales(np, order):
    results = run_ranks(rank_every_op, np, env=_env({"HVD_IPC_ORDER": order}), timeout=400)
    assert [r.value for r in results] == [IPC] * np


@NPS
def test_allreduce_suite(np):
    run_ranks(rank_allreduce, np, env=_env(), timeout=400)


@ORDERS
@NPS
def test_every_collective(np, order):
    results = run_ranks(rank_collectives, np, env=_env({"HVD_IPC_ORDER": order}), timeout=300)
    assert [r.value for r in results] == [IPC] * np


@NPS
def test_fusion(np):
    for out in [r.value for r in run_ranks(rank_fusion, np, env=_env(), timeout=300)]:
        assert out["batches"] >= 1 and out["tensors"] > out["batches"], out


def test_stream_order():
    for busy in [r.value for r in run_ranks(rank_stream_order, 2, env=_env(), timeout=300)]:
        assert busy == [True, True], busy


def test_abort_in_flight_then_reinit():
    results = run_ranks(rank_abort_in_flight, 2, env=_env({"HVD_TIMEOUT": "20"}), timeout=300)
    for r in results:
        v = r.value
        assert v["error"] and "abort" in v["error"] and v["again"], v
