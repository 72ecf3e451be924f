"""Issue #4 target: the timeline's overhead, file on vs off in the same run (goal: <= 3 %).

    python benchmarks/bench_timeline.py               # np 2, shm; both cases (~1 min)
    python benchmarks/bench_timeline.py --np 2,4 --quick

Cases (each rank runs them in one process, ``engine_native`` numpy API):
  step  a training step's gradients: 200 float32 tensors of 4 KiB, allreduce_async x 200 then
        synchronize x 200 (the fusion case of bench_fusion.py), time per step;
  big   one 64 MiB float32 allreduce, time per call.
Modes, interleaved in blocks (off, on, on, off, ...) so drift hits both alike:
  off   no timeline file; the in-memory strip for the dashboard is fed as always
        (HVD_TIMELINE_LIVE=1, the default);
  on    rank 0 writes a Chrome-trace file (start_timeline before the block, stop after).
A second launch with HVD_TIMELINE_LIVE=0 measures the core with no recording at all, so the
strip's own cost is visible too. Per-step time = the slowest rank's; median over steps.
Nothing here asserts a timing (DESIGN section 7): a miss of the target is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import benchlib  # noqa: E402
from benchlib import KIB, MIB, Table, fmt_time, median  # noqa: E402

TARGET = 0.03
CASES = {"step": "200 x 4 KiB step", "big": "64 MiB allreduce"}


# ---------------------------------------------------------------------------------------------
# Rank side

def _step_runner(hvd, np):
    bufs = [np.full(4 * KIB // 4, hvd.rank() + 1.0, np.float32) for _ in range(200)]
    names = [f"grad.{i}" for i in range(200)]

    def step():
        handles = [hvd.allreduce_async(b, op=hvd.Sum, name=n) for b, n in zip(bufs, names)]
        for h in handles:
            hvd.synchronize(h)
    return step


def _big_runner(hvd, np):
    buf = np.full(64 * MIB // 4, hvd.rank() + 1.0, np.float32)
    return lambda: hvd.allreduce(buf, op=hvd.Sum, name="big")


def rank_main(spec: dict) -> dict:
    import numpy as np

    import engine_native as hvd

    hvd.init()
    out = {"rank": hvd.rank(), "times": {}, "dropped": 0, "bytes": {}}
    for case in spec["cases"]:
        run = (_step_runner if case == "step" else _big_runner)(hvd, np)
        iters, blocks = spec["iters"][case], spec["blocks"]
        for _ in range(spec["warmup"][case]):
            run()
        times = {"off": [], "on": []}
        cpu = {"off": 0.0, "on": 0.0}  # this process's CPU (every thread) per mode
        for block in range(blocks):
            order = ("off", "on") if block % 2 == 0 else ("on", "off")
            for mode in order if spec["modes"] == ["off", "on"] else spec["modes"]:
                path = os.path.join(spec["out"], f"{case}.{block}.json")
                if mode == "on":
                    hvd.start_timeline(path)
                hvd.barrier()
                c0 = time.process_time()
                for _ in range(iters):
                    t0 = time.perf_counter()
                    run()
                    times[mode].append(time.perf_counter() - t0)
                cpu[mode] += time.process_time() - c0
                if mode == "on":
                    hvd.stop_timeline()
                    if hvd.rank() == 0:
                        out["bytes"][case] = out["bytes"].get(case, 0) + os.path.getsize(path)
                        os.remove(path)
                hvd.barrier()
        out["times"][case] = times
        out.setdefault("cpu", {})[case] = {m: c / max(1, len(times[m])) for m, c in cpu.items()}
    out["dropped"] = hvd.metrics().get("timeline_dropped", 0)
    hvd.shutdown()
    return out


# ---------------------------------------------------------------------------------------------
# Launcher side

def launch(np_ranks: int, spec: dict, env: dict, timeout: float, label: str) -> list:
    """Run rank_main on np_ranks processes of our core (shm); every rank's result, or []."""
    out_dir = tempfile.mkdtemp(prefix="hvdbench-timeline-")
    spec = dict(spec, out=out_dir, timeout=timeout)
    spec_path = os.path.join(out_dir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    base = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **env)
    base.pop("PYTHONPATH", None)
    secret = os.urandom(32)
    with benchlib._rendezvous_module().RendezvousServer(secret) as server:
        host, port = server.address
        commands = [([sys.executable, os.path.abspath(__file__), "--rank-spec", spec_path],
                     dict(base, HVD_RANK=str(r), HVD_SIZE=str(np_ranks),
                          HVD_RENDEZVOUS=f"{host}:{port}", HVD_SECRET=secret.hex(),
                          HVD_JOB_ID=f"benchtl{os.getpid()}p{port}"))
                    for r in range(np_ranks)]
        print(f"  .. {label:<34} load {benchlib.load_average()}", end="", flush=True)
        job = benchlib.Launch(label, commands, out_dir, timeout).run()
    print(f"  {job.wall:6.1f} s" + (f"  FAILED: {job.error}" if job.error else ""), flush=True)
    results = job.results()
    job.cleanup()
    return results if len(results) == np_ranks else []


def _per_step(results, case, mode) -> float:
    return median(benchlib.per_iteration_max([r["times"][case][mode] for r in results]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", default="2", help="comma list of rank counts (default 2)")
    parser.add_argument("--quick", action="store_true", help="fewer blocks and steps")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    quick = args.quick
    spec = {"cases": list(CASES), "blocks": 4 if quick else 10,
            "iters": {"step": 10 if quick else 30, "big": 2 if quick else 4},
            "warmup": {"step": 5, "big": 2}}
    table = Table("Timeline overhead: file on vs off in the same run (issue #4 target <= 3 %)",
                  ["case", "np", "off (strip only)", "file on", "on vs off",
                   "CPU/step off → on (all ranks)", "no recording (HVD_TIMELINE_LIVE=0)",
                   "strip vs none", "file MB/step", "dropped"])
    misses = []
    for np_ranks in [int(x) for x in args.np.split(",") if x]:
        both = launch(np_ranks, dict(spec, modes=["off", "on"]), {}, args.timeout,
                      f"timeline/on-off/np{np_ranks}")
        bare = launch(np_ranks, dict(spec, modes=["off"]), {"HVD_TIMELINE_LIVE": "0"},
                      args.timeout, f"timeline/no-recording/np{np_ranks}")
        if not both:
            misses.append(f"np={np_ranks}: the on/off launch failed")
            continue
        for case, title in CASES.items():
            off, on = _per_step(both, case, "off"), _per_step(both, case, "on")
            none = _per_step(bare, case, "off") if bare else float("nan")
            steps = spec["blocks"] * spec["iters"][case]
            file_mb = both[0]["bytes"].get(case, 0) / steps / 1e6
            overhead = on / off - 1.0
            if overhead > TARGET:
                misses.append(f"{title}, np={np_ranks}: file on is {overhead:+.1%} "
                              f"(target <= {TARGET:.0%})")
            cpu_off = sum(r["cpu"][case]["off"] for r in both)
            cpu_on = sum(r["cpu"][case]["on"] for r in both)
            table.add(title, np_ranks, fmt_time(off), fmt_time(on), f"{overhead:+.1%}",
                      f"{fmt_time(cpu_off)} → {fmt_time(cpu_on)} ({cpu_on / cpu_off - 1:+.1%})",
                      fmt_time(none), f"{off / none - 1.0:+.1%}" if bare else "-",
                      f"{file_mb:.2f}", both[0]["dropped"])
    table.notes.append("per step: the slowest rank's time, median over "
                       f"{spec['blocks']} interleaved blocks x steps per mode; shm transport")
    table.notes.append("off = no file, the dashboard's in-memory strip fed (the default); "
                       "no recording = HVD_TIMELINE_LIVE=0 in a second launch")
    table.notes.append("CPU/step: process CPU time (every thread: Python, background loop, "
                       "timeline writer) summed over ranks; independent of machine load, "
                       f"unlike wall time (load average at the end: {benchlib.load_average()})")
    table.notes += [f"MISS: {m}" for m in misses] or ["target met: file on within 3 % of off"]
    print()
    print(table.render())
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rank-spec":
        with open(sys.argv[2]) as fh:
            rank_spec = json.load(fh)
        benchlib.arm_watchdog(rank_spec["timeout"] + 5)
        result = rank_main(rank_spec)
        path = os.path.join(rank_spec["out"], f"rank{result['rank']}.json")
        with open(path + ".tmp", "w") as fh:
            json.dump(result, fh)
        os.replace(path + ".tmp", path)
    else:
        sys.exit(main())
