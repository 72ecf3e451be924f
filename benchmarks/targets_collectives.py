"""Issue #20's targets (allgather, broadcast, alltoall, reducescatter; the embedding step),
checked against this run's figures and printed (never asserted).

Ratios are peer time / ours (> 1: ours is faster), per op, np and size:
  - 1 MiB, 16 MiB, 64 MiB: >= 1.5x MPICH and >= 1.5x gloo;
  - 4 B and 4 KiB: within 3x MPICH (ratio >= 0.33);
  - the embedding training step at np=2: at least as fast as the better Horovod launch.
Broadcast is the issue's "in-place where MPICH has it": MPICH and gloo broadcast in place, so ours
is taken at the better of its out-of-place ``broadcast`` and in-place ``broadcast_``, named in
the row. A cell is "-" where this run did not measure it.
"""

from __future__ import annotations

from benchlib import MIB, Table, fmt_bytes, fmt_ratio, fmt_time

OPS = ("allgather", "broadcast", "alltoall", "reducescatter")
LARGE = (MIB, 16 * MIB, 64 * MIB)
SMALL = (4, 4096)


def _ours(ctx, op: str, np_ranks: int, nbytes: int, figures=None):
    """(label, figure) of our best variant of ``op`` (in ``figures``, default the run's), or
    None."""
    figures = ctx.figures if figures is None else figures
    variants = [op, op + "_"] if op == "broadcast" else [op]
    found = [(v, figures.get(("collectives", "ours", v, np_ranks, nbytes)))
             for v in variants]
    found = [(v, f) for v, f in found if f]
    return min(found, key=lambda x: x[1]["time"]) if found else None


def _peer(ctx, system: str, op: str, np_ranks: int, nbytes: int):
    return ctx.figures.get(("collectives", system, op, np_ranks, nbytes))


def _runs_vs_mpi(ctx, op: str, np_ranks: int, nbytes: int) -> str:
    """Each run's own MPICH / ours ratio with run_all --repeat, else "-"."""
    runs = getattr(ctx, "runs", [])
    if len(runs) < 2:
        return "-"
    ratios = []
    for figures in runs:
        ours = _ours(ctx, op, np_ranks, nbytes, figures)
        mpi = figures.get(("collectives", "mpi", op, np_ranks, nbytes))
        ratios.append(f"{mpi['time'] / ours[1]['time']:.2f}" if ours and mpi else "-")
    return " / ".join(ratios)


def _collective_rows(ctx, t: Table) -> None:
    for op in OPS:
        for np_ranks in ctx.nps:
            for nbytes in SMALL + LARGE:
                ours = _ours(ctx, op, np_ranks, nbytes)
                mpi = _peer(ctx, "mpi", op, np_ranks, nbytes)
                gloo = _peer(ctx, "gloo", op, np_ranks, nbytes)
                if not ours and not mpi:
                    continue
                small = nbytes in SMALL
                vs_mpi = mpi["time"] / ours[1]["time"] if ours and mpi else None
                vs_gloo = gloo["time"] / ours[1]["time"] if ours and gloo and not small else None
                if small:
                    want, ok = "MPICH >= 0.33x", vs_mpi is not None and vs_mpi >= 1 / 3
                    measured = vs_mpi is not None
                else:
                    want = "MPICH and gloo >= 1.5x"
                    measured = vs_mpi is not None and vs_gloo is not None
                    ok = measured and vs_mpi >= 1.5 and vs_gloo >= 1.5
                t.add(op, np_ranks, fmt_bytes(nbytes),
                      f"{fmt_time(ours[1]['time'])} ({ours[0]})" if ours else "-",
                      fmt_time(mpi["time"]) if mpi else "-",
                      fmt_time(gloo["time"]) if gloo and not small else "-",
                      fmt_ratio(vs_mpi), fmt_ratio(vs_gloo),
                      _runs_vs_mpi(ctx, op, np_ranks, nbytes), want,
                      ("PASS" if ok else "MISS") if measured else "not measured")


def _embedding_row(ctx, t: Table) -> None:
    ours = ctx.figures.get(("embedding", "ours-torch", 2))
    horovod = [(s, ctx.figures.get(("embedding", s, 2))) for s in ("horovod-mpi", "horovod-gloo")]
    horovod = [(s, f) for s, f in horovod if f]
    if not ours and not horovod:
        return
    best = min(horovod, key=lambda x: x[1]["time"]) if horovod else None
    ratio = best[1]["time"] / ours["time"] if ours and best else None
    t.add("embedding step", 2, "sparse embedding",
          fmt_time(ours["time"]) if ours else "-",
          f"{fmt_time(best[1]['time'])} ({best[0]})" if best else "-", "-",
          fmt_ratio(ratio), "-", "-", "best Horovod >= 1x",
          ("PASS" if ratio >= 1 else "MISS") if ratio is not None else "not measured")


def table(ctx) -> Table | None:
    """The table, or None when this run measured neither case."""
    t = Table("issue #20's targets: the other collectives (peer time / ours; > 1: ours faster)",
              ["op", "np", "size per rank", "ours", "MPICH (or Horovod)", "gloo",
               "vs MPICH", "vs gloo", "runs vs MPICH", "wanted", "verdict"])
    _collective_rows(ctx, t)
    _embedding_row(ctx, t)
    if not t.rows:
        return None
    misses = sum(r[-1] == "MISS" for r in t.rows)
    passes = sum(r[-1] == "PASS" for r in t.rows)
    t.notes.append(f"{passes} PASS, {misses} MISS of {len(t.rows)} rows")
    runs = len(getattr(ctx, "runs", []))
    if runs > 1:
        t.notes.append(f"each figure is the median of {runs} runs (run_all --repeat {runs}); "
                       f"'runs vs MPICH' is each run's own ratio")
    return t
