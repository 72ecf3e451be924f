"""A blocking grouped op driven by its own wait (Note [Caller drives]) against the same group
handed to the core's thread, in the same ranks, alternating blocks.

    python benchmarks/bench_waited_groups.py              # np 2, 5 rounds (~1 min)
    python benchmarks/bench_waited_groups.py --np 2,4 --rounds 9

"waited": ``hvd.grouped_allgather(ts)`` / ``hvd.grouped_allreduce(ts)``, which submit the group
without waking the core's thread and drive it from the wait (since this script's commit).
"handed over": ``hvd.synchronize(hvd.grouped_allgather_async(ts))``, how every blocking group
ran before: submitted with a wake-up, run by the core's thread, the caller asleep on the handle.
Each figure: the median time per group over one block of ITERS groups, then the median over
the rounds; the last column is handed over / waited (> 1: driving is faster). Both forms give
the same outputs (checked every round). An A/B of one mechanism of ours: no peer runs it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from multiproc.harness import run_ranks  # noqa: E402

ITERS = 200
# (label, op, tensors per group, elements per tensor, dtype)
GROUPS = [
    ("allgather 1 x 160 KiB (single op)", "allgather", 1, 40960, "float32"),
    ("allgather 2 x 4 KiB", "allgather", 2, 1024, "float32"),
    ("allgather 2 x 160 KiB + 5 KiB", "allgather", 2, None, "float32"),
    ("allgather 64 x 4 KiB", "allgather", 64, 1024, "float32"),
    ("allreduce 8 x 1 KiB", "allreduce", 8, 256, "float32"),
    ("allreduce 2 x 64 KiB", "allreduce", 2, 16384, "float32"),
]


def _tensors(torch, spec, rank):
    _, _, count, elems, dtype = spec
    if elems is None:  # a sparse gradient's shape: its indices and its 640 x 64 rows
        return [torch.full((640,), float(rank)), torch.full((640, 64), float(rank))]
    return [torch.full((elems,), float(rank + i), dtype=getattr(torch, dtype))
            for i in range(count)]


def rank_main(rounds: int) -> dict:
    import torch

    import engine_native.torch as hvd
    hvd.init()
    torch.set_num_threads(1)

    def waited(op, ts, name):
        if op == "allgather" and len(ts) == 1:  # the single op, for reference
            return [hvd.allgather(ts[0], name=name)]
        if op == "allgather":
            return hvd.grouped_allgather(ts, name=name)
        return hvd.grouped_allreduce(ts, op=hvd.Sum, name=name)

    def handed_over(op, ts, name):
        if op == "allgather" and len(ts) == 1:
            return [hvd.synchronize(hvd.allgather_async(ts[0], name=name))]
        if op == "allgather":
            return hvd.synchronize(hvd.grouped_allgather_async(ts, name=name))
        return hvd.synchronize(hvd.grouped_allreduce_async(ts, op=hvd.Sum, name=name))

    times = {(spec[0], form): [] for spec in GROUPS for form in ("waited", "handed over")}
    for k in range(rounds):
        for spec in GROUPS:
            ts = _tensors(torch, spec, hvd.rank())
            outs = {}
            # Alternate which form goes first, so neither always runs on a warmer cache.
            forms = [("waited", waited), ("handed over", handed_over)]
            for form, call in (forms if k % 2 == 0 else forms[::-1]):
                hvd.barrier()
                block = []
                for i in range(ITERS):
                    t0 = time.perf_counter()
                    out = call(spec[1], ts, f"{spec[0]}.{form}.{i}")
                    block.append(time.perf_counter() - t0)
                outs[form] = [o.tolist() for o in out]
                times[(spec[0], form)].append(statistics.median(block[ITERS // 10:]))
            if outs["waited"] != outs["handed over"]:
                raise AssertionError(f"{spec[0]}: the two forms' outputs differ")
    hvd.shutdown()
    return times


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", default="2", help="comma list of rank counts (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    args = parser.parse_args(argv)
    print("| np | group | waited | handed over | handed over / waited | per round |")
    print("|---|---|---|---|---|---|")
    # The ranks import rank_main by its module's name, which "__main__" is not.
    import bench_waited_groups
    for np_ranks in [int(x) for x in args.np.split(",") if x]:
        res = run_ranks(bench_waited_groups.rank_main, np_ranks, args=(args.rounds,),
                        timeout=120 + 60 * args.rounds * np_ranks)
        for spec in GROUPS:
            # The slowest rank's median per round (a group ends when its last rank's does).
            per_round = {form: [max(r.value[(spec[0], form)][k] for r in res)
                                for k in range(args.rounds)]
                         for form in ("waited", "handed over")}
            w = statistics.median(per_round["waited"])
            h = statistics.median(per_round["handed over"])
            ratios = " / ".join(f"{b / a:.2f}" for a, b in zip(per_round["waited"],
                                                               per_round["handed over"]))
            print(f"| {np_ranks} | {spec[0]} | {_fmt(w)} | {_fmt(h)} | {h / w:.2f}x | {ratios} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
