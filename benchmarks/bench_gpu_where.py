"""Where a GPU op's time goes, for benchmarks/bench_gpu.py: ``--cases profile`` (torch.profiler
over a shared-GPU CNN step and over 200 CUDA allreduces: the CUDA runtime calls that
synchronise or allocate, per step and per op, and each rank's top operators; issue #39 items 3
and 5) and ``--cases cpu_latency`` (4 B on the CPU at np=2: what the machine's process wake-ups
cost, beside which the CUDA figures are read) and ``--cases p2p_where`` (where a CUDA
point-to-point hop's time goes: the time inside send() and recv() on each rank, and every CUDA
runtime call per round trip with its host time, under torch.profiler; issue #36's 1 MiB target)."""
import statistics

from bench_gpu_mps import under_mps
from bench_gpu_ranks import _init_ours, _init_torch, _timed, cnn_step, ours_round_trip, run


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
    step, _, end = cnn_step(system, rank, size, port, batch)
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
    if system == "ours":
        import engine_native
        import engine_native.torch as hvd
        t = torch.ones(1 << 18, device="cuda")
        hvd.allreduce(t, name="warm")
        with profile(activities=activities) as ops:
            for i in range(200):
                hvd.allreduce(t, name=f"op.{i % 4}")
        out["per_op"] = _api_counts(ops, 200, baseline)
        out["path"] = engine_native.metrics()["gpu_paths"][0]["path"]
    end()
    return out


def case_profile(args):
    rows, tables = [], []
    with under_mps():
        found = {system: run(rank_profile, 2, system, 10, 64) for system in ("alone", "ours")}
    for system, results in found.items():
        for rank, r in enumerate(results):
            rows.append((f"{system}, rank {rank}, per step", *(f"{k} {v:g}" for k, v in
                                                               r["per_step"].items() if v)))
            tables.append(f"{system}, rank {rank}:\n{r['table']}")
    rows.append(("the profiler's own calls (an empty profiled region, subtracted above)",
                 *(f"{k} {v:g}" for k, v in found["ours"][0]["profiler_own"].items() if v)))
    per_op = [r["per_op"] for r in found["ours"]]
    for rank, counts in enumerate(per_op):
        rows.append((f"ours ({found['ours'][0]['path']}), rank {rank}, per 1 MiB allreduce",
                     *(f"{k} {v:g}" for k, v in counts.items() if v)))
    args.appendix += ["", "## torch.profiler: top operators by device time", "", "```"] + \
        tables + ["```"]
    worst = max(c["cudaDeviceSynchronize"] for c in per_op)
    return ("CUDA runtime calls under torch.profiler, 2 ranks sharing the GPU under MPS "
            f"(counted: {', '.join(SYNC_CALLS)})", rows,
            ("device_syncs", worst, "cudaDeviceSynchronize per allreduce (0)"))


def rank_p2p_where(system, rank, size, port, nbytes, hops):
    """A ping-pong of ``nbytes`` CUDA tensors between ranks 0 and 1 (ours, CUDA IPC): the mean
    time inside each send() and recv() call, timed alone, then the same hops under
    torch.profiler: per round trip (two hops), each CUDA runtime call's count and host µs, and
    the device time of the copies."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.set_device(0)
    hvd = _init_ours(rank, size, port)
    peer = 1 - rank
    x = torch.full((max(nbytes // 4, 1),), float(rank + 1), device="cuda")
    spent = {"send": 0.0, "recv": 0.0}

    def timed(name, fn, *a, **k):
        t0 = time.perf_counter()
        out = fn(*a, **k)
        spent[name] += time.perf_counter() - t0
        return out

    def hop():
        return ours_round_trip(lambda *a: timed("send", hvd.send, *a),
                               lambda *a, **k: timed("recv", hvd.recv, *a, **k), x, rank == 0,
                               peer)

    round_trips = _timed(hop, hops, torch.cuda.synchronize)
    calls = {k: v / (hops + 1) * 1e6 for k, v in spent.items()}
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as prof:
        for _ in range(hops):
            hop()
        torch.cuda.synchronize()
    runtime, device = {}, {}
    for e in prof.key_averages():
        if not e.count:
            continue
        if e.key.startswith("cuda"):  # a runtime call: its host time
            runtime[e.key] = (e.count / hops, e.cpu_time_total / e.count)
        elif "Memcpy" in e.key or "Memset" in e.key:  # a copy on the device: its device time
            device[e.key] = (e.count / hops, e.device_time_total / e.count)
    hvd.shutdown()
    return {"hop_us": statistics.median(round_trips) / 2 * 1e6, "calls_us": calls,
            "runtime": runtime, "device": device}


def case_p2p_where(args):
    rows = []
    with under_mps():
        for nbytes in (4, 1 << 20):
            found = run(rank_p2p_where, 2, "ours", nbytes, 200)
            label = f"{nbytes} B" if nbytes < 1 << 20 else "1 MiB"
            for rank, r in enumerate(found):
                rows.append((f"{label}, rank {rank}: hop {r['hop_us']:.1f} µs",
                             *(f"in {k}() {v:.1f} µs" for k, v in r["calls_us"].items())))
                top = sorted(r["runtime"].items(), key=lambda kv: -kv[1][0] * kv[1][1])
                rows.append((f"{label}, rank {rank}: CUDA runtime per round trip "
                             "(count × host µs)",
                             *(f"{k} {n:g} × {us:.1f}" for k, (n, us) in top[:8])))
                rows.append((f"{label}, rank {rank}: copies on the device per round trip",
                             *(f"{k} {n:g} × {us:.1f} µs" for k, (n, us) in
                               r["device"].items())))
    return "where a CUDA point-to-point hop's time goes (2 ranks under MPS, torch.profiler)", \
        rows, []


def case_cpu_latency(args):
    ours = run(rank_cpu_latency, 2, "ours", args.iters)
    gloo = run(rank_cpu_latency, 2, "gloo", args.iters)

    def us(results, key):
        return max(statistics.median(r[key]) for r in results) * 1e6
    rows = [("ours, allreduce", f"{us(ours, 'allreduce'):.1f} µs"),
            ("ours, point-to-point hop (half a ping-pong)", f"{us(ours[:1], 'p2p_hop'):.1f} µs"),
            ("gloo, allreduce", f"{us(gloo, 'allreduce'):.1f} µs")]
    return "4 B on the CPU, np=2, median per call (this machine's wake-up costs)", rows, []
