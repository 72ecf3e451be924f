"""The rest of engine_native.torch on CUDA tensors, on a real GPU: allgather (uneven first
dims), alltoall (splits), reducescatter (Horovod's uneven split), broadcast, tensors larger than
the fusion buffer, SyncBatchNorm against BatchNorm on the global batch, and the optimizer-state
broadcast. np=1 runs on NCCL (HVD_GPU_PATH=nccl: not the one-rank local path); np=2 shares
the one GPU (staged path). Marker ``gpu``.
"""
import pytest
from multiproc.harness import run_ranks

pytestmark = pytest.mark.gpu
CONFIGS = pytest.mark.parametrize("np", [1, 2], ids=["np1-nccl", "np2-shared-gpu-staged"])


def _init():
    import os

    import torch

    import engine_native
    import engine_native.torch as hvd
    hvd.init()
    torch.cuda.set_device(0)
    assert os.environ["CUDA_VISIBLE_DEVICES"]
    return torch, hvd, engine_native


def _path(engine_native):
    return engine_native.metrics()["gpu_paths"][0]["path"]


def rank_collectives():
    torch, hvd, engine_native = _init()
    r, n = hvd.rank(), hvd.size()
    for dtype in (torch.float32, torch.float16, torch.int64, torch.uint8):
        mine = torch.full((r + 1, 3), r + 1, dtype=dtype, device="cuda")
        g = hvd.allgather(mine, name=f"ag.{dtype}")
        want = torch.cat([torch.full((q + 1, 3), q + 1, dtype=dtype) for q in range(n)])
        assert g.is_cuda and g.dtype == dtype and torch.equal(g.cpu(), want), (dtype, g)
        splits = [(r + p) % 3 for p in range(n)]
        x = torch.arange(sum(splits) * 2, dtype=dtype, device="cuda").reshape(-1, 2) + r
        out, received = hvd.alltoall(x, splits=torch.tensor(splits), name=f"a2a.{dtype}")
        assert out.is_cuda and received.tolist() == [(p + r) % 3 for p in range(n)]
        b = hvd.broadcast(torch.full((7,), r, dtype=dtype, device="cuda"), root_rank=n - 1,
                          name=f"bc.{dtype}")
        assert b.is_cuda and bool((b == n - 1).all())
    for dim0 in (2 * n, 2 * n + 1):
        x = torch.arange(dim0 * 4, dtype=torch.float32, device="cuda").reshape(dim0, 4) * (r + 1)
        rs = hvd.reducescatter(x, op=hvd.Sum, name=f"rs.{dim0}")
        total = torch.arange(dim0 * 4, dtype=torch.float32).reshape(dim0, 4) * n * (n + 1) / 2
        lo = sum(dim0 // n + (q < dim0 % n) for q in range(r))
        hi = lo + dim0 // n + (r < dim0 % n)
        assert rs.is_cuda and torch.equal(rs.cpu(), total[lo:hi]), (dim0, rs)
    return _path(engine_native)


@CONFIGS
def test_every_collective_on_cuda_tensors(np):
    paths = [r.value for r in run_ranks(rank_collectives, np, env=_env(np=np), timeout=300)]
    assert paths == (["nccl"] if np == 1 else ["staged"] * np)


def test_every_collective_on_the_one_rank_local_path():
    """np=1 as the core chooses it: device copies, no NCCL (Note [A world of one])."""
    env = {k: v for k, v in _env().items() if k != "HVD_GPU_PATH"}
    assert [r.value for r in run_ranks(rank_collectives, 1, env=env, timeout=300)] == ["local"]


def rank_beyond_fusion_buffer(count=24, elements=1 << 17):
    torch, hvd, engine_native = _init()
    r, n = hvd.rank(), hvd.size()
    xs = [torch.full((elements,), float(i + r), device="cuda") for i in range(count)]
    handles = [hvd.allreduce_async(x, op=hvd.Sum, name=f"big.{i}") for i, x in enumerate(xs)]
    for i, h in enumerate(handles):
        y = hvd.synchronize(h)
        assert bool((y == n * i + n * (n - 1) / 2).all()), i
    alone = torch.ones(3 << 20, device="cuda")  # 12 MiB: one tensor above the threshold
    assert bool((hvd.allreduce(alone, op=hvd.Sum, name="alone") == n).all())
    return True


@CONFIGS
def test_tensors_beyond_the_fusion_buffer(np):
    run_ranks(rank_beyond_fusion_buffer, np, env=_env({"HVD_FUSION_THRESHOLD": str(1 << 20)}, np=np),
              timeout=300)


def rank_sync_batch_norm(b=6):
    torch, hvd, _ = _init()
    r, n = hvd.rank(), hvd.size()
    gen = torch.Generator().manual_seed(3)
    full = torch.randn(n * b, 4, 5, 5, generator=gen, dtype=torch.float64).cuda()
    sync = hvd.SyncBatchNorm(4).double().cuda()
    ref = torch.nn.BatchNorm2d(4).double().cuda()
    mine = full[r * b:(r + 1) * b].clone().requires_grad_()
    whole = full.clone().requires_grad_()
    out = sync(mine)
    want = ref(whole)
    torch.testing.assert_close(out, want[r * b:(r + 1) * b])
    (out * out).sum().backward()
    (want * want).sum().backward()
    torch.testing.assert_close(mine.grad, whole.grad[r * b:(r + 1) * b])
    torch.testing.assert_close(sync.running_mean, ref.running_mean)
    return True


@CONFIGS
def test_sync_batch_norm_on_cuda_matches_batch_norm_on_the_global_batch(np):
    run_ranks(rank_sync_batch_norm, np, env=_env(np=np), timeout=300)


def rank_optimizer_state():
    torch, hvd, _ = _init()
    r = hvd.rank()
    torch.manual_seed(r)  # different weights per rank until the broadcast
    model = torch.nn.Linear(8, 3).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
    if r == 0:
        model(torch.ones(2, 8, device="cuda")).sum().backward()
        opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    state = opt.state_dict()
    exp_avg = state["state"][0]["exp_avg"]
    return (state["param_groups"][0]["lr"], exp_avg.is_cuda, exp_avg.sum().item(),
            model.weight.sum().item())


@CONFIGS
def test_broadcast_optimizer_state_on_cuda(np):
    values = [r.value for r in run_ranks(rank_optimizer_state, np, env=_env(np=np), timeout=300)]
    assert all(v == values[0] for v in values) and values[0][0] == 0.01 and values[0][1]


def _env(extra=None, np=1):
    """Every rank on the first visible GPU; several ranks there take the staged path, forced
    (the CUDA-IPC path the core would choose is tests/gpu/test_ipc_gpu.py's)."""
    import os
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    staged = {"HVD_GPU_PATH": "staged" if np > 1 else "nccl"}  # np=1: not the local path
    return dict({"CUDA_VISIBLE_DEVICES": first}, **staged, **(extra or {}))
