"""Case p2p: point-to-point send/recv between ranks 0 and 1 (issue #36's "p2p speed"), float32
messages of 4 B, 4 KiB, 1 MiB, 16 MiB and 64 MiB (4 B to 16 MiB with --quick), at np=2.

Ping-pong: rank 0 sends, rank 1 receives and sends back, rank 0 receives; one-way time = the
round trip / 2, bandwidth = size / one-way time. Ours, measured both ways: ``engine_native.send``
and ``engine_native.recv`` returning a new array (the message carries dtype and shape), and
``recv(..., out=buffer)`` into a buffer of the known size, reused (the peers' treatment); MPICH:
mpi4py ``Send`` / ``Recv`` into a buffer of the known size, reused; gloo: ``torch.distributed``
``send`` / ``recv`` into a tensor of the known size, reused. Targets (issue #36): 4 B one way <= 10 us
(shared memory), 1-64 MiB >= 1x MPICH and >= 1.5x gloo.
"""

from __future__ import annotations

import resource
import time

import benchlib
from benchlib import MIB, Table, fmt_bw, fmt_bytes, fmt_ratio, fmt_time, median

SIZES = [4, 4096, MIB, 16 * MIB, 64 * MIB]
LABELS = {"ours": "ours (new array)", "ours-out": "ours (out=)", "mpi": "MPICH", "gloo": "gloo"}
OURS = ("ours", "ours-out")


def rank_run(adapter, spec: dict, init_end: float) -> dict:
    out = {"times": {}, "ok": {}, "faults": {}}
    me = adapter.rank
    for nbytes in spec["sizes"]:
        buf = adapter.array(nbytes, 1.0 + me)
        back = adapter.array(nbytes, 0.0)
        got = _round_trip(adapter, buf, back, spec)
        ok = me > 1 or float(adapter.values(got)[-1]) == 1.0  # rank 0's values, echoed
        t0 = time.perf_counter()
        _round_trip(adapter, buf, back, spec)
        most = benchlib.iterations(nbytes, spec["target_bytes"], 5, spec["max_iters"])
        iters = benchlib.agreed_iterations(adapter, spec, time.perf_counter() - t0,
                                           spec["budget_s"], 5, most, f"agree.p2p.{nbytes}")
        if iters == 0:
            out["stopped"] = f"deadline reached before {nbytes} B"
            return out
        adapter.barrier()
        times = []
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(iters):
            t0 = time.perf_counter()
            _round_trip(adapter, buf, back, spec)
            times.append((time.perf_counter() - t0) / 2)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        out["times"][str(nbytes)] = times
        out["faults"][str(nbytes)] = faults / iters  # minor page faults per round trip
        out["ok"][str(nbytes)] = bool(ok)
        benchlib.save_partial(spec, me, out)
    return out


def _round_trip(adapter, buf, back, spec):
    """Rank 0: send, then receive the echo; rank 1: receive, send it back. Others idle."""
    # "into", not "out": the launcher sets spec["out"] to the results folder (benchlib), which
    # made every launch receive into a buffer until 2026-12-05
    recv = adapter.recv_into if spec.get("into") else adapter.recv
    if adapter.rank == 0:
        adapter.send(buf, 1, 3)
        return recv(back, 1, 4)
    if adapter.rank == 1:
        got = recv(back, 0, 3)
        adapter.send(got, 0, 4)
        return got
    return buf


def run(ctx) -> list:
    systems = ctx.systems("ours", "ours-out", "mpi", "gloo")
    for system in systems:
        spec = {"into": system == "ours-out", "sizes": [4, 4096, MIB, 16 * MIB] if ctx.quick else SIZES,
                **({"sizes": [4, 64 * 1024]} if ctx.smoke else {}),
                "target_bytes": (64 if ctx.quick else 2048) * MIB,
                "max_iters": 200 if ctx.quick else 2000,
                "budget_s": 0.5 if ctx.quick else 1.5}
        results = ctx.run(system.split("-")[0], 2, "p2p", spec, label=f"p2p/{system}/np2")
        if not results:
            continue
        if any(r.get("stopped") or r.get("partial") for r in results):
            ctx.notes.append(f"p2p/{system}: cut short by the launch deadline; rows missing")
        times = results[0]["times"]  # rank 0 timed whole round trips
        for key, values in times.items():
            t = median(values)
            ranked = sorted(values)
            ctx.figures[("p2p", system, int(key))] = {
                "time": t, "bw": int(key) / t / 1e9, "min": ranked[0],
                "p90": ranked[min(len(ranked) - 1, int(0.9 * len(ranked)))],
                "faults": sum(r.get("faults", {}).get(key, 0.0) for r in results)}
            if not all(r["ok"].get(key, True) for r in results):
                ctx.notes.append(f"p2p/{system} {fmt_bytes(int(key))}: WRONG RESULT")
    return [_table(ctx, systems), _spread_table(ctx, systems)]


def _table(ctx, systems: list) -> Table:
    pairs = [(o, peer) for peer in ("mpi", "gloo") for o in OURS]
    t = Table("send/recv ping-pong, ranks 0 and 1 of 2, float32: one-way time (GB/s)",
              ["size"] + [LABELS[s] for s in systems] +
              [f"{LABELS[o]} / {LABELS[peer]}" for o, peer in pairs])
    for nbytes in sorted({k[2] for k in ctx.figures if k[0] == "p2p"}):
        figs = [ctx.figures.get(("p2p", s, nbytes)) for s in systems]
        ratios = []
        for o, peer in pairs:
            ours = ctx.figures.get(("p2p", o, nbytes))
            f = ctx.figures.get(("p2p", peer, nbytes))
            ratios.append(fmt_ratio(ours["bw"] / f["bw"]) if ours and f else "-")
        t.add(fmt_bytes(nbytes),
              *[f"{fmt_time(f['time'])} ({fmt_bw(f['bw'])})" if f else "-" for f in figs],
              *ratios)
    t.notes.append("ours / peer: bandwidth ratio (> 1: ours faster)")
    return t


def _spread_table(ctx, systems: list) -> Table:
    """Where the time goes: the spread of one-way times (a median far above the minimum is
    waiting, not copying) and the minor page faults per round trip, both ranks together (a
    fresh output's pages)."""
    t = Table("send/recv ping-pong: one-way min / median / p90, page faults per round trip",
              ["size"] + [LABELS[s] for s in systems])
    for nbytes in sorted({k[2] for k in ctx.figures if k[0] == "p2p"}):
        cells = []
        for s in systems:
            f = ctx.figures.get(("p2p", s, nbytes))
            cells.append(f"{fmt_time(f['min'])} / {fmt_time(f['time'])} / {fmt_time(f['p90'])}"
                         f", {f['faults']:.0f} flt" if f else "-")
        t.add(fmt_bytes(nbytes), *cells)
    return t
