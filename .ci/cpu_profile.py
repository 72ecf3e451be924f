"""Where the test suite's CPU goes: CPU seconds per test file and per test, with every process
a test started counted (ranks, engines, kernels, JVMs, compilers), exact from the kernel's
process accounting. The suite is CPU-bound on CI's 2 cores (two workers, ranks oversubscribe),
so its wall time follows the CPU its tests spend, and this table is where to cut.

    python .ci/cpu_profile.py run OUT [pytest args]   # ./dev.sh test under accounting (root)
    python .ci/cpu_profile.py report OUT              # the tables (NF=, NT= rows; KIND=cc1plus)

How a process is charged: process accounting (acct(2)) writes each process's CPU, pid and
start second when it exits; a sampler notes each new process's parent and command line every
0.3 s; a pytest plugin (this file, ``-p cpu_profile``) logs each test's start and end per
worker. A process is charged to the test its worker ran when the process started, found by
walking its parents up to a worker. A process that lived under 0.3 s may go unseen by the
sampler: it is charged through its parent at exit, else left unattributed (the first line
says how much). The workers' own CPU (tests run in-process) is not in the per-test rows.
"""
from __future__ import annotations

import bisect
import collections
import ctypes
import glob
import os
import struct
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_log = None


# ---- the pytest plugin (loaded in every worker with -p cpu_profile) -------------------------

def _test_log():
    global _log
    if _log is None:
        path = os.path.join(os.environ["CPU_PROFILE_DIR"], f"tests-{os.getpid()}.log")
        _log = open(path, "a", buffering=1)
    return _log


def pytest_runtest_logstart(nodeid, location):
    _test_log().write(f"S {os.getpid()} {time.time():.3f} {nodeid}\n")


def pytest_runtest_logfinish(nodeid, location):
    _test_log().write(f"E {os.getpid()} {time.time():.3f} {nodeid}\n")


# ---- run ---------------------------------------------------------------------------------------

def sample(path: str) -> None:
    """Log each new process (pid, parent, start ticks, first-seen time, command) until killed."""
    seen = {}
    with open(path, "a", buffering=1) as out:
        while True:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/stat") as fh:
                        fields = fh.read().rsplit(")", 1)[1].split()
                    if seen.get(pid) == fields[19]:
                        continue
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        cmd = fh.read()[:200].decode(errors="replace")
                    cmd = " ".join(cmd.replace("\0", " ").split())  # one line (python -c ...)
                except OSError:
                    continue
                seen[pid] = fields[19]
                out.write(f"P {pid} {fields[1]} {fields[19]} {time.time():.2f} {cmd}\n")
            time.sleep(0.3)


def run(out: str, pytest_args: list) -> int:
    os.makedirs(out, exist_ok=True)
    acct_file = os.path.join(out, "acct.dat")
    open(acct_file, "wb").close()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(acct_file.encode()) != 0:
        sys.exit(f"acct({acct_file}): {os.strerror(ctypes.get_errno())} (needs root)")
    sampler = subprocess.Popen([sys.executable, __file__, "sample", os.path.join(out, "procs.log")])
    env = dict(os.environ, CPU_PROFILE_DIR=os.path.abspath(out),
               PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(os.path.abspath(__file__)),
                                                        os.environ.get("PYTHONPATH")])))
    try:
        with open(os.path.join(out, "pytest.log"), "w") as log:
            return subprocess.call(["./dev.sh", "test", "-p", "cpu_profile", *pytest_args],
                                   cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    finally:
        libc.acct(None)
        sampler.kill()


# ---- report ------------------------------------------------------------------------------------

def _comp(v: int) -> int:  # comp_t: 13-bit mantissa, 3-bit base-8 exponent
    return (v & 0x1FFF) << (3 * (v >> 13))


def _kind(cmd: str) -> str:
    if "harness.py" in cmd or "zygote_server.py" in cmd:
        return "rank"
    if " -m " in cmd:
        return cmd.split(" -m ", 1)[1].split()[0]
    return os.path.basename(cmd.split(" ")[0]) if cmd else "?"


def report(out: str) -> None:
    hz = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as fh:  # start ticks are since boot (same boot as the run)
        boot = int(next(line for line in fh if line.startswith("btime")).split()[1])
    tests = collections.defaultdict(list)  # worker pid -> (start, end, nodeid), sorted below
    for path in glob.glob(os.path.join(out, "tests-*.log")):
        started = {}
        for line in open(path):
            if not line.endswith("\n"):
                continue  # a worker killed mid-line
            mark, pid, t, node = line.rstrip("\n").split(" ", 3)
            if mark == "S":
                started[node] = float(t)
            elif node in started:
                tests[int(pid)].append((started.pop(node), float(t), node))
    seen = collections.defaultdict(list)  # pid -> [(start time, parent, command)]
    for line in open(os.path.join(out, "procs.log")):
        if not line.startswith("P "):
            continue  # a line of a command the sampler did not flatten (written before 2026-12-06)
        _, pid, ppid, ticks, _, cmd = line.rstrip("\n").split(" ", 5)
        seen[int(pid)].append((boot + int(ticks) / hz, int(ppid), cmd))
    controller = {pp for pid in tests for _, pp, _ in seen.get(pid, ())}
    workers = set(tests) - controller  # xdist's controller logs too: keep its workers
    for runs in tests.values():
        runs.sort()
    starts = {w: [a for a, _, _ in tests[w]] for w in workers}

    def at(pid, t):
        found = None
        for start, ppid, cmd in seen.get(pid, ()):
            if start <= t + 1:
                found = (ppid, cmd)
        return found

    per_test, kinds = collections.Counter(), collections.defaultdict(collections.Counter)
    loose, total = collections.Counter(), 0.0
    data = open(os.path.join(out, "acct.dat"), "rb").read()
    for off in range(0, len(data) - 63, 64):  # struct acct_v3
        rec = data[off:off + 64]
        if rec[1] != 3:
            sys.exit("process accounting wrote records of another version than acct_v3")
        pid, ppid_at_exit, start = struct.unpack_from("<III", rec, 16)
        utime, stime = struct.unpack_from("<HH", rec, 32)
        cpu = (_comp(utime) + _comp(stime)) / hz
        total += cpu
        own = at(pid, start)
        kind = _kind(own[1]) if own else rec[48:64].split(b"\0")[0].decode(errors="replace")
        worker, cur, parent = None, pid, own[0] if own else ppid_at_exit
        for _ in range(40):
            if cur in workers:
                worker = cur
                break
            if parent is None or parent <= 1:
                break
            cur = parent
            up = at(cur, start)
            parent = up[0] if up else None
        if worker is None or worker == pid:
            if worker is None:
                loose[kind] += cpu
            continue
        runs = tests[worker]
        i = bisect.bisect_right(starts[worker], start) - 1
        node = runs[i][2] if i >= 0 and start <= runs[i][1] + 0.5 else "(between tests)"
        per_test[node] += cpu
        kinds[node][kind] += cpu
    print(f"CPU of every process: {total:.0f} s; charged to tests {sum(per_test.values()):.0f} s;"
          f" unattributed {sum(loose.values()):.0f} s ("
          + ", ".join(f"{k} {v:.0f}" for k, v in loose.most_common(5)) + ")")
    files = collections.Counter()
    for node, cpu in per_test.items():
        files[node.split("::")[0]] += cpu
    print("\nCPU s  test file")
    for name, cpu in files.most_common(int(os.environ.get("NF", "30"))):
        print(f"{cpu:6.1f}  {name}")
    print("\nCPU s  test  [the kinds of process that spent most]")
    for node, cpu in per_test.most_common(int(os.environ.get("NT", "30"))):
        top = ", ".join(f"{k} {v:.0f}" for k, v in kinds[node].most_common(3))
        print(f"{cpu:6.1f}  {node.split('@')[0]}  [{top}]")
    if os.environ.get("KIND"):
        rows = sorted(((v[os.environ["KIND"]], n) for n, v in kinds.items()), reverse=True)
        print(f"\n{os.environ['KIND']}: {sum(r[0] for r in rows):.0f} s")
        for cpu, node in rows[:30]:
            if cpu > 0:
                print(f"{cpu:6.1f}  {node.split('@')[0]}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "sample":
        sample(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "run":
        sys.exit(run(sys.argv[2], sys.argv[3:]))
    elif len(sys.argv) == 3 and sys.argv[1] == "report":
        report(sys.argv[2])
    else:
        sys.exit(__doc__)
