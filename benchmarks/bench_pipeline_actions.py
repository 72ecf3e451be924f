"""Where a pipeline step's time goes, per action kind (issue #36): ours only, the hand-off-bound
case of bench_pipeline.py (np=2: an MLP of 8 blocks, Linear(64, 64) + Tanh, 4 per stage, batch
64 in 16 micro-batches).

    python benchmarks/bench_pipeline_actions.py [--schedule gpipe|1f1b] [--steps 100]

Prints per rank: the median step, the mean time of each action kind (F, B, RECV_*, SEND_*;
a receive includes its wait for the neighbour) with its median and 90th percentile, the isend
calls alone, the loop thread's wake-ups and the caller-driven ops per step (``metrics()``),
the CPUs the rank's actions ran on (``sched_getcpu``: two ranks on one CPU is the slow mode of
Note [CPU binding]) and its binding, the CPU time per step of the rank's main thread and of
its other threads together (``/proc/self/task``: spinning counts, sleeping does not), and
beside it the same stage's forwards and backwards in one process with nothing else running
(the compute floor). ``HVD_CPU_BIND=core`` in the environment binds the ranks.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import statistics
import subprocess
import sys
import threading
import time

import bench_pipeline

HIDDEN, BATCH, MICRO = 64, 64, 16


def _thread_cpu() -> dict:
    """CPU seconds so far of each of this process's threads, by thread id."""
    import os
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return out


def rank_main(schedule: str, steps: int) -> None:
    import torch
    torch.set_num_threads(1)
    import engine_native
    import engine_native.torch as hvd
    from engine_native.torch import pipelining as pp
    from engine_native.torch.pipelining import step_run
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    part = bench_pipeline.mlp_stage(torch, HIDDEN, rank, size, None)
    cls = pp.ScheduleGPipe if schedule == "gpipe" else pp.Schedule1F1B
    sched = cls(pp.PipelineStage(part, rank, size), MICRO,
                loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD(part.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)

    def step():
        opt.zero_grad()
        sched.step(x) if rank == 0 else sched.step(target=y, losses=[])
        opt.step()

    for _ in range(5):
        hvd.barrier()
        step()
    spent, count = collections.Counter(), collections.Counter()
    samples = collections.defaultdict(list)
    cpus = collections.Counter()
    sched_getcpu = ctypes.CDLL(None).sched_getcpu

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                kind = name if name else args[1].kind
                spent[kind] += time.perf_counter() - t0
                count[kind] += 1
                samples[kind].append(time.perf_counter() - t0)
                cpus[sched_getcpu()] += 1
        return wrapper

    step_run.StepRun._do = timed(None, step_run.StepRun._do)
    step_run.raw_isend = timed("isend call", step_run.raw_isend)
    before = engine_native.metrics()
    cpu_before = _thread_cpu()
    times = []
    for _ in range(steps):
        hvd.barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    cpu_after = _thread_cpu()
    after = engine_native.metrics()
    main_tid = threading.get_native_id()
    cpu = {tid: (t - cpu_before.get(tid, 0.0)) / steps * 1e3 for tid, t in cpu_after.items()}
    main_cpu = cpu.pop(main_tid, 0.0)
    per_step = {k: (after[k] - before[k]) / steps for k in ("loop_wakeups", "caller_driven_ops")}
    def pct(kind, q):
        ordered = sorted(samples[kind])
        return ordered[int(q * (len(ordered) - 1))] * 1e6

    actions = ", ".join(f"{k} {spent[k] / count[k] * 1e6:.0f} us ({pct(k, .5):.0f} / "
                        f"{pct(k, .9):.0f})" for k in sorted(spent))
    ran_on = " ".join(f"{cpu}:{n * 100 // sum(cpus.values())}%" for cpu, n in sorted(cpus.items()))
    bound = engine_native.metrics()["cpu_binding"] or "none"
    print(f"| {rank} | {statistics.median(times) * 1e3:.2f} ms | {actions} | "
          f"{per_step['loop_wakeups']:.1f} | {per_step['caller_driven_ops']:.1f} | {ran_on} | "
          f"{bound} | {main_cpu:.2f} / {sum(cpu.values()):.2f} ms |", flush=True)
    hvd.shutdown()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        rank_main(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
    ap.add_argument("--steps", type=int, default=100)
    a = ap.parse_args()
    print(f"{a.schedule}, hidden {HIDDEN}, batch {BATCH}, {MICRO} micro-batches, np=2\n")
    print("| rank | step (median) | per action: mean (median / p90) | loop wake-ups / step | "
          "driven ops / step | CPUs its actions ran on | bound to | CPU / step: main thread / "
          "the others |")
    print("|---|---|---|---|---|---|---|---|")
    out = subprocess.run(["hvdrun", "-np", "2", sys.executable, __file__, "--rank-main",
                          a.schedule, str(a.steps)], capture_output=True, text=True,
                         timeout=600)
    rows = sorted(line.split(":", 1)[-1] for line in out.stdout.splitlines() if "| " in line)
    print("\n".join(rows) if rows else out.stdout + out.stderr)
    alone = bench_pipeline.stages_alone(HIDDEN, MICRO, 2, a.schedule, timed=False, repeats=200)
    print("\nCompute floor (one process, the stage's forwards and backwards of a step, in the "
          "schedule's order): " +
          ", ".join(f"stage {r} {t * 1e3:.2f} ms" for r, t in enumerate(alone)))


if __name__ == "__main__":
    main()
