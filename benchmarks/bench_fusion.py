"""Case 3: a training step's gradients: 200 float32 tensors of 4 KiB each, as one set.

Modes (time per set, slowest rank per set, median over sets):
  async  every tensor submitted without waiting, then all waited on. Ours and Horovod negotiate
         and fuse them (Horovod: ``allreduce_async_`` + ``synchronize``); ours is run twice,
         with the default fusion threshold and with HVD_FUSION_THRESHOLD=0 (no fusion), through
         the numpy API, and a third time through engine_native.torch with Horovod's own calls
         (ours_torch.py: ``allreduce_async_`` + ``synchronize``), torch layer included.
         MPI: ``Iallreduce`` x 200 + ``Waitall``; gloo: ``async_op=True`` x 200 + ``wait``.
  seq    200 blocking allreduces one after another (MPI: the one-by-one baseline).
  fused  MPI only: one 800 KiB allreduce over a pre-packed buffer (a floor without packing).
Every set uses the same 200 names, as a training loop does, so response caches can apply.
"""

from __future__ import annotations

import functools

import benchlib
from benchlib import KIB, Table, fmt_ratio, fmt_time, median

COUNT, NBYTES = 200, 4 * KIB


# ---------------------------------------------------------------------------------------------
# Rank side

def rank_run(adapter, spec: dict, init_end: float) -> dict:
    n = adapter.size
    count = spec.get("count", COUNT)
    names = [f"grad.{i}" for i in range(count)]
    out = {"times": {}, "metrics": {}, "ok": {}}
    for mode in spec.get("modes") or adapter.fusion_modes:
        if mode not in adapter.fusion_modes:
            continue
        bufs = [adapter.array(NBYTES, adapter.rank + 1.0) for _ in range(count)]
        adapter.allreduce_set(bufs, names, mode)
        # In-place peers now hold the sum; ours (out-of-place) keeps its inputs: check either.
        first = float(adapter.values(bufs[0])[0])
        out["ok"][mode] = first in (adapter.rank + 1.0, n * (n + 1) / 2)
        call = functools.partial(adapter.allreduce_set, bufs, names, mode)
        sets = benchlib.warmed_iterations(adapter, spec, call, 2, spec["sets"], f"agree.{mode}")
        if sets == 0:
            out["stopped"] = f"deadline reached before mode {mode}"
            return out
        before = adapter.metrics()
        out["times"][mode] = benchlib.timed_calls(adapter, call, sets)
        after = adapter.metrics()
        if before:
            out["metrics"][mode] = {k: (after[k] - before[k]) / sets for k in
                                    ("negotiate_seconds", "communicate_seconds", "wait_seconds",
                                     "fused_batches", "fused_tensors", "allreduce_ops")}
        benchlib.save_partial(spec, adapter.rank, out)
    return out


# ---------------------------------------------------------------------------------------------
# Launcher side

RUNS = [  # (label, system, env, modes)
    ("ours fused (default threshold)", "ours", {}, ["async"]),
    ("ours HVD_FUSION_THRESHOLD=0", "ours", {"HVD_FUSION_THRESHOLD": "0"}, ["async"]),
    ("ours torch allreduce_async_ (fused)", "ours-torch", {}, ["async"]),
    ("MPICH", "mpi", {}, ["seq", "async", "fused"]),
    ("gloo", "gloo", {}, ["async"]),
    ("Horovod mpi (fused)", "horovod-mpi", {}, ["async"]),
    ("Horovod gloo (fused)", "horovod-gloo", {}, ["async"]),
]


def _sets(system: str, quick: bool, np_ranks: int) -> int:
    if quick:
        return 2 if system.startswith("gloo") else 3
    return 60 if system.startswith(("ours", "mpi")) else 30


def run(ctx) -> list:
    tables = []
    allowed = set(ctx.systems("ours", "ours-torch", "mpi", "gloo", "horovod-mpi", "horovod-gloo"))
    for np_ranks in ctx.nps:
        runs = benchlib.alternate([r for r in RUNS if r[1] in allowed], ctx.nps.index(np_ranks))
        for label, system, env, modes in runs:
            spec = {"modes": modes, "sets": _sets(system, ctx.quick, np_ranks),
                    "warmup": 1 if ctx.quick or system == "gloo" else 3,
                    "budget_s": 0.5 if ctx.quick else 3.0}
            results = ctx.run(system, np_ranks, "fusion", spec, env=env,
                              label=f"fusion/{label}/np{np_ranks}")
            for mode in modes:
                if not results or not all(mode in r["times"] for r in results):
                    continue
                t = median(benchlib.per_iteration_max([r["times"][mode] for r in results]))
                ok = all(r["ok"][mode] for r in results)
                if not ok:
                    ctx.notes.append(f"fusion/{label}/{mode} np={np_ranks}: WRONG RESULT")
                ctx.figures[("fusion", label, mode, np_ranks)] = {
                    "time": t, "metrics": results[0]["metrics"].get(mode, {})}
        tables.append(_table(ctx, np_ranks))
    return tables


def _table(ctx, np_ranks: int) -> Table:
    t = Table(f"{COUNT} x 4 KiB float32 allreduce per set (a step's gradients), np={np_ranks}",
              ["system", "mode", "time per set", "per tensor", "time ÷ ours fused",
               "ours: negotiate / communicate / wait per set", "batches per set"])
    ours = ctx.figures.get(("fusion", "ours fused (default threshold)", "async", np_ranks))
    for key, f in ctx.figures.items():
        if key[0] != "fusion" or key[3] != np_ranks:
            continue
        label, mode = key[1], key[2]
        m = f["metrics"]
        split = (f"{fmt_time(m['negotiate_seconds'])} / {fmt_time(m['communicate_seconds'])}"
                 f" / {fmt_time(m['wait_seconds'])}") if m else ""
        batches = f"{m['fused_batches']:.1f} fused, {m['allreduce_ops']:.0f} ops" if m else ""
        ratio = f["time"] / ours["time"] if ours else None
        t.add(label, mode, fmt_time(f["time"]), fmt_time(f["time"] / COUNT),
              "-" if f is ours else fmt_ratio(ratio), split, batches)
    return t
