"""abort() with CUDA collectives in flight, then shutdown() + init() in the same processes, on a
real GPU: the op fails on every rank (HorovodInternalError), nothing hangs, and the next CUDA
collective works. The op is kept in flight by ~1 s of GPU work queued on its producer stream
ahead of the tensor. Marker ``gpu``.
"""
import os
import time

import pytest
from multiproc import checks
from multiproc.harness import run_ranks

pytestmark = pytest.mark.gpu


def rank_abort_in_flight(spin_cycles=2_000_000_000):
    import torch

    import engine_native
    import engine_native.torch as hvd
    hvd.init()
    torch.cuda.set_device(0)
    r, n = hvd.rank(), hvd.size()
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    if r == n - 1:
        torch.cuda._sleep(spin_cycles)  # the producer is still running at enqueue
    x.fill_(1.0)
    handle = hvd.allreduce_async(x, op=hvd.Sum, name="in_flight")
    bus = checks.out_of_band() if n > 1 else None
    in_flight = not hvd.poll(handle)
    if bus and r != 0:
        bus.set(f"enqueued/{r}", b"1")
    if r == 0:
        for peer in range(1, n):  # an abort before a peer's enqueue fails that enqueue instead
            if bus:
                bus.get(f"enqueued/{peer}", timeout=60)
        engine_native.abort("test abort with CUDA ops in flight")  # not in horovod.torch
        if bus:
            bus.set("aborted", b"1")
    elif bus:
        bus.get("aborted", timeout=60)
    t0 = time.monotonic()
    try:
        hvd.synchronize(handle)
        error = None
    except hvd.HorovodInternalError as exc:
        error = str(exc)
    failed_after = time.monotonic() - t0
    torch.cuda.synchronize()
    hvd.shutdown()
    hvd.init()
    y = hvd.allreduce(torch.ones(5, device="cuda"), op=hvd.Sum, name="after")
    return {"in_flight": in_flight, "error": error, "seconds": failed_after,
            "again": y.is_cuda and bool((y == n).all())}


@pytest.mark.parametrize("np", [1, 2], ids=["np1-nccl", "np2-shared-gpu-staged"])
def test_abort_with_cuda_ops_in_flight_then_reinit(np):
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    env = {"CUDA_VISIBLE_DEVICES": first, "HVD_TIMEOUT": "20",
           "HVD_GPU_PATH": "staged" if np > 1 else "nccl"}  # IPC: test_ipc_gpu.py
    results = run_ranks(rank_abort_in_flight, np, env=env, timeout=300)
    for r in results:
        v = r.value
        assert v["error"] and "abort" in v["error"], v
        assert v["seconds"] < 20 and v["again"], v
    assert results[-1].value["in_flight"], "the op finished before abort: spin longer"


def rank_collective_inside_graph_capture():
    import torch

    import engine_native.torch as hvd
    hvd.init()
    torch.cuda.set_device(0)
    x = torch.ones(8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    refused = None
    with torch.cuda.graph(graph):
        y = x * 2
        try:
            hvd.allreduce(y, name="captured")
        except ValueError as exc:  # refused at enqueue: nothing was queued into the graph
            refused = str(exc)
    graph.replay()
    after = hvd.allreduce(y, op=hvd.Sum, name="after")
    torch.cuda.synchronize()
    return refused, bool((after == 2 * hvd.size()).all())


def test_a_collective_inside_cuda_graph_capture_is_refused():
    """Note [Graph capture] on a real GPU: torch.cuda.graph's capture stream is detected."""
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    [r] = run_ranks(rank_collective_inside_graph_capture, 1, timeout=120,
                    env={"CUDA_VISIBLE_DEVICES": first})
    refused, after_ok = r.value
    assert refused and "capturing a CUDA graph" in refused, refused
    assert after_ok
