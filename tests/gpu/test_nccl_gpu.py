"""CUDA tensors through the core: NCCL, the staged fallback, fusion, stream ordering, training.

Marker ``gpu``: skipped unless torch.cuda.is_available() (``HVD_REQUIRE=gpu`` makes that a
failure). Written for a one-GPU machine: np=1 runs on NCCL; np=2 puts both ranks on the same GPU,
which NCCL refuses, so the core must take its staged fallback (device -> host -> shm -> device).
Every check is on values only a working reduction produces, read back from the device, so none
of these can pass while the CUDA path is missing. Ranks are spawned processes (multiproc harness).
"""
import os

import pytest
from multiproc.harness import run_ranks

pytestmark = pytest.mark.gpu

MIB = 1 << 20


def _same_gpu_env(extra=None, np=1):
    """Every rank on the first visible GPU: the one-GPU machine's situation, anywhere. Several
    ranks there take the staged path, forced (the CUDA-IPC path the core would choose is
    tests/gpu/test_ipc_gpu.py's)."""
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    staged = {"HVD_GPU_PATH": "staged" if np > 1 else "nccl"}  # np=1: not the local path
    return dict({"CUDA_VISIBLE_DEVICES": first}, **staged, **(extra or {}))


def _values(results):
    return [r.value for r in results]


def _init():
    import torch

    import engine_native.torch as hvd
    hvd.init()
    torch.cuda.set_device(0)
    return torch, hvd


# ---- NCCL found, loaded at first CUDA use, reported as Horovod reports it -----------------

def rank_nccl_loaded():
    from engine_native import gpu
    torch, hvd = _init()
    hvd.allreduce(torch.ones(4, device="cuda"), name="first_cuda_use")
    info, cudart = gpu.nccl_info(), gpu.cuda_runtime_info()
    return {"after": gpu.nccl_version(), "built": hvd.nccl_built(),
            "cuda_built": hvd.cuda_built(), "info": info, "cudart": cudart}


def test_nccl_is_loaded_at_first_cuda_use_and_reported():
    out = _values(run_ranks(rank_nccl_loaded, 1, env=_same_gpu_env(), timeout=120))[0]
    assert out["info"]["loaded"], out["info"]["error"]
    assert out["cudart"]["loaded"], out["cudart"]["error"]
    version = out["info"]["version"]
    assert version >= 21000 and out["after"] == version and out["built"] == version
    assert out["cuda_built"] is True


# ---- allreduce: np=1 on NCCL, np=2 sharing one GPU (staged) -------------------------------

def rank_allreduce():
    torch, hvd = _init()
    r, n = hvd.rank(), hvd.size()
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
              torch.int64, torch.uint8]
    for dtype in dtypes:
        for count in (0, 1, 1000, 4 * MIB + 3):  # the last is larger than any segment
            base = torch.arange(count, device="cuda", dtype=torch.float64) % 7
            x = (base + r + 1).to(dtype)
            expect = (base * n + n * (n + 1) // 2).to(dtype)
            name = f"ar.{dtype}.{count}"
            y = hvd.allreduce(x, op=hvd.Sum, name=name + ".sum")
            assert y.is_cuda and y.device == x.device and y.dtype == dtype, (name, y.device)
            torch.testing.assert_close(y, expect, rtol=1e-2, atol=0, msg=name)
            top = hvd.allreduce(x, op=hvd.Max, name=name + ".max")
            torch.testing.assert_close(top, (base + n).to(dtype), rtol=0, atol=0, msg=name)
            if dtype.is_floating_point:
                avg = hvd.allreduce(x, op=hvd.Average, name=name + ".avg")
                torch.testing.assert_close(avg, (base + (n + 1) / 2).to(dtype), rtol=1e-2,
                                           atol=1e-2, msg=name)
    z = torch.full((3, 5), float(r + 1), device="cuda")
    hvd.allreduce_(z, op=hvd.Sum, name="in_place")
    assert z.is_cuda and bool((z == n * (n + 1) / 2).all())
    g = hvd.allgather(torch.full((r + 1, 2), float(r), device="cuda"), name="gather")
    assert g.is_cuda and g.shape == (n * (n + 1) // 2, 2)
    b = hvd.broadcast(torch.full((4,), float(r), device="cuda"), root_rank=n - 1, name="bcast")
    assert b.is_cuda and bool((b == n - 1).all())
    return True


@pytest.mark.parametrize("np", [1, 2], ids=["np1-nccl", "np2-shared-gpu-staged"])
def test_allreduce_on_device(np):
    run_ranks(rank_allreduce, np, env=_same_gpu_env(np=np), timeout=300)


# ---- fusion on the device -----------------------------------------------------------------

def rank_fusion(count=128, elements=1024):
    import engine_native
    torch, hvd = _init()
    r, n = hvd.rank(), hvd.size()
    m0 = engine_native.metrics()
    xs = [torch.full((elements,), float(i + r), device="cuda") for i in range(count)]
    handles = [hvd.allreduce_async(x, op=hvd.Sum, name=f"fuse.{i}") for i, x in enumerate(xs)]
    ys = [hvd.synchronize(h) for h in handles]
    m1 = engine_native.metrics()
    for i, y in enumerate(ys):
        assert y.is_cuda and bool((y == n * i + n * (n - 1) / 2).all()), i
    return {"batches": m1["fused_batches"] - m0["fused_batches"],
            "tensors": m1["fused_tensors"] - m0["fused_tensors"]}


@pytest.mark.parametrize("np", [1, 2], ids=["np1-nccl", "np2-shared-gpu-staged"])
def test_small_cuda_tensors_are_fused(np):
    for out in _values(run_ranks(rank_fusion, np, env=_same_gpu_env(np=np), timeout=300)):
        if np > 1:  # one rank has nothing to exchange: the core need not fuse (as on the CPU)
            assert out["batches"] >= 1 and out["tensors"] > out["batches"], out


# ---- stream ordering: the producer kernel is still running when allreduce is called -------

def rank_stream_order(spin_cycles=2_000_000_000):
    torch, hvd = _init()
    r, n = hvd.rank(), hvd.size()
    want = n * (n + 1) / 2
    busy = []
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side):
        with torch.cuda.stream(stream):
            x = torch.zeros(4 * MIB, device="cuda")
            torch.cuda.synchronize()
            torch.cuda._sleep(spin_cycles)  # ~1 s of GPU work ahead of the producer
            x.fill_(r + 1)                  # the producer: queued behind the spin
            busy.append(not stream.query())
            y = hvd.allreduce(x, op=hvd.Sum, name=f"ordered.{len(busy)}")
            y_min, y_max = y.min().item(), y.max().item()
        assert (y_min, y_max) == (want, want), (stream, y_min, y_max)
    return busy


@pytest.mark.parametrize("np", [1, 2], ids=["np1-nccl", "np2-shared-gpu-staged"])
def test_allreduce_waits_for_the_producer_on_the_callers_stream(np):
    for busy in _values(run_ranks(rank_stream_order, np, env=_same_gpu_env(np=np), timeout=300)):
        assert all(busy), "the producer finished before allreduce was called: spin longer"


# ---- DistributedOptimizer on CUDA equals single-process training on the global batch ------

def _trains_like_one_process(hvd, make_model, make_sgd, batches, loss_fn, b, device="cuda"):
    """Trains a DistributedOptimizer copy on this rank's b rows of each global batch and a
    single-process copy on the whole batch; their weights must end equal (on ``device``)."""
    import torch
    r = hvd.rank()
    dist_model, ref_model = make_model(), make_model()
    opt = hvd.DistributedOptimizer(make_sgd(dist_model.parameters()),
                                   named_parameters=dist_model.named_parameters())
    ref_opt = make_sgd(ref_model.parameters())
    hvd.broadcast_parameters(dist_model.state_dict(), root_rank=0)
    mine = slice(r * b, (r + 1) * b)
    for xs, ys in batches:
        opt.zero_grad()
        loss_fn(dist_model(xs[mine]), ys[mine]).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(ref_model(xs), ys).backward()
        ref_opt.step()
    for p, q in zip(dist_model.parameters(), ref_model.parameters()):
        assert p.device.type == device
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-9)
    return True


def rank_optimizer(steps=5, b=8):
    torch, hvd = _init()
    n = hvd.size()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(steps * n * b, 16, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 4, (steps * n * b,), generator=gen)

    def model():
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                   torch.nn.Linear(32, 4)).double().cuda()

    batches = [(x[k:k + n * b].cuda(), y[k:k + n * b].cuda()) for k in range(0, len(x), n * b)]
    return _trains_like_one_process(
        hvd, model, lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), batches,
        torch.nn.functional.cross_entropy, b)


@pytest.mark.parametrize("np", [1, 2], ids=["np1-nccl", "np2-shared-gpu-staged"])
def test_distributed_optimizer_on_cuda(np):
    run_ranks(rank_optimizer, np, env=_same_gpu_env(np=np), timeout=300)


def rank_sparse_optimizer(steps=4, b=6):
    """Sparse embedding gradients on CUDA (Note [Packed sparse layout]: the block's counts and
    padding are made on the gradients' device) equal single-process training."""
    torch, hvd = _init()
    n = hvd.size()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (steps * n * b, 3), generator=gen)

    def model():
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Embedding(50, 4, sparse=True), torch.nn.Flatten(),
                                   torch.nn.Linear(12, 1)).double().cuda()

    zeros = torch.zeros(n * b, 1, dtype=torch.float64).cuda()  # mse against 0: mean(out^2)
    batches = [(ids[k:k + n * b].cuda(), zeros) for k in range(0, len(ids), n * b)]
    return _trains_like_one_process(hvd, model, lambda params: torch.optim.SGD(params, lr=0.1),
                                    batches, torch.nn.functional.mse_loss, b)


@pytest.mark.parametrize("np", [1, 2], ids=["np1-nccl", "np2-shared-gpu-staged"])
def test_sparse_gradients_on_cuda(np):
    run_ranks(rank_sparse_optimizer, np, env=_same_gpu_env(np=np), timeout=300)


# ---- pin_gpu on a real machine --------------------------------------------------------------

def rank_pin():
    from engine_native import gpu
    out = gpu.pin_gpu(0, 1)  # before CUDA is initialised in this process
    shared = gpu.pin_gpu(1, 2, environ=dict(os.environ))
    import torch
    return out, shared, torch.cuda.get_device_name(0), torch.cuda.get_device_properties(
        0).total_memory


def test_pin_gpu_describes_the_device_torch_sees():
    out, shared, name, memory = _values(run_ranks(rank_pin, 1, env=_same_gpu_env(),
                                                  timeout=120))[0]
    assert out["device"] == "cuda:0" and out["name"] == name, out
    assert abs(out["memory_bytes"] - memory) <= 0.05 * memory, (out, memory)
    assert shared["staged"] and shared["shared"] and shared["device"] == "cuda:0"
