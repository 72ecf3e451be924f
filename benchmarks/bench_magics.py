"""hvd magics against bare ipyparallel, in the same run on the same machine.

Three cases, each printed as ``ours | bare ipyparallel | ratio``:

1. cluster ready: ``%hvd_start -n N`` (engines registered, ranks mapped, torch imported,
   core initialised, hvd in every namespace) vs ``ipp.Cluster(engines=..., n=N)
   .start_and_connect_sync()`` (engines registered, nothing else);
2. empty cell round trip: ``%%hvd`` vs ``%%px`` with ``pass`` (median of many);
3. recovery from a collective that one rank skipped: ``%%hvd --timeout T`` (time after the
   timeout until the cell returned with the core re-initialised on the same engines) vs
   ``Cluster.restart_engines`` + waiting for the engines (what a %%px user has to do; it does
   not even re-initialise anything).

Usage::

    python benchmarks/bench_magics.py [-n 4] [--launcher mpi] [--cells 30] [--reps 2]

Needs ``pip install -e .`` (the native core) and, for the default launcher, mpiexec + mpi4py.
Timings on a shared 2-core machine are pessimistic; compare ratios.
"""

import argparse
import io
import logging
import os
import platform
import statistics
import sys
import time
from contextlib import redirect_stderr, redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SKIP_ONE = ("%%hvd --timeout {t}\nx = torch.ones(4)\nif hvd.rank() != 1:\n"
            "    hvd.allreduce(x, name='bench.stuck')\n")


def quiet(shell, code):
    """Run a cell with its output swallowed; returns (seconds, ExecutionResult)."""
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        t0 = time.perf_counter()
        res = shell.run_cell(code, store_history=False)
        return time.perf_counter() - t0, res


def bench_bare(shell, args):
    import ipyparallel as ipp

    out = {}
    t0 = time.perf_counter()
    cluster = ipp.Cluster(engines=args.launcher, n=args.n, log_level=logging.ERROR)
    rc = cluster.start_and_connect_sync()
    out["ready"] = time.perf_counter() - t0
    try:
        view = rc[:]
        view.block = True
        view.activate()
        quiet(shell, "%%px\npass")  # warm-up
        out["cell"] = statistics.median(quiet(shell, "%%px\npass")[0] for _ in range(args.cells))
        restarts = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            cluster.restart_engines_sync()
            rc.wait_for_engines(args.n, timeout=120, interactive=False)
            restarts.append(time.perf_counter() - t0)
        out["recover"] = statistics.median(restarts)
    finally:
        rc.close()
        cluster.stop_cluster_sync()
    return out


def bench_hvd(shell, args):
    out = {}
    seconds, res = quiet(shell, f"%hvd_start -n {args.n} --launcher {args.launcher}")
    if res.error_in_exec is not None:
        raise SystemExit(f"%hvd_start failed: {res.error_in_exec}")
    out["ready"] = seconds
    try:
        quiet(shell, "%%hvd\npass")
        out["cell"] = statistics.median(quiet(shell, "%%hvd\npass")[0]
                                        for _ in range(args.cells))
        recoveries = []
        for _ in range(args.reps):
            seconds, res = quiet(shell, SKIP_ONE.format(t=args.stuck_timeout))
            if "re-initialised the core" not in str(res.error_in_exec._render_traceback_()):
                raise SystemExit(f"recovery did not happen: {res.error_in_exec}")
            recoveries.append(seconds - args.stuck_timeout)
            quiet(shell, "%%hvd\nhvd.allreduce(torch.ones(1))")
        out["recover"] = statistics.median(recoveries)
    finally:
        quiet(shell, "%hvd_stop")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=4)
    parser.add_argument("--launcher", default="mpi")
    parser.add_argument("--cells", type=int, default=30, help="empty cells per side")
    parser.add_argument("--reps", type=int, default=2, help="recoveries per side")
    parser.add_argument("--stuck-timeout", type=float, default=1.0)
    args = parser.parse_args()

    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext hvd_magic")
    bare = bench_bare(shell, args)
    ours = bench_hvd(shell, args)

    import ipyparallel
    import torch

    print(f"\nhvd magics vs bare ipyparallel: n={args.n}, launcher={args.launcher}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}, ipyparallel "
          f"{ipyparallel.__version__}, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    rows = [
        ("cluster ready (s)", "ready", "%hvd_start (+core, torch, hvd)",
         "Cluster.start_and_connect"),
        ("empty cell round trip (ms)", "cell", "%%hvd pass", "%%px pass"),
        ("recover from stuck allreduce (s)", "recover", "%%hvd --timeout: abort+re-init",
         "restart_engines + wait"),
    ]
    print(f"{'case':34} {'hvd':>9} {'bare':>9} {'hvd/bare':>9}   what")
    for label, key, what_ours, what_bare in rows:
        scale = 1000 if key == "cell" else 1
        a, b = ours[key] * scale, bare[key] * scale
        print(f"{label:34} {a:9.2f} {b:9.2f} {a / b:9.2f}   {what_ours} | {what_bare}")


if __name__ == "__main__":
    main()
