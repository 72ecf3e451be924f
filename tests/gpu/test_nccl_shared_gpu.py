"""Real NCCL with two ranks on the one GPU (issue #39 item 1; Note [Device path choice] F):
HVD_GPU_PATH=nccl, NCCL 2.30+ (NCCL_MULTI_RANK_GPU_ENABLE=1, which init() sets), the ranks
under a private MPS daemon as NCCL advises for ranks sharing a GPU. The multi-GPU NCCL code
path — every collective and dtype, fusion beyond the buffer, stream order behind a running
producer, SyncBatchNorm, DistributedOptimizer against one process, abort in flight then
init() again — on a one-GPU machine; and point-to-point of CUDA tensors over NCCL
(Note [NCCL point-to-point]: HVD_GPU_PATH=nccl routes it there; written after the H200 run of
2026-12-04, not yet run on a GPU). Marker ``gpu``; skipped when the NCCL the core loads is
older than 2.30 (benchmarks/gpu_check.sh brings 2.32.3 along and points HVD_NCCL_LIBRARY at
it) or MPS is missing.
"""
import os

import pytest
from multiproc.harness import run_ranks

from gpu.test_gpu_collectives import rank_beyond_fusion_buffer, rank_collectives
from gpu.test_gpu_collectives import rank_sync_batch_norm
from gpu.test_gpu_faults import rank_abort_in_flight
from gpu.test_mps_gpu import daemon  # noqa: F401 (the fixture)
from gpu.test_nccl_gpu import _init, rank_allreduce, rank_optimizer, rank_stream_order

pytestmark = pytest.mark.gpu


def _nccl_version():
    from engine_native import gpu
    info = gpu.nccl_info()
    return info["version"] if info["loaded"] else 0, info


@pytest.fixture(scope="module")
def env(daemon):  # noqa: F811 (the fixture above)
    version, info = _nccl_version()
    if version < 23000:
        pytest.skip(f"NCCL {info.get('version_text') or info.get('error')} from "
                    f"{info.get('path')} takes one rank per GPU; 2.30+ takes two "
                    "(HVD_NCCL_LIBRARY)")
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    # NCCL's advice for ranks sharing a GPU: few channels each, so both ranks' kernels fit.
    ctas = os.environ.get("NCCL_MAX_CTAS", "8")
    return dict(daemon.env, CUDA_VISIBLE_DEVICES=first, HVD_GPU_PATH="nccl",
                NCCL_MAX_CTAS=ctas, HVD_TIMEOUT="60")


def rank_everything_on_nccl():
    """The cases that need no special set-up, in one launch: each raises on a wrong value."""
    from engine_native import gpu
    rank_allreduce()
    rank_beyond_fusion_buffer()
    rank_sync_batch_norm()
    rank_optimizer()
    path = rank_collectives()
    return path, os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE"), gpu.nccl_version()


def test_every_collective_dtype_and_training_on_nccl_with_two_ranks_on_one_gpu(env, daemon):  # noqa: F811
    values = [r.value for r in run_ranks(rank_everything_on_nccl, 2, env=env, timeout=400)]
    for path, multi_rank, version in values:
        assert path == "nccl" and multi_rank == "1" and version >= 23000, values
    assert daemon.served(), "no MPS server or client in its log: the ranks did not use MPS"


def test_allreduce_waits_for_the_producer_with_two_ranks_on_nccl(env):
    for r in run_ranks(rank_stream_order, 2, env=env, timeout=300):
        assert all(r.value), "the producer finished before allreduce was called: spin longer"


def test_abort_in_flight_then_init_again_on_nccl(env):
    results = run_ranks(rank_abort_in_flight, 2, env=dict(env, HVD_TIMEOUT="20"), timeout=300)
    for r in results:
        assert r.value["error"] and "abort" in r.value["error"], r.value
        assert r.value["seconds"] < 20 and r.value["again"], r.value
    assert results[-1].value["in_flight"], "the op finished before abort: spin longer"


def rank_p2p_over_nccl():
    from engine_native import _core
    torch, hvd = _init()
    r = hvd.rank()
    peer = 1 - r
    wrong = []
    for tag, (dtype, shape) in enumerate([(torch.float32, (0,)), (torch.float16, (7, 3)),
                                          (torch.int64, (3, 512, 512))]):
        base = (torch.arange(torch.Size(shape).numel()) % 97).reshape(shape).to(dtype)
        x = (base + r).cuda()
        if r == 0:
            hvd.send(x, peer, tag=tag)
            got = hvd.recv(peer, tag=tag, device="cuda")
        else:
            got = hvd.recv(peer, tag=tag, device="cuda")
            hvd.send(x, peer, tag=tag)
        if not (got.is_cuda and got.dtype == dtype and torch.equal(got.cpu(), base + peer)):
            wrong.append((str(dtype), shape))
    return wrong, _core.p2p_cuda_route(peer)


def test_point_to_point_over_nccl_with_two_ranks_on_one_gpu(env):
    for res in run_ranks(rank_p2p_over_nccl, 2, env=env, timeout=300):
        wrong, route = res.value
        assert wrong == [] and route == "nccl", (res.rank, res.value)
