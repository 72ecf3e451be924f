"""Cases 5 and 6: idle CPU of an initialised rank, and how soon after init() the first op is done.

Each rank: ``init()`` (timed by rank_entry), then one 4-byte allreduce, timed from the moment
``init()`` returned ("first op done after init"), then a barrier, then it sleeps ``idle_s``
seconds while its own CPU time is read before and after: utime+stime from /proc/self/stat
(clock ticks) and the sum of /proc/self/task/*/schedstat (nanoseconds, every thread). Idle CPU
is that time over the window, in % of one core; a rank whose background thread polls shows
up here.
"""

from __future__ import annotations

import os
import time

import benchlib
from benchlib import Table, fmt_time

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds() -> tuple:
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = (int(fields[11]) + int(fields[12])) / TICK
    ns = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return ticks, ns / 1e9


# ---------------------------------------------------------------------------------------------
# Rank side

def rank_run(adapter, spec: dict, init_end: float) -> dict:
    buf = adapter.array(4, 1.0)
    adapter.allreduce(buf, "first", adapter.allreduce_variants[0])
    first_after_init = time.perf_counter() - init_end
    t0 = time.perf_counter()
    adapter.allreduce(buf, "second", adapter.allreduce_variants[0])
    second = time.perf_counter() - t0
    adapter.barrier()
    ticks0, sched0 = _cpu_seconds()
    wall0 = time.perf_counter()
    time.sleep(spec["idle_s"])
    wall = time.perf_counter() - wall0
    ticks1, sched1 = _cpu_seconds()
    threads = len(os.listdir("/proc/self/task"))
    adapter.barrier()
    return {"first_after_init": first_after_init, "second_op": second,
            "idle_pct_stat": 100 * (ticks1 - ticks0) / wall,
            "idle_pct_sched": 100 * (sched1 - sched0) / wall, "threads": threads}


# ---------------------------------------------------------------------------------------------
# Launcher side

LABELS = {"ours": "ours", "ours-tcp": "ours tcp", "mpi": "MPICH", "gloo": "gloo",
          "horovod-mpi": "Horovod mpi", "horovod-gloo": "Horovod gloo"}


def run(ctx) -> list:
    systems = ctx.systems("ours", "mpi", "gloo", "horovod-mpi", "horovod-gloo")
    if "ours" in systems:
        systems.insert(1, "ours-tcp")
    tables = []
    for np_ranks in ctx.nps:
        for system in benchlib.alternate(systems, ctx.nps.index(np_ranks)):
            spec = {"idle_s": 0.3 if ctx.smoke else (1.0 if ctx.quick else 3.0)}
            results = ctx.run(system, np_ranks, "idle", spec)
            if not results:
                continue
            ctx.figures[("idle", system, np_ranks)] = {
                "init_s": max(r["init_s"] for r in results),
                "first_after_init": max(r["first_after_init"] for r in results),
                "second_op": max(r["second_op"] for r in results),
                "idle_max": max(r["idle_pct_sched"] for r in results),
                "idle_mean": sum(r["idle_pct_sched"] for r in results) / len(results),
                "idle_stat": max(r["idle_pct_stat"] for r in results),
                "threads": results[0]["threads"]}
        tables.append(_table(ctx, systems, np_ranks))
    return tables


def _table(ctx, systems: list, np_ranks: int) -> Table:
    t = Table(f"start-up and idle, np={np_ranks} (max over ranks)",
              ["system", "init()", "first 4 B op done after init() returned", "next 4 B op",
               "idle CPU, % of a core (schedstat; max / mean of ranks)",
               "idle CPU (/proc stat ticks)", "threads"])
    for system in systems:
        f = ctx.figures.get(("idle", system, np_ranks))
        if f:
            t.add(LABELS[system], fmt_time(f["init_s"]), fmt_time(f["first_after_init"]),
                  fmt_time(f["second_op"]), f"{f['idle_max']:.2f} / {f['idle_mean']:.2f}",
                  f"{f['idle_stat']:.1f}", f["threads"])
    t.notes.append("init() includes waiting for the other ranks to start (they are launched "
                   "at once, but importing torch takes ~2 s for the torch-based peers)")
    return t
