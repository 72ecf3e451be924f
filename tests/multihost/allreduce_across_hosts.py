"""The rank script of tests/multihost/test_hvdrun_hosts.py: run by ``hvdrun -np 4 -H a:2,b:2``
across network-namespace hosts (one process per rank, started through mpiexec + ssh).

Prints, per rank, tagged lines the test parses:

- ``MH-TOPOLOGY {json}``: rank, size, local/cross rank and size, the core's transport to each
  peer, and which host's address this process can bind (proof of the network stack it runs
  in: a host's address exists only in its own namespace);
- ``MH-BUSBW {json}``: a 64 MiB float32 allreduce, best of a few timed runs, as bus bandwidth
  (2 (n-1)/n x bytes / time, NCCL-tests' definition);
- ``MH-SUITE ok``: the multiproc allreduce correctness suite (every dtype x op x size, large,
  scaled, async, grouped; tests/multiproc/test_allreduce.py) passed here; it raises otherwise.

Environment: ``MH_HOSTS`` (host of each rank, "a,a,b,b"), ``MH_ADDRESSES`` ("a=10.231.0.1,...").
"""
import json
import os
import socket
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)

import numpy as np

import engine_native as hvd

BUSBW_BYTES = 64 << 20
BUSBW_RUNS = 5


def _can_bind(address: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((address, 0))
            return True
        except OSError:
            return False


def topology() -> dict:
    addresses = dict(item.split("=") for item in os.environ["MH_ADDRESSES"].split(","))
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
            "cross_size": hvd.cross_size(), "transports": hvd.metrics()["transports"],
            "bindable": sorted(h for h, a in addresses.items() if _can_bind(a))}


def busbw() -> dict:
    x = np.ones(BUSBW_BYTES // 4, np.float32)
    for _ in range(2):
        out = hvd.allreduce(x, op=hvd.Sum, name="busbw")
    assert np.all(out == hvd.size()), "64 MiB allreduce gave a wrong sum"
    best = float("inf")
    for _ in range(BUSBW_RUNS):
        hvd.barrier()
        t0 = time.perf_counter()
        hvd.allreduce(x, op=hvd.Sum, name="busbw")
        best = min(best, time.perf_counter() - t0)
    n = hvd.size()
    return {"seconds": best, "busbw_gbs": 2 * (n - 1) / n * BUSBW_BYTES / best / 1e9}


def main() -> None:
    hvd.init()
    print("MH-TOPOLOGY " + json.dumps(topology()), flush=True)
    print("MH-BUSBW " + json.dumps(busbw()), flush=True)
    hvd.shutdown()
    from multiproc.test_allreduce import allreduce_suite

    allreduce_suite("mixed")  # "mixed": shm and tcp peers, no single transport to assert
    print("MH-SUITE ok", flush=True)


if __name__ == "__main__":
    main()
