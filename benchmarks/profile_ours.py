"""Where our allreduce time goes: run a tight allreduce loop on our core and profile rank 0.

    python benchmarks/profile_ours.py --size 4 --tool strace        # syscalls per op
    python benchmarks/profile_ours.py --size 64M --tool perf        # hottest symbols
    python benchmarks/profile_ours.py --size 4 --tool py-spy        # Python-side stacks
    python benchmarks/profile_ours.py --size 64M --variant in-place --transport tcp

Starts ``--np`` ranks (default 2) running ``--iters`` allreduces of ``--size`` bytes of float32
through the numpy API (or the core's in-place path), waits until rank 0 is in the loop, then
attaches the tool to rank 0 for ``--seconds``: ``perf record -g`` (report: top symbols by
self time, all threads), ``strace -c -f`` (syscall counts, divided by the ops in the window),
or ``py-spy dump``/``record``. Also prints the metrics() split for the loop. Not part of
run_all; a diagnosis aid whose findings go into RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import benchlib
import launcher

# ---------------------------------------------------------------------------------------------
# Rank side (rank_entry.py runs this as case "loop")

def rank_run(adapter, spec: dict, init_end: float) -> dict:
    variant = spec["variant"]
    if spec["tensors"] > 1:  # a set of async allreduces, then wait (the fusion case)
        bufs = [adapter.array(spec["size"], 1.0) for _ in range(spec["tensors"])]
        names = [f"grad.{i}" for i in range(spec["tensors"])]

        def step():
            adapter.allreduce_set(bufs, names)
    else:
        buf = adapter.array(spec["size"], 1.0)

        def step():
            adapter.allreduce(buf, "loop", variant)
    step()
    adapter.barrier()
    if adapter.rank == 0:
        with open(os.path.join(spec["out"], "rank0.pid"), "w") as f:
            f.write(str(os.getpid()))
    before = adapter.metrics()
    t0 = time.perf_counter()
    for _ in range(spec["iters"]):
        step()
    wall = time.perf_counter() - t0
    after = adapter.metrics()
    split = {k: (after[k] - before[k]) / spec["iters"] for k in
             ("negotiate_seconds", "communicate_seconds", "wait_seconds")} if before else {}
    return {"per_op": wall / spec["iters"], "split": split}


# ---------------------------------------------------------------------------------------------
# Launcher side

def _size(text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def _profile(tool: str, pid: int, seconds: float, out_dir: str) -> str:
    if tool == "perf":
        data = os.path.join(out_dir, "perf.data")
        subprocess.run(["perf", "record", "-g", "-o", data, "-p", str(pid), "--", "sleep",
                        str(seconds)], capture_output=True, timeout=seconds + 60, check=False)
        rep = subprocess.run(["perf", "report", "-i", data, "--no-children", "--stdio",
                              "--sort", "comm,dso,symbol", "-g", "none", "--percent-limit",
                              "1.5"], capture_output=True, text=True, timeout=120, check=False)
        return "\n".join(" ".join(line.split()) for line in rep.stdout.splitlines()
                          if line.strip() and not line.startswith("#"))
    if tool == "strace":
        proc = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        time.sleep(seconds)
        proc.send_signal(2)
        return proc.communicate(timeout=60)[0]
    if tool == "py-spy":
        rec = os.path.join(out_dir, "pyspy.txt")
        subprocess.run(["py-spy", "record", "--native", "--threads", "-f", "raw", "-o", rec,
                        "-d", str(int(max(1, seconds))), "-p", str(pid)], capture_output=True,
                       timeout=seconds + 60, check=False)
        counts = {}
        if os.path.exists(rec):
            with open(rec) as f:
                for line in f:
                    stack, _, n = line.rpartition(" ")
                    leaf = stack.split(";")[-1] if stack else "?"
                    counts[leaf] = counts.get(leaf, 0) + int(n)
        total = sum(counts.values()) or 1
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:15]
        return "\n".join(f"{100 * n / total:5.1f}%  {leaf}" for leaf, n in top)
    raise ValueError(f"unknown tool {tool!r}")


def _wait_for_rank0(system: str, started: float, runner: threading.Thread):
    """The pid file rank 0 writes when its loop starts (None if the launch ended first)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and runner.is_alive():
        for d in os.listdir(tempfile.gettempdir()):
            p = os.path.join(tempfile.gettempdir(), d, "rank0.pid")
            if (d.startswith(f"hvdbench-loop-{system}-") and os.path.exists(p)
                    and os.path.getmtime(p) >= started):  # not a stale folder of an older run
                return p
        time.sleep(0.05)
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="4", help="bytes per allreduce (suffix K/M/G)")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--tensors", type=int, default=1,
                        help="N > 1: each step submits N async allreduces, then waits")
    parser.add_argument("--iters", type=int, default=0, help="default: ~8 s worth")
    parser.add_argument("--seconds", type=float, default=3.0, help="profiling window")
    parser.add_argument("--tool", choices=("perf", "strace", "py-spy", "none"), default="perf")
    parser.add_argument("--variant", choices=("out-of-place", "in-place"),
                        default="out-of-place")
    parser.add_argument("--transport", choices=("auto", "tcp"), default="auto")
    parser.add_argument("--env", action="append", default=[],
                        help="NAME=VALUE for the ranks (e.g. HVD_CYCLE_TIME_MS=0); repeatable")
    args = parser.parse_args(argv)
    launcher.exit_on_sigterm()
    size = _size(args.size)
    iters = args.iters or max(20, min(40000, int(8 * 1.0e9 / max(size, 50_000))))
    if args.tensors > 1:
        iters = args.iters or 600
    spec = {"size": size, "iters": iters, "variant": args.variant, "tensors": args.tensors}
    system = "ours-tcp" if args.transport == "tcp" else "ours"
    holder = {}
    runner = threading.Thread(target=lambda: holder.update(
        job=launcher.launch(system, args.np, "loop", spec, timeout=300,
                            env=dict(e.split("=", 1) for e in args.env))))
    started = time.time()
    runner.start()
    pid_file = _wait_for_rank0(system, started, runner)
    report = ""
    if pid_file:
        time.sleep(0.3)
        with open(pid_file) as f:
            pid = int(f.read())
        if args.tool != "none":
            report = _profile(args.tool, pid, args.seconds, os.path.dirname(pid_file))
    runner.join()
    job = holder.get("job")
    results = job.results() if job else []
    what = f"{args.tensors} x " if args.tensors > 1 else ""
    print(f"allreduce {what}{benchlib.fmt_bytes(size)} np={args.np} {system} {args.variant} "
          f"{' '.join(args.env)}, {iters} iters, load {benchlib.load_average()}")
    if results:
        r = results[0]
        print(f"per op (rank 0, loop mean incl. profiler overhead): {benchlib.fmt_time(r['per_op'])}")
        print("metrics() split per op: " + json.dumps({k: benchlib.fmt_time(v)
                                                       for k, v in r["split"].items()}))
    elif job:
        print(f"launch failed: {job.error}")
    print(report)
    if job:
        job.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
