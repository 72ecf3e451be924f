"""Cases 1 and 2: float32 sum allreduce, 4 B ... 256 MiB, at each np, shm and forced TCP.

Per size every rank times each iteration; an iteration's time is the slowest rank's, and the
figure is the median over iterations. algbw = bytes / time, busbw = algbw * 2(n-1)/n
(nccl-tests' convention, GB = 1e9 B). Each size is first run once and checked against the
expected sum, then ``warmup`` more times, then a barrier, then ``iters`` timed iterations; the
iteration count depends on the size only, so every rank runs the same number.

Systems: ours (numpy API out-of-place, and the core's in-place path), MPICH out-of-place and
in-place, gloo, Horovod under mpiexec (ops=mpi) and under horovodrun --gloo. Forced TCP: ours
with HVD_TRANSPORT=tcp and a host name per rank, MPICH with MPIR_CVAR_NOLOCAL=1 and
UCX_TLS=tcp,self / FI_PROVIDER=tcp (its network module, held to TCP over loopback; without the
last two UCX moves the data through shared memory), and gloo (always TCP; launched again in this case so that it
runs interleaved with the other TCP systems).
"""

from __future__ import annotations

import functools

import benchlib
from benchlib import KIB, MIB, Table, fmt_bw, fmt_bytes, fmt_ratio, fmt_time, median

SIZES = [4, 64, KIB, 16 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB]
QUICK_SIZES = [4, 4 * KIB, MIB, 16 * MIB]
LABELS = {("ours", "out-of-place"): "ours", ("ours", "in-place"): "ours in-place",
          ("ours-tcp", "out-of-place"): "ours tcp", ("ours-tcp", "in-place"): "ours tcp in-place",
          ("mpi", "out-of-place"): "MPICH", ("mpi", "in-place"): "MPICH in-place",
          ("mpi-tcp", "out-of-place"): "MPICH tcp", ("mpi-tcp", "in-place"):
          "MPICH tcp in-place", ("gloo", "in-place"): "gloo",
          ("horovod-mpi", "in-place"): "Horovod mpi", ("horovod-gloo", "in-place"): "Horovod gloo"}


# ---------------------------------------------------------------------------------------------
# Rank side

def rank_run(adapter, spec: dict, init_end: float) -> dict:
    n = adapter.size
    expected = n * (n + 1) / 2
    out = {"times": {}, "metrics": {}, "ok": {}}
    for variant in spec.get("variants") or adapter.allreduce_variants:
        if variant not in adapter.allreduce_variants:
            continue
        for nbytes in spec["sizes"]:
            most = benchlib.iterations(nbytes, spec["target_bytes"], spec["min_iters"],
                                       spec["max_iters"])
            name = f"ar.{variant}.{nbytes}"
            buf = adapter.array(nbytes, adapter.rank + 1.0)
            values = adapter.values(adapter.allreduce(buf, name, variant))
            ok = bool(values[0] == expected and values[-1] == expected)
            call = functools.partial(adapter.allreduce, buf, name, variant)
            iters = benchlib.warmed_iterations(adapter, spec, call, spec["min_iters"], most,
                                               f"agree.{name}")
            if iters == 0:
                out["stopped"] = f"deadline reached before {variant} {nbytes} B"
                return out
            before = adapter.metrics()
            times = benchlib.timed_calls(adapter, call, iters)
            key = f"{variant}|{nbytes}"
            out["times"][key], out["ok"][key] = times, ok
            out["metrics"][key] = _metrics_delta(before, adapter.metrics(), iters)
            benchlib.save_partial(spec, adapter.rank, out)
            del buf, values
    return out


def _metrics_delta(before: dict, after: dict, iters: int) -> dict:
    if not before:
        return {}
    delta = {k: (after[k] - before[k]) / iters for k in
             ("negotiate_seconds", "communicate_seconds", "wait_seconds")}
    delta["transports"] = after.get("transports")
    return delta


# ---------------------------------------------------------------------------------------------
# Launcher side

def spec(system: str, np_ranks: int, quick: bool, smoke: bool = False) -> dict:
    slow = system.startswith(("gloo", "horovod"))
    if smoke:
        return {"sizes": [4, 4 * KIB, 256 * KIB], "target_bytes": 4 * MIB, "min_iters": 2,
                "max_iters": 10, "warmup": 1, "budget_s": 0.2}
    if quick:
        return {"sizes": QUICK_SIZES, "target_bytes": 64 * MIB, "min_iters": 2,
                "max_iters": 20 if slow else 50, "warmup": 1, "budget_s": 0.3}
    target = 512 * MIB if np_ranks <= 2 else 256 * MIB
    return {"sizes": SIZES, "target_bytes": target, "min_iters": 3,
            "max_iters": 100 if slow else 300, "warmup": 2 if np_ranks <= 2 else 1,
            "budget_s": 1.0 if np_ranks <= 2 else 1.5}


def collect(ctx, case: str, system: str, np_ranks: int, results: list) -> None:
    """Fold every rank's timings into ctx.figures[(case, system, variant, np, size)]."""
    if not results:
        return
    for r in results:
        if r.get("stopped") or r.get("partial"):
            ctx.notes.append(f"{case}/{system} np={np_ranks}: sweep cut short "
                             f"({r.get('stopped') or 'launch timed out'}); rows missing")
            break
    common = set.intersection(*[set(r["times"]) for r in results])
    for key in sorted(common, key=lambda k: (k.split("|")[0], int(k.split("|")[1]))):
        variant, nbytes = key.split("|")
        nbytes = int(nbytes)
        t = median(benchlib.per_iteration_max([r["times"][key] for r in results]))
        algbw = nbytes / t / 1e9
        ours_metrics = dict(results[0]["metrics"].get(key) or {})
        if ours_metrics:
            ours_metrics["mean_op"] = sum(results[0]["times"][key]) / len(results[0]["times"][key])
        ctx.figures[(case, system, variant, np_ranks, nbytes)] = {
            "time": t, "algbw": algbw,
            "busbw": algbw * benchlib.busbw_factor("allreduce", np_ranks),
            "ok": all(r["ok"][key] for r in results), "metrics": ours_metrics}
        if not all(r["ok"][key] for r in results):
            ctx.notes.append(f"{case}/{system}/{variant} np={np_ranks} {fmt_bytes(nbytes)}: "
                             "WRONG RESULT in the check iteration")


def run(ctx, tcp: bool = False) -> list:
    case = "allreduce-tcp" if tcp else "allreduce"
    systems = (ctx.systems("ours-tcp", "mpi-tcp", "gloo") if tcp else
               ctx.systems("ours", "mpi", "gloo", "horovod-mpi", "horovod-gloo"))
    tables = []
    for np_ranks in ctx.nps:
        order = benchlib.alternate(systems, ctx.nps.index(np_ranks))
        for system in order:
            results = ctx.run(system, np_ranks, "allreduce",
                              spec(system, np_ranks, ctx.quick, ctx.smoke),
                              label=f"{case}/{system}/np{np_ranks}")
            collect(ctx, case, system, np_ranks, results)
        tables += _tables(ctx, case, systems, np_ranks)
    return tables


def _columns(ctx, case: str, systems: list, np_ranks: int) -> list:
    cols = []
    for system in systems:
        for variant in ("out-of-place", "in-place"):
            if any(k[:4] == (case, system, variant, np_ranks) for k in ctx.figures):
                cols.append((system, variant))
    return cols


def _tables(ctx, case: str, systems: list, np_ranks: int) -> list:
    cols = _columns(ctx, case, systems, np_ranks)
    if not cols:
        return []
    ours_cols = [c for c in cols if c[0].startswith("ours")]
    peer_cols = [c for c in cols if not c[0].startswith("ours")]
    where = "forced TCP" if case.endswith("tcp") else "shm / same host"
    lat = Table(f"allreduce float32 sum, np={np_ranks}, {where}: median time per op",
                ["size"] + [LABELS.get(c, "/".join(c)) for c in cols]
                + ["ours / best peer (time)"])
    bw = Table(f"allreduce float32 sum, np={np_ranks}, {where}: busbw GB/s",
               ["size"] + [LABELS.get(c, "/".join(c)) for c in cols] + ["best ours / best peer"])
    sizes = sorted({k[4] for k in ctx.figures if k[0] == case and k[3] == np_ranks})
    for nbytes in sizes:
        figs = [ctx.figures.get((case, s, v, np_ranks, nbytes)) for s, v in cols]
        best_ours = _best([f for c, f in zip(cols, figs) if c in ours_cols])
        best_peer = _best([f for c, f in zip(cols, figs) if c in peer_cols])
        ratio = best_peer["time"] / best_ours["time"] if best_ours and best_peer else None
        lat.add(fmt_bytes(nbytes), *[fmt_time(f["time"]) if f else "-" for f in figs],
                fmt_ratio(ratio) + " faster" if ratio and ratio >= 1 else
                (fmt_ratio(1 / ratio) + " slower" if ratio else "-"))
        bw.add(fmt_bytes(nbytes), *[fmt_bw(f["busbw"]) if f else "-" for f in figs],
               fmt_ratio(ratio))
    split = _split_table(ctx, case, np_ranks, sizes)
    return [lat, bw] + ([split] if split else [])


def _best(figs: list):
    figs = [f for f in figs if f]
    return min(figs, key=lambda f: f["time"]) if figs else None


def _split_table(ctx, case: str, np_ranks: int, sizes: list):
    system = "ours-tcp" if case.endswith("tcp") else "ours"
    rows = []
    for nbytes in sizes:
        for variant in ("out-of-place", "in-place"):
            f = ctx.figures.get((case, system, variant, np_ranks, nbytes))
            if f and f["metrics"]:
                m = f["metrics"]
                rows.append((fmt_bytes(nbytes), variant, fmt_time(f["time"]),
                             fmt_time(m["mean_op"]), fmt_time(m["negotiate_seconds"]),
                             fmt_time(m["communicate_seconds"]), fmt_time(m["wait_seconds"])))
    if not rows:
        return None
    t = Table(f"where our time goes, allreduce np={np_ranks} "
              f"({'tcp' if case.endswith('tcp') else 'shm'}), rank 0's metrics() per op",
              ["size", "variant", "median op", "mean op (rank 0)", "negotiate", "communicate",
               "loop idle-wait"])
    for r in rows:
        t.add(*r)
    t.notes.append("negotiate / communicate / loop idle-wait are metrics() deltas over the "
                   "timed loop divided by the iterations, so compare them with the mean, not "
                   "the median; metrics() truncates each event to whole microseconds. "
                   "'communicate' is the executor (copies into/out of the output or fusion "
                   "buffer, the algorithm); 'loop idle-wait' is the background thread blocked "
                   "in poll() waiting for work or for a peer's control message")
    return t
