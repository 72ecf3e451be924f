"""The issue's targets, checked against this run's figures and printed (never asserted).

"ours" is the better of our two allreduce paths (the numpy API, out-of-place, and the core's
in-place path that engine_native.torch uses), named in the row; a peer with two variants or two
launch modes (MPICH out-of-place/in-place, Horovod over MPI/gloo) is taken at its best unless
the target names the variant, so each ratio is the conservative one.
"""

from __future__ import annotations

from benchlib import MIB, Table, fmt_bw, fmt_ratio, fmt_time

OURS = ("ours", "out-of-place"), ("ours", "in-place")
MPICH = ("mpi", "out-of-place"), ("mpi", "in-place")
HOROVOD = ("horovod-mpi", "in-place"), ("horovod-gloo", "in-place")
GLOO = (("gloo", "in-place"),)
NAMES = {"ours": "ours", "mpi": "MPICH", "horovod-mpi": "Horovod mpi",
         "horovod-gloo": "Horovod gloo", "gloo": "gloo", "ours-tcp": "ours tcp"}


def _pick(ctx, case, candidates, np_ranks, nbytes, key="time"):
    """The best (min time / max busbw) of ``candidates``; returns (label, figure) or None."""
    found = []
    for system, variant in candidates:
        f = ctx.figures.get((case, system, variant, np_ranks, nbytes))
        if f:
            found.append((f"{NAMES[system]} {variant}", f))
    if not found:
        return None
    if key == "time":
        return min(found, key=lambda x: x[1]["time"])
    return max(found, key=lambda x: x[1]["busbw"])


def _row(t: Table, what: str, ours, peer, ratio_fn, want: str, ok_fn, unit: str) -> None:
    if not ours or not peer:
        t.add(what, _cell(ours, unit), _cell(peer, unit), "-", want, "not measured")
        return
    ratio = ratio_fn(ours[1], peer[1])
    t.add(what, _cell(ours, unit), _cell(peer, unit), fmt_ratio(ratio), want,
          "PASS" if ok_fn(ratio, ours[1]) else "MISS")


def _cell(x, unit: str) -> str:
    if not x:
        return "-"
    label, f = x
    value = fmt_time(f["time"]) if unit == "time" else fmt_bw(f["busbw"]) + " GB/s"
    return f"{value} ({label})"


def table(ctx) -> Table:
    t = Table("targets from the issue (ratios > 1 mean ours is better)",
              ["target", "ours", "peer", "ratio", "wanted", "verdict"])
    speed = lambda o, p: p["time"] / o["time"]
    band = lambda o, p: o["busbw"] / p["busbw"]
    ar = "allreduce"
    ours4 = _pick(ctx, ar, OURS, 2, 4)
    if ours4:
        t.add("4 B allreduce np=2 latency", _cell(ours4, "time"), "-", "-", "<= 30 us",
              "PASS" if ours4[1]["time"] <= 30e-6 else "MISS")
    _row(t, "4 B np=2 vs Horovod (default cycle time)", ours4, _pick(ctx, ar, HOROVOD, 2, 4),
         speed, ">= 50x", lambda r, o: r >= 50, "time")
    _row(t, "4 B np=2 vs MPICH", ours4, _pick(ctx, ar, MPICH, 2, 4), speed,
         ">= 0.1x (within 10x)", lambda r, o: r >= 0.1, "time")
    _row(t, "1 MiB busbw np=2 vs MPICH", _pick(ctx, ar, OURS, 2, MIB, "bw"),
         _pick(ctx, ar, MPICH, 2, MIB, "bw"), band, ">= 1x", lambda r, o: r >= 1, "bw")
    ours64 = _pick(ctx, ar, OURS, 2, 64 * MIB, "bw")
    _row(t, "64 MiB busbw np=2 shm vs MPICH in-place", ours64,
         _pick(ctx, ar, (("mpi", "in-place"),), 2, 64 * MIB, "bw"), band, ">= 1.5x",
         lambda r, o: r >= 1.5, "bw")
    _row(t, "64 MiB busbw np=2 shm vs Horovod", ours64, _pick(ctx, ar, HOROVOD, 2, 64 * MIB, "bw"),
         band, ">= 1.5x", lambda r, o: r >= 1.5, "bw")
    _row(t, "64 MiB busbw np=4 vs best of MPICH, gloo, Horovod",
         _pick(ctx, ar, OURS, 4, 64 * MIB, "bw"),
         _pick(ctx, ar, MPICH + GLOO + HOROVOD, 4, 64 * MIB, "bw"), band, ">= 1.5x",
         lambda r, o: r >= 1.5, "bw")
    _fusion_rows(ctx, t)
    _row(t, "forced-TCP 64 MiB busbw np=2 vs gloo",
         _pick(ctx, "allreduce-tcp", (("ours-tcp", "out-of-place"), ("ours-tcp", "in-place")),
               2, 64 * MIB, "bw"),
         _pick(ctx, "allreduce-tcp", GLOO, 2, 64 * MIB, "bw"), band, ">= 1.5x",
         lambda r, o: r >= 1.5, "bw")
    _idle_rows(ctx, t)
    return t


def _fusion_rows(ctx, t: Table) -> None:
    fused = ctx.figures.get(("fusion", "ours fused (default threshold)", "async", 2))
    unfused = ctx.figures.get(("fusion", "ours HVD_FUSION_THRESHOLD=0", "async", 2))
    horovod = [(k[1], f) for k, f in ctx.figures.items()
               if k[0] == "fusion" and k[3] == 2 and k[1].startswith("Horovod")]
    best_h = min(horovod, key=lambda x: x[1]["time"]) if horovod else None
    ours = ("ours fused", fused) if fused else None
    _row(t, "200 x 4 KiB np=2 vs Horovod fused", ours, best_h,
         lambda o, p: p["time"] / o["time"], ">= 2.5x", lambda r, o: r >= 2.5, "time")
    _row(t, "200 x 4 KiB np=2 fused vs HVD_FUSION_THRESHOLD=0", ours,
         ("ours threshold 0", unfused) if unfused else None,
         lambda o, p: p["time"] / o["time"], ">= 3x", lambda r, o: r >= 3, "time")


def _idle_rows(ctx, t: Table) -> None:
    for np_ranks in ctx.nps:
        f = ctx.figures.get(("idle", "ours", np_ranks))
        if f:
            t.add(f"idle CPU of an initialised rank, np={np_ranks}",
                  f"{f['idle_max']:.2f} % (max rank)", "-", "-", "< 1 %",
                  "PASS" if f["idle_max"] < 1 else "MISS")
    f = ctx.figures.get(("idle", "ours", 4))
    if f:
        t.add("first op done after init(), np=4", fmt_time(f["first_after_init"]), "-", "-",
              "<= 0.5 s", "PASS" if f["first_after_init"] <= 0.5 else "MISS")
