"""Rank script of benchmarks/bench_multihost_netns.py: a 64 MiB float32 allreduce (sum),
``MH_RUNS`` timed runs after 2 warm-ups, each after a barrier; rank 0 prints one
``MH-BENCH {json}`` line with its time per op."""
import json
import os
import time

import numpy as np

import engine_native as hvd

BYTES = 64 << 20


def main() -> None:
    hvd.init()
    x = np.ones(BYTES // 4, np.float32)
    for _ in range(2):
        out = hvd.allreduce(x, op=hvd.Sum, name="busbw")
    assert np.all(out == hvd.size()), "wrong sum"
    times = []
    for _ in range(int(os.environ.get("MH_RUNS", "7"))):
        hvd.barrier()
        t0 = time.perf_counter()
        hvd.allreduce(x, op=hvd.Sum, name="busbw")
        times.append(time.perf_counter() - t0)
    if hvd.rank() == 0:
        print("MH-BENCH " + json.dumps({"times": times, "size": hvd.size(),
                                        "transports": hvd.metrics()["transports"]}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
