"""Issue #36's pipeline target on a GPU, for benchmarks/bench_gpu.py (``--cases pipeline``):
an MLP of 8 blocks (hidden 4096, batch 512, 8 micro-batches: 1 MiB activations) split over 2
ranks sharing the GPU under MPS (GPipe and 1F1B, ours), against one rank running one stage's
half alone over the same micro-batches; target: step ≤ (M+1)/M × the stage alone + 10 %. Also
both halves alone at once on two ranks (no hand-offs): what sharing the one GPU costs."""
import os
import statistics

from bench_gpu_mps import under_mps
from bench_gpu_ranks import _init_ours, _timed, run


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


def case_pipeline(args):
    hidden, batch, micro = 4096, 512, 8
    rows, verdicts = [], []
    with under_mps():
        alone = run(rank_pipeline, 1, "alone", hidden, batch, micro, "gpipe", args.steps)
        floor = statistics.median(alone[0]["times"])
        rows.append(("one stage alone (half the model, 8 micro-batches, no hand-offs)",
                     f"{floor * 1e3:.2f} ms"))
        # Both halves at once, one per rank, no hand-offs: what sharing the GPU alone costs,
        # the least any schedule of the two stages on this one GPU can take.
        both = run(rank_pipeline, 2, "alone", hidden, batch, micro, "gpipe", args.steps)
        pair = max(statistics.median(r["times"]) for r in both)
        rows.append(("both stages alone at once (one per rank, no hand-offs: the shared GPU's "
                     "floor)", f"{pair * 1e3:.2f} ms", f"{pair / floor:.2f}× one stage alone"))
        # Receives that wait for their copy (the default), then ones final in the stage's
        # stream order (HVD_PIPELINE_STREAM_RECV=1, Note [Device point-to-point] I).
        for schedule, stream_recv in (("gpipe", "0"), ("1f1b", "0"), ("gpipe", "1"),
                                      ("1f1b", "1")):
            ours = run(rank_pipeline, 2, "ours", hidden, batch, micro, schedule, args.steps,
                       env={"HVD_PIPELINE_STREAM_RECV": stream_recv})
            t = max(statistics.median(r["times"]) for r in ours)
            bound = (micro + 1) / micro * floor * 1.1
            how = "receives in stream order" if stream_recv == "1" else "blocking receives"
            rows.append((f"ours, {schedule}, 2 stages sharing the GPU, {how}",
                         f"{t * 1e3:.2f} ms",
                         f"{t / floor:.2f}× the stage alone (bound {bound * 1e3:.2f} ms)"))
            verdicts.append(("pipeline", t / bound, f"{schedule} step, {how} / ((M+1)/M × "
                             "stage alone + 10 %) (≤ 1)"))
    return ("pipeline step on one GPU, 2 stages under MPS (hidden 4096, batch 512, M=8)",
            rows, verdicts)
