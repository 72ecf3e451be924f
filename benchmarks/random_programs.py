"""Random multi-rank programs, the long run (issue #35 item 6): at least N programs at np >= 2,
each run in the same long-lived rank processes as the programs before it, with every injected
failure (abort, raise, kill, stop) checked to reach every live rank as an exception within
HVD_TIMEOUT + 1 s, every collective's result checked against NumPy, and every point-to-point
message (tests/multiproc/random_program_p2p.py) checked bit for bit.

    nice -n 10 python benchmarks/random_programs.py                 # 500 programs (~15 min)
    python benchmarks/random_programs.py --programs 60 --np 3       # a short look
    python benchmarks/random_programs.py --seed 17 --np 3           # replay one program
    python benchmarks/random_programs.py --np 4 --hosts 2           # 2 fake hosts of 2 ranks
    python benchmarks/random_programs.py --api torch                # through engine_native.torch

Seeds are consecutive from --first-seed; a batch of --batch seeds runs in one set of rank
processes (tests/multiproc/random_program_rank.py). A kill shrinks the world for the rest of
its batch (the survivors go on, renumbered); programs that then run at np 1 are shown but not
counted toward N. Prints a line per batch, every problem with its seed and program listing,
and the table (np | programs | steps | injected failures by kind | hangs | wrong results | max
failure-to-exception latency | seconds). Exit status 1 when anything went wrong.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from multiproc import random_program as rp  # noqa: E402
from multiproc import random_program_batch as batch  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=500,
                        help="programs to run at np >= 2 (default 500)")
    parser.add_argument("--np", type=int, nargs="+", default=[2, 3, 4],
                        help="world sizes, taken in turn per batch (default 2 3 4)")
    parser.add_argument("--batch", type=int, default=8, help="programs per set of ranks")
    parser.add_argument("--hvd-timeout", type=float, default=3.0, help="HVD_TIMEOUT (s)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, help="replay this one program (with one --np)")
    parser.add_argument("--hosts", type=int, default=1,
                        help="ranks over this many fake hosts in blocks (HVD_HOSTNAME): shared "
                             "memory within one, TCP between them (default 1)")
    parser.add_argument("--api", choices=("numpy", "torch"), default="numpy",
                        help="the binding the programs call (default numpy; torch: "
                             "engine_native.torch on tensors, tests/multiproc/"
                             "random_program_torch.py)")
    args = parser.parse_args()
    if args.seed is not None:
        return replay(args.seed, args.np[0], args.hvd_timeout, args.hosts, args.api)
    outcomes, hangs, problems = [], [], []
    seeds = itertools.count(args.first_seed)
    start = time.monotonic()
    for size in itertools.cycle(args.np):
        if sum(o.np >= 2 for o in outcomes) >= args.programs:  # (np 1: a kill's survivor)
            break
        chunk = list(itertools.islice(seeds, args.batch))
        result = batch.run_seeds(chunk, size, args.hvd_timeout, hosts=args.hosts, api=args.api)
        outcomes += result.outcomes
        hangs += result.hangs
        problems += result.problems
        injected = [o.failure for o in result.outcomes if o.failure]
        print(f"np {size} seeds {chunk[0]}-{chunk[-1]}: {len(result.outcomes)} programs, "
              f"injected {injected}, {len(result.problems)} problems "
              f"({time.monotonic() - start:.0f} s)", flush=True)
        for problem in result.problems:
            print(problem, flush=True)
    print(f"\n{len(problems)} problems; wall {time.monotonic() - start:.0f} s; "
          f"HVD_TIMEOUT {args.hvd_timeout:g} s, bound {args.hvd_timeout + batch.LATENCY_SLACK:g}"
          f" s\n")
    print(batch.table(outcomes, hangs))
    print(batch.latency_by_kind(outcomes))
    return 1 if problems else 0


def replay(seed: int, size: int, hvd_timeout: float, hosts: int = 1, api: str = "numpy") -> int:
    print(rp.describe(rp.generate(seed, size)))
    result = batch.run_seeds([seed], size, hvd_timeout, hosts=hosts, api=api)
    for problem in result.problems:
        print(problem)
    for outcome in result.outcomes:
        print(f"seed {outcome.seed} np {outcome.np}: injected {outcome.failure}, latency "
              f"{outcome.latency}, {outcome.seconds:.2f} s, {len(outcome.problems)} problems")
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
