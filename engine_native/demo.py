"""Collectives demo: ``python -m engine_native.demo [-np N]``.

Starts N local ranks with the rendezvous bootstrap, runs each collective once, checks it
against numpy and prints one line per check plus the 4-byte allreduce latency.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time

import numpy as np


def rank_main() -> None:
    import engine_native as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    checks = []
    x = np.arange(6, dtype=np.float32) + r
    checks.append(("allreduce Sum", hvd.allreduce(x, op=hvd.Sum, name="x"),
                   sum(np.arange(6, dtype=np.float32) + q for q in range(n))))
    checks.append(("allreduce Average", hvd.allreduce(x, name="xa"),
                   np.arange(6, dtype=np.float32) + (n - 1) / 2))
    g = hvd.allgather(np.full((r + 1, 2), r, dtype=np.int64), name="g")
    checks.append(("allgather", g, np.concatenate([np.full((q + 1, 2), q) for q in range(n)])))
    b = hvd.broadcast(np.full(3, r, dtype=np.int32), root_rank=n - 1, name="b")
    checks.append(("broadcast", b, np.full(3, n - 1)))
    a, splits = hvd.alltoall(np.full((n, 1), r, dtype=np.int16), name="a")
    checks.append(("alltoall", a.ravel(), np.arange(n)))
    hvd.barrier()
    small = np.ones(1, dtype=np.float32)
    hvd.allreduce(small, name="warm")
    t0 = time.perf_counter()
    for i in range(200):
        hvd.allreduce(small, op=hvd.Sum, name="lat")
    latency_us = (time.perf_counter() - t0) / 200 * 1e6
    if r == 0:
        for what, got, want in checks:
            ok = np.array_equal(np.asarray(got), np.asarray(want))
            print(f"{what:<18} {'ok' if ok else 'WRONG'}  {np.asarray(got).ravel()[:6]}")
        print(f"4-byte allreduce latency at np={n}: {latency_us:.1f} us "
              f"(transports {hvd.metrics()['transports']})")
    hvd.shutdown()


def launch(np_ranks: int) -> int:
    from engine_native.rendezvous import RendezvousServer

    secret = secrets.token_bytes(32)
    with RendezvousServer(secret) as server:
        host, port = server.address
        procs = []
        for rank in range(np_ranks):
            env = dict(os.environ, HVD_RANK=str(rank), HVD_SIZE=str(np_ranks),
                       HVD_RENDEZVOUS=f"{host}:{port}", HVD_SECRET=secret.hex(),
                       HVD_JOB_ID=f"demo{os.getpid()}")
            procs.append(subprocess.Popen([sys.executable, "-m", "engine_native.demo",
                                           "--rank-main"], env=env))
        codes = [p.wait(timeout=120) for p in procs]
    return max(codes)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-np", type=int, default=2)
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        rank_main()
    else:
        sys.exit(launch(args.np))
