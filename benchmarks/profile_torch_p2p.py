"""What ``engine_native.torch``'s point-to-point calls cost above the core's own (issue #36: a
pipeline stage pays one send and one receive per micro-batch and direction):

    hvdrun -np 2 python benchmarks/profile_torch_p2p.py [--shape 4,64] [--n 2000]

Rank 0 starts ``--n`` isends of one float32 tensor (``raw_isend``, as a pipeline's step does),
rank 1 waits until all were written, then receives each with ``raw_irecv(...).wait()``, so no
call waits for the other rank; then the same with the core's calls alone (``_core.p2p_send``,
``_core.p2p_recv`` + ``_core.wait``: no tensor in, a Buffer out). Prints each rank's median
and 90th percentile per call. Not part of run_all: a diagnosis aid whose findings go into
RESULTS.md (the pipeline step itself is bench_pipeline.py's).
"""
import argparse
import time

import torch

import engine_native.torch as hvd
from engine_native import _core
from engine_native.torch.p2p_ops import raw_irecv, raw_isend

FLOAT32 = 7  # the core's dtype code


def _line(rank: int, what: str, times: list) -> str:
    times = sorted(times)
    return (f"| {rank} | {what} | {times[len(times) // 2] * 1e6:.1f} us | "
            f"{times[int(0.9 * len(times))] * 1e6:.1f} us |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4,64")
    ap.add_argument("--n", type=int, default=2000)
    a = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    rank, n = hvd.rank(), a.n
    x = torch.randn(*(int(d) for d in a.shape.split(",")))
    rows = []
    for binding in ("engine_native.torch", "core alone"):
        hvd.barrier()
        times = []
        if rank == 0:
            sent = []
            for i in range(n):
                t0 = time.perf_counter()
                if binding == "core alone":
                    sent.append(_core.p2p_send(1, i, FLOAT32, x.shape, x.data_ptr(), False))
                else:
                    sent.append(raw_isend(x, 1, i))
                times.append(time.perf_counter() - t0)
            for s in sent:
                _core.wait(s) if binding == "core alone" else s.wait()
            rows.append(_line(rank, f"{binding}: isend call", times))
            hvd.barrier()
        else:
            hvd.barrier()  # every message is written: no receive below waits for rank 0
            for i in range(n):
                t0 = time.perf_counter()
                if binding == "core alone":
                    _core.wait(_core.p2p_recv(0, i, True))
                else:
                    raw_irecv(0, i, wait_now=True).wait()
                times.append(time.perf_counter() - t0)
            rows.append(_line(rank, f"{binding}: irecv + wait, message there", times))
    hvd.barrier()
    print("\n".join(rows), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
