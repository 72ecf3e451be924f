"""The scheduler's figures that the tests used to assert tightly (issue #17), measured by the
tests' own rank functions: the tests keep bounds an order of magnitude away; these are the
values.

    python benchmarks/bench_scheduler.py               # 5 repeats, np 2 (~2 min)
    python benchmarks/bench_scheduler.py --repeats 20

Figures, each a median and range over the repeats (per rank where ranks differ):
  driven      share of 301 synchronous shm ops whose wait ran the op on the calling thread
              (Note [Caller drives]; HVD_CALLER_SPIN_US=2 s), test_caller_drives.py
  late cpu    CPU of rank 0 while it waits 0.6 s for a late peer, in % of the wait
  tcp 20 ops  wall time of 20 synchronous 4-byte allreduces over forced TCP
  foreign     wall time of 20 ops in process set [1] while rank 0, its coordinator, is idle
  paced wakes loop wakes per step of 600 tensors submitted 5 us apart (Note [Coalesced
              wakes]), and the median wait for a step's results, test_coalesced_wakes.py
  late wakes  loop wakes of a rank waiting 1 s on a late peer, in a barrier and an allreduce
Nothing here asserts a timing (DESIGN section 7).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))  # the rank functions and their harness

from multiproc import test_caller_drives as drives  # noqa: E402
from multiproc import test_coalesced_wakes as wakes  # noqa: E402
from multiproc.checks import world_kwargs  # noqa: E402
from multiproc.harness import run_ranks  # noqa: E402


def _spread(values, fmt="{:.3g}") -> str:
    values = sorted(values)
    return (f"{fmt.format(statistics.median(values))} "
            f"({fmt.format(values[0])} - {fmt.format(values[-1])})")


def measure_once() -> dict:
    """One round of every figure; each value a list (one per rank where it is per rank)."""
    out = {}
    res = run_ranks(drives.sync_ops_suite, 2, env={"HVD_CALLER_SPIN_US": "2000000"},
                    timeout=120)
    out["driven (% of ops)"] = [100.0 * r.value[1] / (drives.OPS + 1) for r in res]
    res = run_ranks(drives.late_peer_suite, 2, timeout=60)
    out["late cpu (% of the wait)"] = [100.0 * res[0].value[1] / res[0].value[2]]
    res = run_ranks(drives.tcp_latency_suite, 2, timeout=60, **world_kwargs(2, "tcp"))
    out["tcp 20 ops (ms)"] = [1e3 * r.value[0] for r in res]
    res = run_ranks(drives.foreign_set_suite, 2, timeout=60)
    out["foreign 20 ops (ms)"] = [1e3 * res[1].value]
    res = run_ranks(wakes.paced_submissions, 2, timeout=120)
    out["paced wakes per step"] = [r.value[0] for r in res]
    out["paced median wait (ms)"] = [1e3 * r.value[1] for r in res]
    res = run_ranks(wakes.waits_on_a_late_peer, 2, timeout=120)
    out["late wakes (barrier)"] = [res[1].value["barrier"]]
    out["late wakes (allreduce)"] = [res[1].value["allreduce"]]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    rounds = []
    for i in range(args.repeats):
        rounds.append(measure_once())
        print(f"round {i + 1}/{args.repeats} done", flush=True)
    print(f"\n| figure (np 2, {args.repeats} rounds) | median (min - max) |\n|---|---|")
    for name in rounds[0]:
        print(f"| {name} | {_spread([v for r in rounds for v in r[name]])} |")
    print(f"\nload average: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
