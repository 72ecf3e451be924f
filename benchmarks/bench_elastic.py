"""Elastic recovery, np=4: from a worker's SIGKILL to training resumed on the survivors.

Each run starts 4 workers of ``elastic_worker.py`` (a small torch model under
``hvd.elastic.run``, 10 ms of sleep per step, commit every step), waits for 20 steps, SIGKILLs
the worker with rank 2 and measures the time until rank 0 of the re-formed job logs its first
completed step (``resumed``), then lets the job finish (8 more steps) and checks it exited 0.
Cases, round-robin over ``--runs`` runs in one invocation so load drift hits them alike:

- ``hvdrun``: ``hvdrun -np 4 --min-np 2 --max-np 4`` on localhost: 3 survivors;
- ``hvdrun-2hosts``: ``hvdrun --min-np 2 --max-np 4 --host-discovery-script`` printing
  ``localhost:2`` and ``127.0.0.1:2``: the dead worker's host is blacklisted (Horovod's rule),
  2 survivors;
- ``horovodrun-2hosts``: Horovod 0.28.1, ``horovodrun --gloo`` with the same flags and script
  (from ``HVD_BENCH_HOROVOD_VENV``, default /work/venv-horovod). Horovod blacklists a single
  host's every worker, so it needs the two-host form to survive at all.

Never asserts anything (DESIGN §7).

    python benchmarks/bench_elastic.py --runs 3
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "elastic_worker.py")
HOROVOD_VENV = os.environ.get("HVD_BENCH_HOROVOD_VENV", "/work/venv-horovod")


def _command(case, log, discover):
    common = ["--min-np", "2", "--max-np", "4"]
    if case == "hvdrun":
        return [sys.executable, "-m", "hvd_magic.launch.hvdrun", "-np", "4", *common,
                sys.executable, WORKER, "engine_native.torch", log, "8"]
    if case == "hvdrun-2hosts":
        return [sys.executable, "-m", "hvd_magic.launch.hvdrun", "-np", "4", *common,
                "--host-discovery-script", discover, sys.executable, WORKER,
                "engine_native.torch", log, "8"]
    py = os.path.join(HOROVOD_VENV, "bin", "python")
    return [os.path.join(HOROVOD_VENV, "bin", "horovodrun"), "--gloo", "-np", "4", *common,
            "--host-discovery-script", discover, py, WORKER, "horovod.torch", log, "8"]


def _events(log):
    try:
        with open(log) as fh:
            return [json.loads(line) for line in fh if line.endswith("\n")]
    except FileNotFoundError:
        return []


def _wait(log, proc, cond, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = cond(_events(log))
        if found is not None:
            return found
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    return None


def one_run(case, tmp):
    log = os.path.join(tmp, f"{case}-{time.time_ns()}.jsonl")
    discover = os.path.join(tmp, "discover.sh")
    env = dict(os.environ)
    if case.startswith("horovod"):
        env["PATH"] = os.path.join(HOROVOD_VENV, "bin") + os.pathsep + env["PATH"]
    proc = subprocess.Popen(_command(case, log, discover), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        ranks = _wait(log, proc, lambda ev: {e["rank"]: e["pid"] for e in ev if e["ev"] == "rank"}
                      if sum(e["ev"] == "step" for e in ev) >= 20 else None, 180)
        if not ranks or 2 not in ranks:
            return None, "did not start: " + (proc.communicate(timeout=30)[1] or "")[-400:]
        t0 = time.time()
        os.kill(ranks[2], signal.SIGKILL)
        resumed = _wait(log, proc, lambda ev: next((e["t"] for e in ev if e["ev"] == "step"
                                                    and e["size"] != 4), None), 180)
        code = proc.wait(timeout=180)
        if resumed is None:
            return None, f"never resumed (exit {code})"
        size = next(e["size"] for e in _events(log) if e["ev"] == "step" and e["size"] != 4)
        return (resumed - t0, size, code), ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cases", default="hvdrun,hvdrun-2hosts,horovodrun-2hosts")
    args = parser.parse_args()
    cases = args.cases.split(",")
    if not os.path.exists(os.path.join(HOROVOD_VENV, "bin", "horovodrun")):
        print(f"(no Horovod at {HOROVOD_VENV}: horovodrun-2hosts skipped)")
        cases = [c for c in cases if not c.startswith("horovod")]
    results = {c: [] for c in cases}
    notes = {}
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "discover.sh"), "w") as fh:
            fh.write("#!/bin/sh\necho localhost:2\necho 127.0.0.1:2\n")
        os.chmod(os.path.join(tmp, "discover.sh"), 0o755)
        for _ in range(args.runs):
            for case in cases:
                got, note = one_run(case, tmp)
                if got is None:
                    notes[case] = note
                else:
                    results[case].append(got)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("| case | SIGKILL → first step on survivors, median [min–max] | survivors | "
          "runs ok / exit 0 |")
    print("|---|---|---|---|")
    for case in cases:
        got = results[case]
        if not got:
            print(f"| {case} | failed: {notes.get(case, '?')[:120]} | | 0/{args.runs} |")
            continue
        secs = [g[0] for g in got]
        print(f"| {case} | {statistics.median(secs):.2f} s [{min(secs):.2f}–{max(secs):.2f}] | "
              f"{got[0][1]} | {len(got)}/{args.runs}, exit 0: {sum(g[2] == 0 for g in got)} |")


if __name__ == "__main__":
    main()
