"""The one benchmark command: ours and the peers, side by side, in one run; a table with ratios.

    python benchmarks/run_all.py                     # everything, np 2 and 4 (~20 min)
    python benchmarks/run_all.py --quick             # short smoke run (~2-3 min)
    python benchmarks/run_all.py --cases allreduce,fusion --np 2
    python benchmarks/run_all.py --systems ours      # only our core (what the smoke test runs)
    python benchmarks/run_all.py --out results.md    # also write the printed tables to a file

Cases: allreduce (shm), tcp (forced TCP), fusion (200 x 4 KiB), collectives (allgather,
broadcast, alltoall, reducescatter), grouped (grouped allgather of 64 x 4 KiB / 64 KiB and
8 x 1 MiB, fused vs HVD_FUSION_THRESHOLD=0 vs the peers), embedding (a 1M x 64
sparse-embedding training step, engine_native.torch vs Horovod), p2p (send/recv ping-pong
between two ranks, 4 B to 64 MiB, vs MPICH Send/Recv and gloo send/recv), idle (idle CPU and first-op
time after init), memcpy (this machine's ceiling); not in the default list: floor (issue #38:
every collective at 1-64 MiB vs MPICH, gloo and the copy floor, bench_copy_floor.py; its table
is also printed after any run that measured memcpy and those sizes).
Peers: MPICH through mpi4py, torch.distributed gloo, Horovod 0.28.1 from
benchmarks/.venv-horovod (``bash benchmarks/horovod_venv.sh``; skipped with a note when absent).
Standalone, for figures the tests bound loosely: bench_scheduler.py, bench_dashboard_updates.py.
Every launch runs under a hard timeout and kills its whole process tree when it ends. Nothing
here asserts a timing (DESIGN section 7): misses against the issue's targets are printed.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_allreduce
import bench_copy_floor
import bench_embedding_step
import bench_fusion
import bench_grouped_allgather
import bench_idle
import bench_other_collectives
import bench_p2p
import benchlib
import launcher
import machine
import targets
import targets_collectives

ALL_CASES = ("memcpy", "allreduce", "tcp", "fusion", "collectives", "grouped", "embedding",
             "p2p", "idle")
CASES = ALL_CASES + ("floor",)  # floor repeats allreduce and collectives at 1-64 MiB
FAMILIES = {"ours", "mpi", "gloo", "horovod"}


def _versions() -> str:
    parts = [f"Python {platform.python_version()}"]
    for dist in ("numpy", "torch", "mpi4py", "mpich"):
        try:
            parts.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist} not installed")
    try:
        head = subprocess.run(["git", "-C", benchlib.REPO, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False).stdout.strip()
        parts.append(f"hvd-magic {head or '?'} (+ working tree)")
    except (OSError, subprocess.TimeoutExpired):
        pass
    return ", ".join(parts)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short smoke run: few sizes/iters")
    parser.add_argument("--cases", default=",".join(ALL_CASES),
                        help=f"comma list from {','.join(CASES)}")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes and a few iterations: proves the scripts run")
    parser.add_argument("--np", default="2,4", help="comma list of rank counts (default 2,4)")
    parser.add_argument("--systems", default="all",
                        help="'all' or a comma list from ours,mpi,gloo,horovod "
                             "('ours' alone: our core only, what the smoke test runs)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="hard limit per launch in seconds (default 300)")
    parser.add_argument("--out", help="also write the report (markdown) to this file")
    parser.add_argument("--bind", action="store_true",
                        help="bind every rank to CPUs: ours with HVD_CPU_BIND=core (where the "
                             "ranks outnumber the CPUs, evenly in runs; a rank alone on its "
                             "host, as ours-tcp's, stays unbound), MPICH and Horovod's mpiexec "
                             "with -bind-to core (round robin); gloo's ranks (torch, Horovod "
                             "gloo) stay unbound, said in the notes. Without it, ours runs its "
                             "default, HVD_CPU_BIND=auto (bound where the ranks outnumber the "
                             "CPUs by a whole multiple), the peers unbound")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the cases this many times, back to back; the targets tables "
                             "then take each figure's median over the runs and list every "
                             "run's ratio (default 1)")
    return parser


def _context(parser, args) -> tuple:
    """(cases, Context) from the command line; parser.error() on a bad value."""
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; choose from {CASES}")
    nps = [int(x) for x in args.np.split(",") if x]
    allowed = None if args.systems == "all" else set(args.systems.split(","))
    if allowed is not None and allowed - FAMILIES:
        parser.error(f"--systems: unknown {sorted(allowed - FAMILIES)}")
    if allowed is not None and "horovod" not in allowed:
        horovod = (False, f"--systems {args.systems}")
    else:
        horovod = launcher.horovod_available()
    ctx = launcher.Context(nps, args.quick or args.smoke, horovod, timeout=args.timeout)
    ctx.smoke = args.smoke
    ctx.allowed = allowed
    ctx.bind = args.bind
    if args.bind:
        ctx.notes.append("--bind: ours and the mpiexec-launched systems bound to CPUs (ours-tcp, "
                         "a host per rank, unbound); gloo's ranks (torch gloo, Horovod gloo) "
                         "unbound")
    return cases, ctx


def _run_case(ctx, case: str) -> list:
    if case == "memcpy":
        return [machine.memcpy_table(ctx)]
    if case in ("allreduce", "tcp"):
        return bench_allreduce.run(ctx, tcp=case == "tcp")
    if case == "fusion":
        return bench_fusion.run(ctx)
    if case == "collectives":
        return bench_other_collectives.run(ctx)
    if case == "p2p":
        return bench_p2p.run(ctx)
    if case == "grouped":
        return bench_grouped_allgather.run(ctx)
    if case == "floor":
        return bench_copy_floor.run(ctx)
    if case == "embedding":
        return bench_embedding_step.run(ctx)
    return bench_idle.run(ctx)


def _report(header: list, footer: list, tables: list, ctx) -> str:
    loads = "; ".join(f"{label} {load}" for label, load in ctx.loads)
    report = "\n".join(f"- {line}" for line in header + footer) + "\n\n"
    report += "\n".join(t.render() for t in tables)
    if ctx.notes:
        report += "\n### notes from this run\n\n" + "\n".join(f"- {n}" for n in ctx.notes) + "\n"
    report += f"\n<details><summary>load average before each launch</summary>\n\n{loads}\n\n"
    return report + "</details>\n"


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    launcher.exit_on_sigterm()
    cases, ctx = _context(parser, args)
    started = time.time()
    header = [
        f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"machine: {machine.describe()}",
        f"versions: {_versions()}",
        "horovod: " + (ctx.horovod_info if ctx.horovod_ok else "SKIPPED - " + ctx.horovod_info),
        "command: " + " ".join(["python", "benchmarks/run_all.py"] + (argv or sys.argv[1:])),
        f"load average at start: {benchlib.load_average()}",
    ]
    print("\n".join(header), flush=True)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    tables = []
    for run in range(args.repeat):
        ctx.figures = {}
        for case in cases:
            print(f"\n== {case}" + (f" (run {run + 1} of {args.repeat})" if args.repeat > 1
                                     else ""), flush=True)
            tables += _run_case(ctx, case)
        ctx.runs.append(ctx.figures)
    ctx.figures = launcher.median_figures(ctx.runs)
    tables.append(targets.table(ctx))
    tables += [t for t in (targets_collectives.table(ctx), bench_copy_floor.table(ctx))
               if t is not None]
    footer = [f"load average at end: {benchlib.load_average()}",
              f"total wall time: {time.time() - started:.0f} s"]
    report = _report(header, footer, tables, ctx)
    print("\n" + report, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
