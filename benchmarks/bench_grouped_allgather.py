"""Case grouped: a grouped allgather of many float32 tensors (issue #20, part 4).

Groups: 64 tensors of 4 KiB, 64 of 64 KiB, 8 of 1 MiB per rank (--smoke: 8 of 4 KiB). Time per
group, slowest rank per group, median over groups. Systems:
  ours            engine_native.torch.grouped_allgather (the core fuses the group into one
                  allgather: Note [Fused allgather] in runtime/cpu_executor.cc), default threshold
  ours unfused    the same calls with HVD_FUSION_THRESHOLD=0 (every tensor its own allgather:
                  the code before the fusion)
  Horovod         horovod.torch.grouped_allgather (0.28.1, MPI controller; it fuses too)
  MPICH           one Allgather per tensor, in a loop (mpi4py)
  gloo            one all_gather_into_tensor per tensor (torch.distributed)
Every group uses the same names, as a training loop does. Each rank fills its tensors with its
rank, so the check is that part k of every output holds k.
"""

from __future__ import annotations

import functools

import benchlib
import numpy as np
from benchlib import KIB, MIB, Table, fmt_ratio, fmt_time, median

GROUPS = [(64, 4 * KIB), (64, 64 * KIB), (8, 1 * MIB)]
SMOKE_GROUPS = [(8, 4 * KIB)]


# ---------------------------------------------------------------------------------------------
# Rank side

def _grouped_allgather(adapter, bufs, name):
    """The system's call for a group: one grouped op where it has one, else one per tensor."""
    if adapter.name in ("horovod", "ours-torch"):
        return adapter.hvd.grouped_allgather(bufs, name=name)
    if adapter.name == "ours":
        return adapter.hvd.grouped_allgather(bufs, name=name)
    return [adapter.allgather(b, f"{name}.{i}") for i, b in enumerate(bufs)]


def _correct(adapter, outs, count, elems) -> bool:
    if len(outs) != count:
        return False
    expected = np.repeat(np.arange(adapter.size, dtype=np.float32), elems)
    return all(np.array_equal(np.asarray(adapter.values(o)).reshape(-1), expected) for o in outs)


def rank_run(adapter, spec: dict, init_end: float) -> dict:
    out = {"times": {}, "metrics": {}, "ok": {}}
    for count, nbytes in spec["groups"]:
        key = f"{count}x{nbytes}"
        bufs = [adapter.array(nbytes, float(adapter.rank)) for _ in range(count)]
        name = f"grp.{key}"
        out["ok"][key] = _correct(adapter, _grouped_allgather(adapter, bufs, name), count,
                                  nbytes // 4)
        call = functools.partial(_grouped_allgather, adapter, bufs, name)
        iters = benchlib.warmed_iterations(adapter, spec, call, 2, spec["iters"], f"agree.{key}")
        if iters == 0:
            out["stopped"] = f"deadline reached before {key}"
            return out
        before = adapter.metrics()
        out["times"][key] = benchlib.timed_calls(adapter, call, iters)
        after = adapter.metrics()
        if before:
            out["metrics"][key] = {k: (after[k] - before[k]) / iters
                                   for k in ("fused_batches", "fused_tensors")}
        benchlib.save_partial(spec, adapter.rank, out)
    return out


# ---------------------------------------------------------------------------------------------
# Launcher side

RUNS = [  # (label, system, env)
    ("ours grouped_allgather (fused)", "ours-torch", {}),
    ("ours HVD_FUSION_THRESHOLD=0 (before)", "ours-torch", {"HVD_FUSION_THRESHOLD": "0"}),
    ("Horovod grouped_allgather", "horovod-mpi", {}),
    ("MPICH Allgather per tensor", "mpi", {}),
    ("gloo all_gather_into_tensor per tensor", "gloo", {}),
]


def run(ctx) -> list:
    groups = SMOKE_GROUPS if ctx.smoke else GROUPS
    allowed = set(ctx.systems("ours-torch", "horovod-mpi", "mpi", "gloo"))
    tables = []
    for np_ranks in ctx.nps:
        runs = benchlib.alternate([r for r in RUNS if r[1] in allowed], ctx.nps.index(np_ranks))
        for label, system, env in runs:
            spec = {"groups": groups, "iters": 5 if ctx.quick else 40,
                    "warmup": 1 if ctx.quick else 3, "budget_s": 0.5 if ctx.quick else 3.0}
            results = ctx.run(system, np_ranks, "grouped", spec, env=env,
                              label=f"grouped/{label}/np{np_ranks}")
            for count, nbytes in groups:
                key = f"{count}x{nbytes}"
                if not results or not all(key in r["times"] for r in results):
                    continue
                if not all(r["ok"][key] for r in results):
                    ctx.notes.append(f"grouped/{label}/{key} np={np_ranks}: WRONG RESULT")
                t = median(benchlib.per_iteration_max([r["times"][key] for r in results]))
                ctx.figures[("grouped", label, key, np_ranks)] = {
                    "time": t, "metrics": results[0]["metrics"].get(key, {})}
        tables.append(_table(ctx, np_ranks, groups))
    return tables


def _size(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def _table(ctx, np_ranks: int, groups) -> Table:
    t = Table(f"grouped allgather, float32, np={np_ranks}",
              ["group (per rank)", "system", "time per group", "per tensor",
               "time ÷ ours fused", "ours: fused ops / tensors per group"])
    for count, nbytes in groups:
        key = f"{count}x{nbytes}"
        ours = ctx.figures.get(("grouped", RUNS[0][0], key, np_ranks))
        for label, _, _ in RUNS:
            f = ctx.figures.get(("grouped", label, key, np_ranks))
            if f is None:
                continue
            m = f["metrics"]
            fused = f"{m['fused_batches']:.1f} / {m['fused_tensors']:.0f}" if m else ""
            ratio = f["time"] / ours["time"] if ours else None
            t.add(f"{count} x {_size(nbytes)}", label, fmt_time(f["time"]),
                  fmt_time(f["time"] / count), "-" if f is ours else fmt_ratio(ratio), fused)
    return t
