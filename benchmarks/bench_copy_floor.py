"""Issue #38's large-op target: every collective at 1, 16 and 64 MiB per rank, float32, shm (one
host), np 2 and 4, ours against MPICH, gloo and the copy floor.

    python benchmarks/run_all.py --cases floor --systems ours,mpi,gloo --repeat 2
    python benchmarks/bench_copy_floor.py --repeat 2          # the same command

Wanted, per op, np and size: ours at least as fast as MPICH and as gloo (peer time / ours >= 1),
and ours within 1.25x of the copy floor. The case measures this machine's copy rate (machine.py,
the memcpy case, unless it already ran in this pass), then launches bench_allreduce's and
bench_other_collectives' rank_run at these sizes only; ``table`` is also built at the end of any
run_all run that measured memcpy and the 1-64 MiB sizes of the allreduce or collectives case.

The copy floor
--------------
R = the memcpy case's copy rate: numpy copyto of 256 MiB (64 with --quick, 16 with --smoke)
into a warm buffer, one thread, median of the repetitions, measured in the launcher before the
ranks start, in the same run. One copy of B bytes reads B and writes B in B / R seconds, so a
rank that must read ``r`` bytes (its own input or a peer's, mapped over shared memory) and
write ``w`` bytes (its output) needs at least (r + w) / 2 copy-equivalent bytes:
floor = (r + w) / (2 R). The op's floor is its
busiest rank's. With S bytes per rank (as the benchmarks count it) and n ranks:

- allgather (out of place): the output is n*S, every byte written, this rank's own block too
  (a fresh array): r = n*S, w = n*S -> n*S.
- broadcast_ (ours, in place): a non-root reads the root's S and writes S into its own buffer;
  the root moves nothing: -> S.
- broadcast (ours, copying): every rank returns a new S-byte array, the root too: -> S. (MPICH
  and gloo broadcast in place; their floor is the same S, a non-root's.)
- alltoall: the output is S bytes, S/n from each rank, its own block too: r = w = S -> S.
- reducescatter: rank i's output is the sum of block i (S/n) of every rank's input: r = n*S/n
  = S, w = S/n -> S (n+1) / (2n); the adds are taken as free (a float32 stream sum is memory
  bound; the memcpy case's ``a += b`` row shows how close to free).
- allreduce (out of place or in place): every rank writes its S-byte output. An output element
  is either summed by its rank from all n inputs (n reads) or read once, summed, from where
  another rank put it (1 read, that rank's n counted once), so the n outputs of one element
  cost at least n + (n - 1) reads, (2n - 1) S / n per rank when shared evenly. Reduce-scatter
  then allgather over shared memory does exactly that: rank i sums slice i of every input
  (r = S) into its own output (w = S/n), then copies the other n - 1 summed slices out of the
  peers' outputs (r = w = (n-1) S/n): r = (2n-1) S/n, w = S -> (3n-1) S / (2n), 1.25 S at n=2,
  1.375 S at n=4. (Summing everything on every rank instead reads n*S: (n+1) S / 2, more.)

What the floor leaves out, so a ratio near 1 is as good as it gets: synchronisation between
ranks, page faults on fresh output arrays (the memcpy case's "fresh" row), and other ranks
competing for cores and memory: the floor has every rank copying at R at once, which np ranks
on fewer cores, or sharing one memory bus, may not manage. So the floor case also measures
R_np, each process's copy rate while np processes copy 64 MiB at once (forked from the
launcher, started together), and the table prints ours / (bytes / R_np) beside the verdict,
which stays on R as the issue defines it. R is the rate of a buffer larger than most caches; a
1 MiB op can run from cache and beat it (ratio < 1).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time

import bench_allreduce
import bench_other_collectives
import benchlib
import machine
from benchlib import KIB, MIB, Table, fmt_bytes, fmt_ratio, fmt_time

SIZES = (MIB, 16 * MIB, 64 * MIB)
SMOKE_SIZE = 256 * KIB  # --smoke: proves the case runs, at a size the smoke test affords
PEERS = ("mpi", "gloo")
PEER_RATIO, FLOOR_RATIO = 1.0, 1.25
# (row, case, our variant, floor op, {peer: the peer's variant it is compared with})
ROWS = (
    ("allreduce", "allreduce", "out-of-place", "allreduce",
     {"mpi": "out-of-place", "gloo": "in-place"}),
    ("allreduce in place", "allreduce", "in-place", "allreduce",
     {"mpi": "in-place", "gloo": "in-place"}),
    ("allgather", "collectives", "allgather", "allgather",
     {"mpi": "allgather", "gloo": "allgather"}),
    ("broadcast (copying)", "collectives", "broadcast", "broadcast",
     {"mpi": "broadcast", "gloo": "broadcast"}),
    ("broadcast_ (in place)", "collectives", "broadcast_", "broadcast_",
     {"mpi": "broadcast", "gloo": "broadcast"}),
    ("alltoall", "collectives", "alltoall", "alltoall",
     {"mpi": "alltoall", "gloo": "alltoall"}),
    ("reducescatter", "collectives", "reducescatter", "reducescatter",
     {"mpi": "reducescatter", "gloo": "reducescatter"}),
)


# ---------------------------------------------------------------------------------------------
# The floor (see the module docstring for each op's derivation)

def traffic(op: str, nbytes: int, n: int) -> tuple:
    """(bytes read, bytes written) by the busiest rank of ``op`` with ``nbytes`` per rank."""
    if n < 2:
        raise ValueError(f"traffic({op!r}): the floor needs 2 or more ranks, got {n}")
    if op == "allgather":
        return n * nbytes, n * nbytes
    if op in ("broadcast", "broadcast_", "alltoall"):
        return nbytes, nbytes
    if op == "reducescatter":
        return nbytes, nbytes / n
    if op == "allreduce":
        return (2 * n - 1) * nbytes / n, nbytes
    raise ValueError(f"traffic: no floor for {op!r}")


def floor_bytes(op: str, nbytes: int, n: int) -> float:
    """Copy-equivalent bytes: one copy of B bytes reads B and writes B."""
    read, written = traffic(op, nbytes, n)
    return (read + written) / 2


def floor_seconds(op: str, nbytes: int, n: int, copy_gbps: float) -> float:
    """The floor at ``copy_gbps`` (GB/s = 1e9 bytes per second, the memcpy figure's unit)."""
    return floor_bytes(op, nbytes, n) / (copy_gbps * 1e9)


# ---------------------------------------------------------------------------------------------
# Launcher side

def run(ctx) -> list:
    """Measure the copy rate (unless this pass did), then every system at each np and size."""
    tables = [] if ("memcpy", "copy") in ctx.figures else [machine.memcpy_table(ctx)]
    systems = ctx.systems("ours", *PEERS)
    sizes = [SMOKE_SIZE] if ctx.smoke else list(SIZES)
    for np_ranks in ctx.nps:
        rates = concurrent_copy_rates(np_ranks, (4 if ctx.smoke else 64) * MIB,
                                      3 if ctx.quick else 10)
        ctx.figures[("memcpy", "copy", np_ranks)] = benchlib.median(rates)
        for system in benchlib.alternate(systems, ctx.nps.index(np_ranks)):
            spec = bench_allreduce.spec(system, np_ranks, ctx.quick, ctx.smoke)
            results = ctx.run(system, np_ranks, "allreduce", dict(spec, sizes=sizes),
                              label=f"floor/allreduce/{system}/np{np_ranks}")
            bench_allreduce.collect(ctx, "allreduce", system, np_ranks, results)
            spec = bench_other_collectives.spec(ctx, system, np_ranks)
            results = ctx.run(system, np_ranks, "collectives", dict(spec, sizes=sizes),
                              label=f"floor/collectives/{system}/np{np_ranks}")
            bench_other_collectives.collect(ctx, system, np_ranks, results)
    return tables


def _copy_worker(size: int, reps: int, start, results) -> None:
    import numpy as np

    src = np.ones(size // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # warm: pages mapped, as the memcpy case's copy row
    start.wait(timeout=60)
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        results.put(size / (time.perf_counter() - t0) / 1e9)


def concurrent_copy_rates(n: int, size: int, reps: int) -> list:
    """GB/s of each copy while ``n`` forked processes copy ``size`` bytes ``reps`` times each,
    started together: R_np of the module docstring. Every process is joined (or killed) here."""
    mp = multiprocessing.get_context("fork")  # the launcher runs no threads of its own
    start, results = mp.Barrier(n), mp.Queue()
    procs = [mp.Process(target=_copy_worker, args=(size, reps, start, results), daemon=True)
             for _ in range(n)]
    for p in procs:
        p.start()
    try:
        return [results.get(timeout=120) for _ in range(n * reps)]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("PASS" if ok else "MISS")


def _row(ctx, t: Table, row: tuple, np_ranks: int, nbytes: int, rate: float):
    label, case, variant, floor_op, peers = row
    ours = ctx.figures.get((case, "ours", variant, np_ranks, nbytes))
    if not ours:
        return
    found = {p: ctx.figures.get((case, p, v, np_ranks, nbytes)) for p, v in peers.items()}
    vs = {p: f["time"] / ours["time"] if f else None for p, f in found.items()}
    floor = floor_seconds(floor_op, nbytes, np_ranks, rate)
    rate_np = ctx.figures.get(("memcpy", "copy", np_ranks))
    shared = floor_seconds(floor_op, nbytes, np_ranks, rate_np) if rate_np else None
    peers_ok = (None if None in vs.values() else all(v >= PEER_RATIO for v in vs.values()))
    t.add(label, np_ranks, fmt_bytes(nbytes), fmt_time(ours["time"]),
          *[fmt_time(found[p]["time"]) if found[p] else "-" for p in PEERS],
          f"{fmt_time(floor)} ({floor_bytes(floor_op, nbytes, np_ranks) / MIB:.4g} MiB)",
          fmt_ratio(ours["time"] / floor),
          fmt_ratio(ours["time"] / shared) if shared else "-",
          *[fmt_ratio(vs[p]) for p in PEERS], _verdict(peers_ok),
          _verdict(ours["time"] <= FLOOR_RATIO * floor))


def table(ctx) -> Table | None:
    """The targets table from this run's figures, or None without a copy rate or our rows."""
    rate = ctx.figures.get(("memcpy", "copy"))
    if not rate:
        return None
    t = Table("issue #38's targets: 1-64 MiB, ours vs MPICH, gloo and the copy floor "
              "(peer time / ours; > 1: ours faster)",
              ["op", "np", "size per rank", "ours", "MPICH", "gloo", "copy floor (bytes)",
               "ours / floor", "ours / floor at R_np", "vs MPICH", "vs gloo",
               f">= {PEER_RATIO:g}x MPICH and gloo", f"<= {FLOOR_RATIO:g}x floor"])
    sizes = [SMOKE_SIZE] if getattr(ctx, "smoke", False) else SIZES
    for row in ROWS:
        for np_ranks in ctx.nps:
            for nbytes in sizes:
                _row(ctx, t, row, np_ranks, nbytes, rate)
    if not t.rows:
        return None
    for column, name in ((-2, "peers"), (-1, "floor")):
        verdicts = [r[column] for r in t.rows]
        t.notes.append(f"{name}: {verdicts.count('PASS')} PASS, {verdicts.count('MISS')} MISS "
                       f"of {len(verdicts)} rows")
    at_np = ", ".join(f"np={n}: {ctx.figures[('memcpy', 'copy', n)]:.2f}" for n in ctx.nps
                      if ("memcpy", "copy", n) in ctx.figures)
    t.notes.append(f"copy rate R = {rate:.2f} GB/s (the memcpy table's copy row: one thread, "
                   "warm buffers); floor = copy-equivalent bytes / R, derived per op in "
                   f"benchmarks/bench_copy_floor.py; R_np, per process while np processes "
                   f"copy 64 MiB at once: {at_np or 'not measured'} GB/s "
                   f"({len(os.sched_getaffinity(0))} cores)")
    runs = len(getattr(ctx, "runs", []))
    if runs > 1:
        t.notes.append(f"each figure is the median of {runs} runs (run_all --repeat {runs})")
    return t


if __name__ == "__main__":
    import run_all

    sys.exit(run_all.main(["--cases", "floor", "--systems", "ours,mpi,gloo"] + sys.argv[1:]))
