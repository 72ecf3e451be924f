"""Where a point-to-point ping-pong's time goes, on our core only (issue #36's p2p case):

    hvdrun -np 2 python benchmarks/profile_p2p.py --size 16M              # a new array per recv
    hvdrun -np 2 python benchmarks/profile_p2p.py --size 64M --out        # recv(out=buffer)
    hvdrun -np 2 python benchmarks/profile_p2p.py --size 1M --collectives 20

Ranks 0 and 1 ping-pong ``--iters`` times after a warm-up (and ``--collectives`` allreduce +
barrier pairs, as bench_p2p's agreement between sizes does); each rank prints its one-way
min / median, its minor page faults per round trip, how many of its receives into ``out=`` the
core wrote in place (Note [Receive into out]), and the metrics() counters of who moved the
bytes: waits finished by their driving caller, loop wake-ups, spins skipped (Note [Caller
drives], Note [Spin backoff]). Not part of run_all; a diagnosis aid whose findings go into
RESULTS.md (the comparison with MPICH and gloo is bench_p2p's).
"""
import argparse
import resource
import statistics
import time

import numpy as np

import engine_native as hvd
from engine_native import _core, _dtypes

COUNTERS = ("caller_driven_ops", "loop_wakeups", "caller_spin_skipped")


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="16M")
    parser.add_argument("--out", action="store_true", help="receive into one reused buffer")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--collectives", type=int, default=0)
    args = parser.parse_args()
    hvd.init()
    me, other = hvd.rank(), 1 - hvd.rank()
    count = max(1, _size(args.size) // 4)
    buf = np.full(count, 1.0 + me, np.float32)
    back = np.zeros(count, np.float32)
    code = _dtypes.numpy_code(back.dtype, "recv", "back")
    bound = []

    def recv(tag):
        if not args.out:
            return hvd.recv(other, tag)
        buffer, _, _ = _core.wait(_core.p2p_recv(other, tag, True, -1, False, back, code,
                                                 back.shape))
        bound.append(buffer is None)  # None: written into back itself
        return back

    def round_trip():
        if me == 0:
            hvd.send(buf, other, 3)
            recv(4)
        else:
            hvd.send(recv(3), other, 4)

    for _ in range(3):
        round_trip()
    for _ in range(args.collectives):
        hvd.allreduce(np.ones(1), name="profile_p2p")
        hvd.barrier()
    bound.clear()
    before = hvd.metrics()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        round_trip()
        times.append((time.perf_counter() - t0) / 2)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    after = hvd.metrics()
    moved = ", ".join(f"{k} {after[k] - before[k]}" for k in COUNTERS)
    written = f", written in out {sum(bound)} of {len(bound)}" if args.out else ""
    print(f"rank {me}, {args.size} {'out=' if args.out else 'new array'}: one way min "
          f"{min(times) * 1e3:.3f} ms, median {statistics.median(times) * 1e3:.3f} ms; "
          f"{faults / args.iters:.0f} page faults per round trip{written}; {moved}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
