"""The ranks of benchmarks/bench_gpu.py (and bench_gpu_hvdrun.py): what each rank runs and how a
case starts them.

A rank body is ``fn(system, rank, size, port, *rest)``: ``system`` is "ours" (engine_native.torch,
meeting at a rendezvous server :func:`run` starts) or what ours is compared with: "torch"
(torch.distributed NCCL, rank_latency), "gloo" or "nccl" (rank_allreduce), "ddp" (DDP over gloo) or
"alone" (no communication; rank_step); ``port`` is torch.distributed's. :func:`run` spawns
``size`` of them and returns their results in rank order, failing fast when one dies.
"""
import contextlib
import multiprocessing as mp
import os
import queue as queue_module
import secrets
import socket
import sys
import time
import traceback
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # engine_native, from this checkout


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cnn():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(128, 256, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(256, 256, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(256 * 4 * 4, 300), torch.nn.ReLU(),
        torch.nn.Linear(300, 10))


# ---- rank bodies (run in spawned processes) ------------------------------------------------

def _init_ours(rank, size, port):
    """The core on this rank; ``port`` is unused (our ranks meet at the parent's rendezvous
    server, whose address is in the environment)."""
    import engine_native.torch as hvd
    hvd.init()
    return hvd


def _init_torch(backend, rank, size, port):
    import torch.distributed as dist
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size)
    return dist


def _timed(fn, iters, sync):
    fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def rank_latency(system, rank, size, port, iters):
    import torch
    torch.cuda.set_device(0)
    x = torch.ones(1, device="cuda")
    if system == "ours":
        hvd = _init_ours(rank, size, port)
        out = {"waited": _timed(lambda: hvd.allreduce(x, op=hvd.Sum, name="lat"), iters,
                                lambda: None)}
        import engine_native
        out["path"] = engine_native.metrics()["gpu_paths"][0]["path"]
        hvd.shutdown()
        return out
    dist = _init_torch("nccl", rank, size, port)
    waited = _timed(lambda: dist.all_reduce(x), iters, torch.cuda.synchronize)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    enqueue = (time.perf_counter() - t0) / iters
    torch.cuda.synchronize()
    dist.destroy_process_group()
    return {"waited": waited, "enqueue": enqueue}


def rank_allreduce(system, rank, size, port, nbytes, iters):
    import torch
    torch.cuda.set_device(0)
    x = torch.full((nbytes // 4,), float(rank + 1), device="cuda")
    if system == "ours":
        hvd = _init_ours(rank, size, port)
        times = _timed(lambda: hvd.allreduce_(x, op=hvd.Sum, name="bw"), iters, lambda: None)
        import engine_native
        path = engine_native.metrics()["gpu_paths"][0]["path"]
        hvd.shutdown()
    else:  # "gloo", or "nccl": torch.distributed's NCCL (the library the process loaded)
        dist = _init_torch(system, rank, size, port)
        times = _timed(lambda: dist.all_reduce(x), iters, torch.cuda.synchronize)
        dist.destroy_process_group()
        path = system
    return {"times": times, "path": path}


def ours_round_trip(send, recv, x, first, peer):
    """One round trip of ours between ranks 0 and 1, each message received onto the GPU: the
    ``first`` rank sends ``x`` and receives; the other receives and sends back what came."""
    if first:
        send(x, peer)
        return recv(peer, device="cuda")
    got = recv(peer, device="cuda")
    send(got, peer)
    return got


def rank_p2p(system, rank, size, port, sizes, iters):
    """Ping-pong of a CUDA tensor between ranks 0 and 1 (sharing the GPU), each message
    received onto the GPU, at each of ``sizes`` (bytes) in one process: the round trips' times
    per size. "ours" sends by the core's own route (CUDA IPC, or staged with
    HVD_GPU_PATH=staged); "gloo" is what a torch.distributed user writes for CUDA tensors on
    gloo, whose send/recv take CPU tensors: .cpu(), send, recv, .cuda()."""
    import torch
    torch.cuda.set_device(0)
    peer = 1 - rank
    if system == "ours":
        hvd = _init_ours(rank, size, port)
    else:
        dist = _init_torch("gloo", rank, size, port)
    times = {}
    for nbytes in sizes:
        x = torch.full((max(nbytes // 4, 1),), float(rank + 1), device="cuda")
        if system == "ours":
            def hop(t, first):
                return ours_round_trip(hvd.send, hvd.recv, t, first, peer)
        else:
            host = torch.empty(x.numel())

            def hop(t, first):
                if first:
                    dist.send(t.cpu(), peer)
                    dist.recv(host, peer)
                    return host.cuda()
                dist.recv(host, peer)
                got = host.cuda()
                dist.send(got.cpu(), peer)
                return got
        count = iters if nbytes <= 16 * 2**20 else max(iters // 2, 5)
        times[nbytes] = _timed(lambda: hop(x, rank == 0), count, torch.cuda.synchronize)
    if system == "ours":
        hvd.shutdown()
    else:
        dist.destroy_process_group()
    return {"times": times, "path": system}


def cnn_step(system, rank, size, port, batch):
    """The CNN's training step on this rank's GPU, as ``system`` runs it ("ours":
    DistributedOptimizer; "ddp": DDP over gloo; "alone": no communication): (step, parameter
    count, a function that ends the system's world), after 5 warm-up steps."""
    import torch
    torch.cuda.set_device(0)
    model = _cnn().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator(device="cuda").manual_seed(rank)
    x = torch.randn(batch, 3, 32, 32, device="cuda", generator=gen)
    y = torch.randint(0, 10, (batch,), device="cuda", generator=gen)
    net, end = model, (lambda: None)
    if system == "ours":
        hvd = _init_ours(rank, size, port)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        end = hvd.shutdown
    elif system == "ddp":
        dist = _init_torch("gloo", rank, size, port)
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
        end = dist.destroy_process_group

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(5):
        step()
    return step, sum(p.numel() for p in model.parameters()), end


def rank_step(system, rank, size, port, steps, batch):
    import torch
    step, params, end = cnn_step(system, rank, size, port, batch)
    times = _timed(step, steps, torch.cuda.synchronize)
    end()
    return {"times": times, "params": params}


def _entry(fn, args, rank, env, queue):
    os.environ.update(env)
    try:
        queue.put((rank, fn(*args[:1], rank, *args[1:]), None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        queue.put((rank, None, traceback.format_exc()))


@contextlib.contextmanager
def _bootstrap(system, size, extra=None):
    """Per-rank environments: ours meet at a rendezvous server run here; torch's at a port."""
    if system != "ours":
        yield [dict(extra or {}) for _ in range(size)]
        return
    from engine_native.rendezvous import RendezvousServer
    secret = secrets.token_bytes(32)
    with RendezvousServer(secret) as server:
        host, port = server.address
        shared = {"HVD_RENDEZVOUS": f"{host}:{port}", "HVD_SECRET": secret.hex(),
                  "HVD_JOB_ID": uuid.uuid4().hex[:12], "HVD_SIZE": str(size)}
        yield [dict(shared, HVD_RANK=str(r), **(extra or {})) for r in range(size)]


def run(fn, size, *args, timeout=300, env=None):
    """fn(system, rank, size, port, *rest) on `size` spawned ranks; rank results in order."""
    with _bootstrap(args[0], size, env) as envs:
        return _run(fn, size, args, envs, timeout)


def _run(fn, size, args, envs, timeout):
    system, rest = args[0], args[1:]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=_entry, args=(fn, (system, size, port) + rest, r, envs[r],
                                              queue))
             for r in range(size)]
    for p in procs:
        p.start()
    results, deadline = {}, time.monotonic() + timeout
    try:
        while len(results) < size:
            try:
                rank, value, error = queue.get(timeout=1.0)
            except queue_module.Empty:
                # A rank that died (a crash) sends nothing: stop now, not at the deadline.
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)
                        and r not in results]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"{fn.__name__}({system}): rank(s) {dead} died "
                                       f"(exit codes {[procs[r].exitcode for r in dead]})"
                                       if dead else f"{fn.__name__}({system}): timed out")
                continue
            if error:
                raise RuntimeError(f"{fn.__name__}({system}) rank {rank} failed:\n{error}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(size)]
