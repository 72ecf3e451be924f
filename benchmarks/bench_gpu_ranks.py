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


def rank_cpu_latency(system, rank, size, port, iters):
    """4 B on the CPU, no GPU touched: allreduce per call and (ours) a point-to-point ping-pong
    between ranks 0 and 1 (half a round trip) — what the machine's process wake-ups cost,
    beside which the CUDA figures are read."""
    import torch
    x = torch.ones(1)
    if system == "ours":
        hvd = _init_ours(rank, size, port)
        out = {"allreduce": _timed(lambda: hvd.allreduce(x, op=hvd.Sum, name="cpu"), iters,
                                   lambda: None)}

        def ping():
            if rank == 0:
                hvd.send(x, 1)
                hvd.recv(1)
            elif rank == 1:
                hvd.recv(0)
                hvd.send(x, 0)
        out["p2p_hop"] = [t / 2 for t in _timed(ping, iters, lambda: None)]
        hvd.shutdown()
        return out
    dist = _init_torch("gloo", rank, size, port)
    out = {"allreduce": _timed(lambda: dist.all_reduce(x), iters, lambda: None)}
    dist.destroy_process_group()
    return out


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


def rank_p2p(system, rank, size, port, nbytes, iters):
    """Ping-pong of a CUDA tensor between ranks 0 and 1 (sharing the GPU), each message
    received onto the GPU: the round trips' times. "ours" sends by the core's own route (CUDA
    IPC, or staged with HVD_GPU_PATH=staged); "gloo" is what a torch.distributed user writes
    for CUDA tensors on gloo, whose send/recv take CPU tensors: .cpu(), send, recv, .cuda()."""
    import torch
    torch.cuda.set_device(0)
    x = torch.full((nbytes // 4,), float(rank + 1), device="cuda")
    peer = 1 - rank
    if system == "ours":
        hvd = _init_ours(rank, size, port)

        def hop(t, first):
            if first:
                hvd.send(t, peer)
                return hvd.recv(peer, device="cuda")
            got = hvd.recv(peer, device="cuda")
            hvd.send(got, peer)
            return got
    else:
        dist = _init_torch("gloo", rank, size, port)
        host = torch.empty(nbytes // 4)

        def hop(t, first):
            if first:
                dist.send(t.cpu(), peer)
                dist.recv(host, peer)
                return host.cuda()
            dist.recv(host, peer)
            got = host.cuda()
            dist.send(got.cpu(), peer)
            return got

    times = _timed(lambda: hop(x, rank == 0), iters, torch.cuda.synchronize)
    if system == "ours":
        hvd.shutdown()
    else:
        dist.destroy_process_group()
    return {"times": times, "path": system}


def rank_pipeline(system, rank, size, port, hidden, batch, micro, schedule, steps):
    """An MLP of 8 blocks (Linear(hidden, hidden) + Tanh) on the GPU: "ours" splits it over
    the ranks with engine_native.torch.pipelining (``schedule`` "gpipe" or "1f1b", ``micro``
    micro-batches of the batch); "alone" is one rank running one stage's half of it, forward
    and backward over the same micro-batches, with nothing to hand off: the floor of a stage.
    Step times, each waited for on the device. HVD_BENCH_DEVICE=cpu runs it on the CPU (a
    check of the body where there is no GPU)."""
    import torch
    device = os.environ.get("HVD_BENCH_DEVICE", "cuda")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.set_device(0)
    torch.manual_seed(0)
    blocks = []
    for _ in range(8):
        blocks += [torch.nn.Linear(hidden, hidden), torch.nn.Tanh()]
    stages = 2 if system == "alone" else size
    per = len(blocks) // stages
    part = torch.nn.Sequential(*blocks[rank * per:(rank + 1) * per]).to(device)
    opt = torch.optim.SGD(part.parameters(), lr=1e-3)
    x, y = torch.randn(batch, hidden, device=device), torch.randn(batch, hidden, device=device)
    loss_fn = torch.nn.functional.mse_loss
    if system == "ours":
        hvd = _init_ours(rank, size, port)
        from engine_native.torch import pipelining as pp
        cls = pp.ScheduleGPipe if schedule == "gpipe" else pp.Schedule1F1B
        sched = cls(pp.PipelineStage(part, rank, size, device=device), micro, loss_fn=loss_fn)

        def run_step():
            if rank == 0:
                sched.step(x)
            elif rank == size - 1:
                sched.step(target=y, losses=[])
            else:
                sched.step()
    else:
        def run_step():
            for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
                (loss_fn(part(xs), ys) / micro).backward()

    def step():
        opt.zero_grad()
        run_step()
        opt.step()

    for _ in range(3):
        step()
        sync()
    if system == "ours":
        hvd.barrier()
    times = _timed(step, steps, sync)
    if system == "ours":
        hvd.shutdown()
    return {"times": times}


SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
              "cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaLaunchHostFunc",
              "cudaStreamWaitEvent", "cudaEventRecord", "cudaMemcpyAsync")


def _api_counts(prof, per, baseline=None):
    """CUDA runtime calls of interest in a torch.profiler run, per ``per`` (steps or ops),
    less ``baseline`` (the profiler's own calls: an empty profiled region's counts)."""
    counts = {e.key: e.count for e in prof.key_averages() if e.key in SYNC_CALLS}
    base = baseline or {}
    return {k: round((counts.get(k, 0) - base.get(k, 0)) / per, 2) for k in SYNC_CALLS}


def rank_profile(system, rank, size, port, steps, batch):
    """torch.profiler over the CNN step (``system`` "ours" or "alone", 2 ranks sharing the
    GPU) and, for ours, over 200 allreduces of a 1 MiB CUDA tensor: the CUDA runtime calls
    that synchronise or allocate, per step and per op (issue #39: 0 device-wide syncs per
    op), and the step's top operators by device time."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.set_device(0)
    model = _cnn().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator(device="cuda").manual_seed(rank)
    x = torch.randn(batch, 3, 32, 32, device="cuda", generator=gen)
    y = torch.randint(0, 10, (batch,), device="cuda", generator=gen)
    hvd = None
    if system == "ours":
        hvd = _init_ours(rank, size, port)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as empty:
        pass
    baseline = _api_counts(empty, 1)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    out = {"per_step": _api_counts(prof, steps, baseline), "profiler_own": baseline,
           "table": prof.key_averages().table(sort_by="cuda_time_total", row_limit=20)}
    if hvd:
        t = torch.ones(1 << 18, device="cuda")
        hvd.allreduce(t, name="warm")
        with profile(activities=activities) as ops:
            for i in range(200):
                hvd.allreduce(t, name=f"op.{i % 4}")
        out["per_op"] = _api_counts(ops, 200, baseline)
        out["path"] = __import__("engine_native").metrics()["gpu_paths"][0]["path"]
        hvd.shutdown()
    return out


def rank_step(system, rank, size, port, steps, batch):
    import torch
    torch.cuda.set_device(0)
    model = _cnn().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator(device="cuda").manual_seed(rank)
    x = torch.randn(batch, 3, 32, 32, device="cuda", generator=gen)
    y = torch.randint(0, 10, (batch,), device="cuda", generator=gen)
    loss_fn = torch.nn.functional.cross_entropy
    params = sum(p.numel() for p in model.parameters())
    hvd = dist = None
    if system == "ours":
        hvd = _init_ours(rank, size, port)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        net = model
    elif system == "ddp":
        dist = _init_torch("gloo", rank, size, port)
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    else:
        net = model

    def step():
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()

    for _ in range(5):
        step()
    times = _timed(step, steps, torch.cuda.synchronize)
    if hvd:
        hvd.shutdown()
    if dist:
        dist.destroy_process_group()
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
