"""Point-to-point and pipelines on CUDA tensors, on a real GPU (Note [Device point-to-point] in
the core: by CUDA IPC between ranks of one host; Note [Staged point-to-point] in
engine_native/torch/p2p_ops.py: through host memory with HVD_GPU_PATH=staged). Two ranks
share the first visible GPU: CUDA tensors of every size arrive equal, new on a device, in
host memory or into a device tensor, by either route; a send
right behind a long kernel on the current stream sends that kernel's result (the stream
contract); autograd pairs bring the gradient back to the sender's device; GPipe and 1F1B over
two stages on the GPU train like one process. Marker ``gpu``.
"""
import pytest
from multiproc.harness import run_ranks

pytestmark = pytest.mark.gpu


def _init():
    import warnings

    import torch

    import engine_native.torch as hvd
    hvd.init()
    torch.cuda.set_device(0)
    warnings.simplefilter("always")
    return torch, hvd


def rank_messages():
    import warnings

    from engine_native import _core
    torch, hvd = _init()
    r = hvd.rank()
    wrong = []
    with warnings.catch_warnings(record=True) as caught:
        for i, (dtype, shape) in enumerate([(torch.float32, (0,)), (torch.float16, (7, 3)),
                                            (torch.int64, (3, 512, 512))]):
            x = (torch.arange(torch.Size(shape).numel()) % 97).reshape(shape).to(dtype).cuda()
            if r == 0:
                hvd.send(x, 1, tag=i)
                hvd.isend(x, 1, tag=i).wait()
                hvd.send(x, 1, tag=i)
            else:
                got = hvd.recv(0, tag=i, device="cuda")
                out = torch.empty(shape, dtype=dtype, device="cuda")
                filled = hvd.irecv(0, tag=i, out=out).wait()
                if not (got.is_cuda and torch.equal(got, x) and filled is out
                        and torch.equal(out, x)):
                    wrong.append((str(dtype), shape))
                on_host = hvd.recv(0, tag=i)  # this process's current device reads it
                if on_host.is_cuda or not torch.equal(on_host, x.cpu()):
                    wrong.append(("host", str(dtype), shape))
        # the stream contract: a kernel queued behind a long one on the current stream
        y = torch.zeros(1 << 20, device="cuda")
        if r == 0:
            torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the fill below
            y.fill_(7.0)
            hvd.send(y, 1, tag=10)
        else:
            got = hvd.recv(0, tag=10, device="cuda")
            if not bool((got == 7.0).all()):
                wrong.append("the send did not wait for the kernel that wrote its tensor")
    route = _core.p2p_cuda_route(1 - r)
    warned = [str(w.message) for w in caught if "verified" in str(w.message)]
    hvd.shutdown()
    return wrong, route, warned


@pytest.mark.parametrize("route", ["ipc", "staged"])
def test_cuda_tensors_arrive_equal_and_in_stream_order(route):
    env = dict(_env(), **({"HVD_GPU_PATH": "staged"} if route == "staged" else {}))
    for res in run_ranks(rank_messages, 2, env=env, timeout=300):
        wrong, taken, warned = res.value
        assert wrong == [] and taken == route and warned == [], (res.rank, res.value)


def rank_pipeline():
    torch, hvd = _init()
    from engine_native.torch.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    r = hvd.rank()
    torch.manual_seed(0)
    full = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)]).cuda()
    x, y = torch.randn(8, 16, device="cuda"), torch.randn(8, 16, device="cuda")
    mse = torch.nn.functional.mse_loss
    full.zero_grad()
    for chunk_x, chunk_y in zip(x.chunk(4), y.chunk(4)):
        (mse(full(chunk_x), chunk_y) / 4).backward()
    want = [p.grad.clone() for p in full[2 * r:2 * r + 2].parameters()]
    worst = {}
    for cls in (ScheduleGPipe, Schedule1F1B):
        full.zero_grad()
        stage = PipelineStage(full[2 * r:2 * r + 2], r, 2, device="cuda")
        schedule = cls(stage, 4, loss_fn=mse)
        schedule.step(*([x] if r == 0 else []), **({"target": y} if r == 1 else {}))
        got = [p.grad for p in stage.submod.parameters()]
        worst[cls.__name__] = max((g - w).abs().max().item() for g, w in zip(got, want))
    # an autograd pair: rank 1's gradient comes back to rank 0's device
    a = torch.ones(5, device="cuda", requires_grad=True)
    if r == 0:
        hvd.send(a * 2, 1).backward()
        worst["pair"] = (a.grad - 6.0).abs().max().item() if a.grad.is_cuda else 1.0
    else:
        h = hvd.recv(0, requires_grad=True, device="cuda")
        (h * 3).sum().backward()
    hvd.shutdown()
    return worst


@pytest.mark.parametrize("stream_recv", ["0", "1"])
def test_pipeline_stages_on_the_gpu_train_like_one_process(stream_recv):
    # "1": receives final in the stage's stream order (Note [Device point-to-point] I)
    env = dict(_env(), HVD_PIPELINE_STREAM_RECV=stream_recv)
    for res in run_ranks(rank_pipeline, 2, env=env, timeout=300):
        assert all(v <= 1e-5 for v in res.value.values()), (res.rank, res.value)


def _env():
    import os
    return {"CUDA_VISIBLE_DEVICES": (os.environ.get("CUDA_VISIBLE_DEVICES") or "0")
            .split(",")[0]}
