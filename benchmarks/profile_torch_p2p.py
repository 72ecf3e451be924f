"""What ``engine_native.torch``'s point-to-point calls cost above the core's own (issue #36: a
pipeline stage pays one send and one receive per micro-batch and direction):

    hvdrun -np 2 python benchmarks/profile_torch_p2p.py [--shape 4,64] [--n 2000] [--cold]

Rank 0 starts ``--n`` isends of one float32 tensor (``raw_isend``, as a pipeline's step does),
rank 1 waits until all were written, then receives each with ``raw_irecv(...).wait()``, so no
call waits for the other rank; then the same with the core's calls alone (``_core.p2p_send``,
``_core.p2p_recv`` + ``_core.wait``: no tensor in, a Buffer out). ``--cold``: before each timed call the rank runs a
pipeline stage's forward and backward (bench_pipeline's hand-off-bound stage, 4 blocks of
Linear(64, 64) + Tanh, one micro-batch of 4 rows), so the call runs with the caches the
compute left, as in a pipeline step. Prints each rank's median and 90th percentile per call.
Not part of run_all: a diagnosis aid whose findings go into RESULTS.md (the pipeline step
itself is bench_pipeline.py's).
"""
import argparse
import time

import torch

import engine_native.torch as hvd
from engine_native import _core
from engine_native.torch.p2p_ops import raw_irecv, raw_isend

FLOAT32 = 7  # the core's dtype code
RECEIVES = {"raw_irecv(...).wait()": lambda i: raw_irecv(0, i, wait_now=True).wait(),
            "core alone": lambda i: _core.wait(_core.p2p_recv(0, i, True))}


def _line(rank: int, what: str, times: list) -> str:
    times = sorted(times)
    return (f"| {rank} | {what} | {times[len(times) // 2] * 1e6:.1f} us | "
            f"{times[int(0.9 * len(times))] * 1e6:.1f} us |")


def _stage_step():
    """A pipeline stage's forward and backward of one micro-batch, or nothing."""
    blocks = []
    for _ in range(4):
        blocks += [torch.nn.Linear(64, 64), torch.nn.Tanh()]
    part, x = torch.nn.Sequential(*blocks), torch.randn(4, 64)

    def step():
        y = part(x.requires_grad_(True))
        y.backward(torch.ones_like(y))
    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4,64")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--cold", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    rank, n = hvd.rank(), a.n
    x = torch.randn(*(int(d) for d in a.shape.split(",")))
    before = _stage_step() if a.cold else (lambda: None)
    rows = []
    for receive in RECEIVES:
        core = receive == "core alone"
        hvd.barrier()
        times = []
        if rank == 0:
            sent = []
            for i in range(n):
                before()
                t0 = time.perf_counter()
                if core:
                    sent.append(_core.p2p_send(1, i, FLOAT32, x.shape, x.data_ptr(), False))
                else:
                    sent.append(raw_isend(x, 1, i))
                times.append(time.perf_counter() - t0)
            for s in sent:
                _core.wait(s) if core else s.wait()
            rows.append(_line(rank, f"{'core alone' if core else 'raw_isend'}: isend call",
                              times))
            hvd.barrier()
        else:
            hvd.barrier()  # every message is written: no receive below waits for rank 0
            for i in range(n):
                before()
                t0 = time.perf_counter()
                RECEIVES[receive](i)
                times.append(time.perf_counter() - t0)
            rows.append(_line(rank, f"{receive}: receive, message there", times))
    hvd.barrier()
    print("\n".join(rows), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
