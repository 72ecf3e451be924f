"""Pipeline training steps (issue #36): ours (``engine_native.torch.pipelining`` under
``hvdrun``) and ``torch.distributed.pipelining`` on gloo (under ``torchrun``), the same code
and the same cases, in the same run.

    python benchmarks/bench_pipeline.py [--steps 20] [--launches 3] [--only mlp|bubble]
                                        [--case "hidden 64"] [--schedule 1f1b] [--bind]

Table 1, "against the peer" (np=2, GPipe and 1F1B): an MLP of 8 blocks (Linear(h, h) + Tanh),
4 per stage, batch 64: hidden 1024 with 8 micro-batches (compute-bound), hidden 64 with 16
(bound by the hand-offs). Step time: the median of ``--steps`` steps after 3 warm-up steps,
the slowest rank's; the median over launches; ours / torch < 1: ours faster. Beside it, the
busiest stage's compute per step (its forwards and backwards, entry to exit, the loss left
out), for each system, and ours as a share of torch's step. Then that stage's whole work of a
step (forwards, the loss, backwards, in the order the schedule runs them on its rank) alone in
the launcher's process, with no neighbour computing and no hand-off, measured before each pair
of launches, and its share of torch's step: the least that ours / torch can be on this machine
at that time (the other rank computes beside it in a step: on the 2-vCPU test VMs a stage then
ran 1.05-1.65x slower than alone).

Table 2, "bubble": balanced synthetic stages whose forward sleeps 10 ms and backward 20 ms
(compute that needs no core, so 4 ranks fit on 2 cores), K=2 with M=8 and K=4 with M=16.
Idle fraction of a rank = 1 - (time in its stage's compute) / (step time), the worst rank's,
beside the theory (K-1)/(M+K-1); a stage's compute is each forward and backward from entry to
exit, measured inside the stage the same way for both systems (in brackets: counting the sleeps
alone, which leaves out the stage's own work after each wake-up); speedup = K M (f + b) / step
time (the same work on one rank), as a share of the ideal K M / (M + K - 1).

``--bind``: each rank of both systems on its own share of the CPUs, split the same way: ours
with ``hvdrun --bind-to core`` (Note [CPU binding] in the core), torch's ranks by
``sched_setaffinity`` to the same share (LOCAL_RANK's contiguous run of the sorted CPUs, or
where the ranks outnumber the CPUs the one CPU ours would take) before torch is imported, so
every thread they start inherits it. Without it both run unbound (ours with ``hvdrun
--bind-to none``, though its default, auto, would bind K=4 on 2 CPUs).

Each launch is one set of processes per system and case; launches alternate which system
goes first; a launch that fails or runs past ``--timeout`` is counted, not hidden.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MLP_CASES = [("hidden 1024, batch 64, 8 micro-batches", 2, 1024, 8),
             ("hidden 64, batch 64, 16 micro-batches", 2, 64, 16)]
BUBBLE_CASES = [("K=2, M=8", 2, 16, 8), ("K=4, M=16", 4, 16, 16)]
SCHEDULES = ("gpipe", "1f1b")
FORWARD_S, BACKWARD_S = 0.010, 0.020
BATCH = 64


def _sleep_stage(torch, busy: list):
    """A stage whose forward sleeps FORWARD_S and backward BACKWARD_S around its (tiny) real
    work, ``x * w`` and its gradients. ``busy[0]`` adds the time from entry to exit of each
    (the stage's compute, as the product's own measured bubble counts a forward or backward);
    ``busy[1]`` the sleeps alone. After a sleep this VM runs the next few torch calls ~5x
    slower (cold caches): 0.14-0.2 ms per forward or backward that the sleeps alone miss."""

    class Sleep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            t0 = time.perf_counter()
            time.sleep(FORWARD_S)
            t1 = time.perf_counter()
            ctx.save_for_backward(x, w)
            y = x * w
            busy[1] += t1 - t0
            busy[0] += time.perf_counter() - t0
            return y

        @staticmethod
        def backward(ctx, grad):
            t0 = time.perf_counter()
            time.sleep(BACKWARD_S)
            t1 = time.perf_counter()
            x, w = ctx.saved_tensors
            grad_x, grad_w = grad * w, (grad * x).sum().reshape(1)
            busy[1] += t1 - t0
            busy[0] += time.perf_counter() - t0
            return grad_x, grad_w

    class Stage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))  # so stage 0 runs a backward too

        def forward(self, x):
            return Sleep.apply(x, self.w)

    return Stage()


def _timed_stage(torch, part, busy: list):
    """``part`` wrapped so each forward and backward adds its time, entry to exit, to
    ``busy[0]`` (what the stage computes, as beside the other rank's compute: the same for both
    systems). A backward runs from the exit's mark to the entry's; the entry takes a parameter
    that requires grad so stage 0's backward reaches it too (its gradient stays None)."""
    started = [0.0]

    class Exit(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            return y.view_as(y)

        @staticmethod
        def backward(ctx, grad):
            started[0] = time.perf_counter()
            return grad

    class Enter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, anchor):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            busy[0] += time.perf_counter() - started[0]
            return grad, None

    class Timed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.part = part
            self.anchor = torch.nn.Parameter(torch.zeros(()))

        def forward(self, x):
            t0 = time.perf_counter()
            y = Exit.apply(self.part(Enter.apply(x, self.anchor)))
            busy[0] += time.perf_counter() - t0
            return y

    return Timed()


def mlp_stage(torch, hidden: int, rank: int, size: int, busy: list | None):
    """Stage ``rank`` of ``size`` of the 8-block MLP; timed (``_timed_stage``) into ``busy``
    unless it is None."""
    torch.manual_seed(0)
    blocks = []
    for _ in range(8):
        blocks += [torch.nn.Linear(hidden, hidden), torch.nn.Tanh()]
    per = len(blocks) // size
    part = torch.nn.Sequential(*blocks[rank * per:(rank + 1) * per])
    return part if busy is None else _timed_stage(torch, part, busy)


def stages_alone(hidden: int, micro: int, size: int, schedule: str, timed: bool = True,
                 repeats: int = 40) -> list:
    """Each stage's work of one step run alone in this process (median seconds): every
    micro-batch's forward, the last stage's loss, every backward, in the order ``schedule``
    runs them on that stage's rank (1F1B's alternation of forwards and backwards alone costs a
    stage ~10 % more than all forwards, then all backwards, here), through the module the
    ranks run (``timed``: with bench_pipeline's timing wrapper), with no neighbour computing
    beside it and no hand-off. The busiest is what a step of either system would take if the
    hand-offs were free and the other stages ran elsewhere: its share of torch's step is the
    least ours / torch could be on this machine now."""
    import torch

    from engine_native.pipeline import build
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    x, y = torch.randn(BATCH, hidden), torch.randn(BATCH, hidden)
    chunks = list(zip(torch.tensor_split(x, micro), torch.tensor_split(y, micro)))
    table = build(schedule, size, micro, 1)
    per_stage = []
    for rank in range(size):
        part = mlp_stage(torch, hidden, rank, size, [0.0, 0.0] if timed else None)
        last = rank == size - 1
        order = [(a.kind, a.microbatch) for a in table.programs[rank] if a.kind in ("F", "B")]
        times = []
        for _ in range(repeats + 5):
            t0 = time.perf_counter()
            outs = {}
            for kind, mb in order:
                if kind == "F":
                    xm, ym = chunks[mb]
                    out = part(xm.detach().requires_grad_(rank > 0))
                    outs[mb] = ((torch.nn.functional.mse_loss(out, ym) / micro, None) if last
                                else (out, torch.ones_like(out)))
                else:
                    out, grad = outs.pop(mb)
                    out.backward(grad)
            times.append(time.perf_counter() - t0)
        per_stage.append(statistics.median(times[5:]))
    torch.set_num_threads(threads)
    return per_stage


def cpu_share(local_rank: int, local_size: int) -> list:
    """The CPUs of ``local_rank``'s share: contiguous runs of the sorted CPUs, the first
    ``len % local_size`` runs one longer (Note [CPU binding] A's split); where the ranks
    outnumber the CPUs, one CPU, ranks in contiguous runs over them, the first CPUs one rank
    more (C's)."""
    cpus = sorted(os.sched_getaffinity(0))
    if local_size > len(cpus):
        per, crowded = divmod(local_size, len(cpus))
        head = crowded * (per + 1)
        slot = local_rank // (per + 1) if local_rank < head else \
            crowded + (local_rank - head) // per
        return [cpus[slot]]
    base, extra = divmod(len(cpus), local_size)
    start = local_rank * base + min(local_rank, extra)
    return cpus[start:start + base + (1 if local_rank < extra else 0)]


def rank_main(system: str, kind: str, hidden: int, micro: int, schedule: str, steps: int,
              out_dir: str, bind: bool = False) -> None:
    if bind and system == "torch":  # (ours: hvdrun --bind-to core binds at hvd.init())
        local_size = int(os.environ["LOCAL_WORLD_SIZE"])
        os.sched_setaffinity(0, cpu_share(int(os.environ["LOCAL_RANK"]), local_size))
    import torch
    torch.set_num_threads(1)
    if system == "ours":
        import engine_native.torch as hvd
        from engine_native.torch import pipelining as pp
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        make_stage = lambda mod: pp.PipelineStage(mod, rank, size)
        barrier = hvd.barrier
    else:
        import torch.distributed as dist
        from torch.distributed import pipelining as pp
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        make_stage = lambda mod: pp.PipelineStage(mod, rank, size, torch.device("cpu"))
        barrier = dist.barrier
    busy = [0.0, 0.0]
    if kind == "mlp":
        part = mlp_stage(torch, hidden, rank, size, busy)
    else:
        part = _sleep_stage(torch, busy)
    cls = pp.ScheduleGPipe if schedule == "gpipe" else pp.Schedule1F1B
    last = rank == size - 1
    # every rank passes loss_fn: torch's schedules run forward only on a rank without one
    sched = cls(make_stage(part), micro, loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD(part.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, hidden), torch.randn(BATCH, hidden)
    times, busies, sleeps = [], [], []
    for i in range(3 + steps):
        barrier()
        busy[:] = [0.0, 0.0]
        t0 = time.perf_counter()
        opt.zero_grad()
        if rank == 0:
            sched.step(x)
        elif last:
            sched.step(target=y, losses=[])
        else:
            sched.step()
        opt.step()
        if i >= 3:
            times.append(time.perf_counter() - t0)
            busies.append(busy[0])
            sleeps.append(busy[1])
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:  # (torchrun mixes stdouts)
        json.dump({"times": times, "busy": busies, "sleeps": sleeps,
                   "cpus": sorted(os.sched_getaffinity(0))}, f)


def launch(system: str, kind: str, case, schedule: str, steps: int, timeout: float,
           bind: bool = False):
    """(step time, worst rank's idle fraction, the same counting the sleeps alone as compute,
    the busiest rank's compute per step) of one launch, or None if it failed or hung."""
    _, np_, hidden, micro = case
    out_dir = tempfile.mkdtemp(prefix="bench_pipeline_")
    args = [os.path.abspath(__file__), "--rank-main", system, kind, str(hidden), str(micro),
            schedule, str(steps), out_dir, "bind" if bind else "free"]
    if system == "ours":
        cmd = ["hvdrun", "-np", str(np_), "--bind-to", "core" if bind else "none",
               sys.executable] + args
    else:
        cmd = ["torchrun", "--nproc-per-node", str(np_), "--master-port", "29517",
               "--log-dir", os.path.join(out_dir, "torchrun")] + args
    try:
        subprocess.run(cmd, check=False, capture_output=True, timeout=timeout,
                       start_new_session=True)
        per_rank = []
        for rank in range(np_):
            with open(os.path.join(out_dir, f"{rank}.json")) as f:
                per_rank.append(json.load(f))
    except (subprocess.TimeoutExpired, OSError):  # hung, or a rank wrote no result
        return None
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    if bind and len({tuple(r["cpus"]) for r in per_rank}) != np_:  # each rank its own share
        print(f"warning: --bind, but {system}'s ranks ran on CPUs "
              f"{[r['cpus'] for r in per_rank]}", file=sys.stderr)
    steps_slowest = [max(ts) for ts in zip(*(r["times"] for r in per_rank))]
    idle = [1 - statistics.median(r[busy]) / statistics.median(r["times"])
            for busy in ("busy", "sleeps") for r in per_rank]
    busiest = max(statistics.median(r["busy"]) for r in per_rank)
    return statistics.median(steps_slowest), max(idle[:np_]), max(idle[np_:]), busiest


def measure(kind: str, case, schedule: str, a):
    got = {"ours": [], "torch": []}
    failed = {"ours": 0, "torch": 0}
    alone = []  # the busiest stage alone, measured before each pair of launches (mlp)
    for i in range(a.launches):
        if kind == "mlp":
            alone.append(max(stages_alone(case[2], case[3], case[1], schedule)))
        for system in (("ours", "torch") if i % 2 == 0 else ("torch", "ours")):
            result = launch(system, kind, case, schedule, a.steps, a.timeout, a.bind)
            if result is None:
                failed[system] += 1
            else:
                got[system].append(result)
    med = {s: tuple(statistics.median(column) for column in zip(*v)) if v else None
           for s, v in got.items()}
    return med, failed, statistics.median(alone) if alone else None


def _ms(t):
    return f"{t * 1e3:.1f} ms" if t else "-"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        s, kind, h, m, sched, steps, out_dir, bind = sys.argv[2:10]
        rank_main(s, kind, int(h), int(m), sched, int(steps), out_dir, bind == "bind")
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--only", choices=("mlp", "bubble"))
    ap.add_argument("--case", default="", help="only the cases whose name contains this")
    ap.add_argument("--schedule", choices=SCHEDULES, help="only this schedule")
    ap.add_argument("--bind", action="store_true",
                    help="every rank of both systems on its own share of the CPUs")
    a = ap.parse_args()
    schedules = (a.schedule,) if a.schedule else SCHEDULES
    if a.only != "bubble":
        print("| case (np=2) | schedule | ours (step) | torch.distributed.pipelining, gloo | "
              "ours / torch | busiest stage's compute: ours / torch | its share of torch's "
              "step | that stage alone in one process, its share of torch's step | launches "
              "failed or hung: ours / torch |")
        print("|---|---|---|---|---|---|---|---|---|")
        for case in (c for c in MLP_CASES if a.case in c[0]):
            for schedule in schedules:
                med, failed, alone = measure("mlp", case, schedule, a)
                ours, peer = (med[s][0] if med[s] else None for s in ("ours", "torch"))
                compute = [med[s][3] if med[s] else None for s in ("ours", "torch")]
                ratio = f"{ours / peer:.2f}x" if ours and peer else "-"
                # no schedule's step is shorter than its busiest stage's compute: with it
                # beside torch's step, a ratio target is seen to be reachable or not
                floor = f"{compute[0] / peer:.2f}x" if compute[0] and peer else "-"
                alone_share = f"{alone / peer:.2f}x" if alone and peer else "-"
                print(f"| {case[0]} | {schedule} | {_ms(ours)} | {_ms(peer)} | {ratio} | "
                      f"{_ms(compute[0])} / {_ms(compute[1])} | {floor} | {_ms(alone)}, "
                      f"{alone_share} | {failed['ours']} / {failed['torch']} |", flush=True)
    if a.only != "mlp":
        print(f"\n| stages (f {FORWARD_S * 1e3:.0f} ms, b {BACKWARD_S * 1e3:.0f} ms) | "
              "schedule | theory idle | ours: idle (sleeps alone), step, speedup / ideal | "
              "torch: the same | failed: ours / torch |")
        print("|---|---|---|---|---|---|")
        for case in (c for c in BUBBLE_CASES if a.case in c[0]):
            k, m = case[1], case[3]
            theory = (k - 1) / (m + k - 1)
            ideal = k * m / (m + k - 1)
            for schedule in schedules:
                med, failed, _ = measure("bubble", case, schedule, a)
                cells = []
                for s in ("ours", "torch"):
                    if med[s] is None:
                        cells.append("-")
                        continue
                    step, idle, idle_sleeps = med[s]
                    speedup = k * m * (FORWARD_S + BACKWARD_S) / step
                    cells.append(f"{idle:.1%} ({idle_sleeps:.1%}), {_ms(step)}, "
                                 f"{speedup / ideal:.0%}")
                print(f"| {case[0]} | {schedule} | {theory:.1%} | {cells[0]} | {cells[1]} | "
                      f"{failed['ours']} / {failed['torch']} |", flush=True)


if __name__ == "__main__":
    main()
