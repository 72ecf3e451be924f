"""Case 4: allgather, broadcast, alltoall and reducescatter of float32 at 4 B, 4 KiB, 1 MiB,
16 MiB and 64 MiB per rank (4 B to 16 MiB with --quick).

allgather: every rank contributes S bytes and receives n*S; algbw = n*S / time, busbw =
algbw * (n-1)/n. broadcast: root 0 sends S bytes; algbw = busbw = S / time. alltoall: every
rank sends S bytes, S/n to each rank; reducescatter: every rank's S-byte input is summed and
rank r keeps the r-th S/n; both algbw = S / time, busbw = algbw * (n-1)/n (nccl-tests'
conventions). S is rounded up to a multiple of 4n bytes for these two (4 B: one element per
rank). Time per op = the slowest rank's, median over iterations. Ours uses the numpy
API (every op returns a new array); MPI uses Allgather, Alltoall and Reduce_scatter_block into
a fresh receive buffer and Bcast in place; gloo all_gather_into_tensor, all_to_all_single and
reduce_scatter_tensor into fresh tensors and broadcast in place; Horovod allgather, alltoall,
reducescatter and broadcast_. Ours also runs ``broadcast_`` (the numpy API's in-place form, the
path of engine_native.torch.broadcast_ and broadcast_parameters): its row compares it with the
peers' broadcast, which is in place for all of them.
"""

from __future__ import annotations

import time

import benchlib
from benchlib import MIB, Table, fmt_bw, fmt_bytes, fmt_ratio, fmt_time, median

SIZES = [4, 4096, MIB, 16 * MIB, 64 * MIB]  # latency (4 B, 4 KiB) and bandwidth
SMALL_BYTES = 4096
OPS = ("allgather", "broadcast", "alltoall", "reducescatter")
IN_PLACE_OPS = ("broadcast_",)  # only systems whose adapter has one; peers' rows: "broadcast"
# MPICH's broadcast with every rank's answer to the root (mpi_peer.broadcast_answered), for
# bench_one_round.py's row of what Horovod's guarantee costs (spec "answered"); no table here
# shows it.
ANSWERED_OPS = ("broadcast_answered",)
LABELS = {"ours": "ours", "mpi": "MPICH", "gloo": "gloo", "horovod-mpi": "Horovod mpi",
          "horovod-gloo": "Horovod gloo"}


# ---------------------------------------------------------------------------------------------
# Rank side

def rank_run(adapter, spec: dict, init_end: float) -> dict:
    n = adapter.size
    out = {"times": {}, "ok": {}}
    ops = tuple(spec["ops"]) if "ops" in spec else (
        OPS + tuple(o for o in IN_PLACE_OPS + (ANSWERED_OPS if spec.get("answered") else ())
                    if hasattr(adapter, o)))
    for op in ops:
        for nbytes in spec["sizes"]:
            # Latency sizes take many more iterations: one op is microseconds, and a median
            # of 10 at that scale is mostly scheduler noise.
            hi = spec["max_iters"] if nbytes > SMALL_BYTES else 20 * spec["max_iters"]
            most = benchlib.iterations(nbytes, spec["target_bytes"], 3, hi)
            buf = adapter.array(_split_bytes(op, nbytes, n), adapter.rank + 1.0)
            name = f"{op}.{nbytes}"
            if op == "allgather":
                values = adapter.values(adapter.allgather(buf, name))
                ok = (values.size == adapter.values(buf).size * n
                      and float(values[0]) == 1.0 and float(values[-1]) == float(n))
            elif op == "alltoall":  # block j comes from rank j
                values = adapter.values(adapter.alltoall(buf, name))
                ok = (values.size == adapter.values(buf).size
                      and float(values[0]) == 1.0 and float(values[-1]) == float(n))
            elif op == "reducescatter":
                values = adapter.values(adapter.reducescatter(buf, name))
                ok = (values.size == adapter.values(buf).size // n
                      and float(values[0]) == float(values[-1]) == n * (n + 1) / 2)
            else:
                values = adapter.values(_call(adapter, op, buf, name))
                ok = float(values[0]) == 1.0 and float(values[-1]) == 1.0
            del values
            t0 = time.perf_counter()
            _call(adapter, op, buf, name)
            iters = benchlib.agreed_iterations(adapter, spec, time.perf_counter() - t0,
                                               spec["budget_s"], 3, most, f"agree.{name}")
            if iters == 0:
                out["stopped"] = f"deadline reached before {op} {nbytes} B"
                return out
            adapter.barrier()
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                _call(adapter, op, buf, name)
                times.append(time.perf_counter() - t0)
            out["times"][f"{op}|{nbytes}"] = times
            out["ok"][f"{op}|{nbytes}"] = bool(ok)
            benchlib.save_partial(spec, adapter.rank, out)
            del buf
    return out


def _split_bytes(op: str, nbytes: int, n: int) -> int:
    """alltoall and reducescatter split the buffer into n float32 blocks: round up."""
    if op not in ("alltoall", "reducescatter"):
        return nbytes
    return (nbytes + 4 * n - 1) // (4 * n) * (4 * n)


def _call(adapter, op: str, buf, name: str):
    if op in ("broadcast", "broadcast_") + ANSWERED_OPS:
        return getattr(adapter, op)(buf, name, 0)
    return getattr(adapter, op)(buf, name)


# ---------------------------------------------------------------------------------------------
# Launcher side

def run(ctx) -> list:
    systems = ctx.systems("ours", "mpi", "gloo", "horovod-mpi", "horovod-gloo")
    tables = []
    for np_ranks in ctx.nps:
        order = benchlib.alternate(systems, ctx.nps.index(np_ranks))
        for system in order:
            collect(ctx, system, np_ranks,
                    ctx.run(system, np_ranks, "collectives", spec(ctx, system, np_ranks)))
        tables.append(_table(ctx, systems, np_ranks))
    return tables


def spec(ctx, system: str, np_ranks: int) -> dict:
    """The rank side's spec for ``system`` at ``np_ranks`` (sizes: SIZES, fewer with --quick,
    one with --smoke)."""
    slow = system.startswith(("gloo", "horovod"))
    sizes = [64 * 1024] if ctx.smoke else ([4, 4096, MIB, 16 * MIB] if ctx.quick else SIZES)
    return {"sizes": sizes,
            "target_bytes": (32 if ctx.quick else 256) * MIB // max(1, np_ranks // 2),
            "max_iters": 10 if ctx.quick else (30 if slow else 60),
            "budget_s": 0.5 if ctx.quick else 1.5}


def collect(ctx, system: str, np_ranks: int, results: list) -> None:
    """Fold every rank's timings into ctx.figures[("collectives", system, op, np, size)]."""
    if not results:
        return
    if any(r.get("stopped") or r.get("partial") for r in results):
        ctx.notes.append(f"collectives/{system} np={np_ranks}: cut short by the "
                         "launch deadline; rows missing")
    for key in set.intersection(*[set(r["times"]) for r in results]):
        op, nbytes = key.split("|")
        nbytes = int(nbytes)
        t = median(benchlib.per_iteration_max([r["times"][key] for r in results]))
        moved = nbytes * np_ranks if op == "allgather" else nbytes
        algbw = moved / t / 1e9
        ctx.figures[("collectives", system, op, np_ranks, nbytes)] = {
            "time": t, "busbw": algbw * benchlib.busbw_factor(op, np_ranks)}
        if not all(r["ok"][key] for r in results):
            ctx.notes.append(f"collectives/{system}/{op} np={np_ranks} "
                             f"{fmt_bytes(nbytes)}: WRONG RESULT")


def _table(ctx, systems: list, np_ranks: int) -> Table:
    t = Table(f"allgather, broadcast, alltoall, reducescatter, float32, np={np_ranks}: "
              "median time (busbw GB/s)",
              ["op", "size per rank"] + [LABELS[s] for s in systems]
              + ["ours / best peer (busbw)"])
    for op in OPS + IN_PLACE_OPS:
        for nbytes in sorted({k[4] for k in ctx.figures
                              if k[0] == "collectives" and k[2] == op and k[3] == np_ranks}):
            figs = [ctx.figures.get(("collectives", s, _peer_op(s, op), np_ranks, nbytes))
                    for s in systems]
            ours = figs[0] if systems and systems[0] == "ours" else None
            peers = [f for s, f in zip(systems, figs) if f and s != "ours"]
            best = max(peers, key=lambda f: f["busbw"]) if peers else None
            t.add(op + (" (in place; peers: broadcast)" if op in IN_PLACE_OPS else ""),
                  fmt_bytes(nbytes),
                  *[f"{fmt_time(f['time'])} ({fmt_bw(f['busbw'])})" if f else "-" for f in figs],
                  fmt_ratio(ours["busbw"] / best["busbw"]) if ours and best else "-")
    return t


def _peer_op(system: str, op: str) -> str:
    """A peer without an in-place variant of its own is measured in place by ``op``'s base."""
    return op.rstrip("_") if system != "ours" and op in IN_PLACE_OPS else op
