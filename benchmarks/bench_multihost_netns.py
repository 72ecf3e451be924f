"""64 MiB allreduce busbw, np=4, across two hosts made of network namespaces (issue #21)
against the same job on one machine, in one invocation, round-robin over the cases.

Cases (each ``hvdrun -np 4 ... python benchmarks/multihost_rank.py``):

- ``netns ring``: ``-H a:2,b:2`` from host a (mpiexec + ssh; shm within a host, TCP across a
  veth pair and a bridge between the two network stacks), default algorithm pick;
- ``netns hierarchical``: the same with ``HVD_HIERARCHICAL_ALLREDUCE=1``;
- ``loopback fake hosts``: ``-H localhost:2,127.0.0.1:2`` (two "hosts" on this machine's
  loopback, the pre-#21 way of exercising the multi-host paths);
- ``one host``: ``-np 4`` (shm segment).

busbw = 2 (n-1)/n x bytes / time (NCCL-tests' definition), from rank 0's time per op after a
barrier; median [min-max] over ``--runs`` invocations x ``MH_RUNS`` ops. Needs root (network
namespaces) and sshd (.ci/install-sshd.sh). Never asserts anything (DESIGN §7).

    python benchmarks/bench_multihost_netns.py --runs 3
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "multihost"))

from netns_hosts import namespace_hosts

RANK = os.path.join(HERE, "multihost_rank.py")
BYTES = 64 << 20


def _times(stdout: str) -> list:
    for line in stdout.splitlines():
        if "MH-BENCH " in line:
            return json.loads(line.split("MH-BENCH ", 1)[1])["times"]
    raise RuntimeError(f"no MH-BENCH line in: {stdout[-2000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    hvdrun = shutil.which("hvdrun") or os.path.join(os.path.dirname(sys.executable), "hvdrun")
    base = [hvdrun, "-np", "4"]
    results = {}
    with namespace_hosts(("a", "b")) as hosts:
        cases = {
            "netns ring": (["-H", "a:2,b:2"], {}, True),
            "netns hierarchical": (["-H", "a:2,b:2"], {"HVD_HIERARCHICAL_ALLREDUCE": "1"}, True),
            "loopback fake hosts": (["-H", "localhost:2,127.0.0.1:2"], {}, False),
            "one host": ([], {}, False),
        }
        for _ in range(args.runs):
            for name, (extra, env, on_a) in cases.items():
                cmd = base + extra + [sys.executable, RANK]
                full_env = dict(hosts.env, PYTHONPATH=REPO, **env)
                if on_a:
                    res = hosts.run("a", cmd, timeout=300, env=full_env)
                else:
                    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                                         env=full_env, check=False)
                if res.returncode != 0:
                    raise RuntimeError(f"{name}: {res.stdout[-2000:]}\n{res.stderr[-2000:]}")
                results.setdefault(name, []).extend(_times(res.stdout))
    load = os.getloadavg()[0]
    print(f"64 MiB float32 allreduce (sum), np=4, {args.runs} x MH_RUNS ops, "
          f"load average {load:.1f}")
    print("| case | median time per op | busbw GB/s, median [min-max] |")
    print("|---|---|---|")
    for name, times in results.items():
        bw = sorted(2 * 3 / 4 * BYTES / t / 1e9 for t in times)
        print(f"| {name} | {statistics.median(times) * 1e3:.0f} ms | "
              f"{statistics.median(bw):.2f} [{bw[0]:.2f}-{bw[-1]:.2f}] |")


if __name__ == "__main__":
    main()
