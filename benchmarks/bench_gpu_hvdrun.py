"""The rank script of issue #19's end-to-end check: ranks that ``hvdrun`` starts on one GPU
get its default MPS daemon (Note [MPS by default] in hvd_magic/launch/mps.py) and are
measured there, ours and DDP-gloo in the same ranks:

    python -m hvd_magic.launch.hvdrun -np 2 python benchmarks/bench_gpu_hvdrun.py \
        [--timeline rank0-step-timeline.json]

Each rank prints one line ``BENCH {json}``: its GPU path, the MPS pipe directory its CUDA
uses ("" without MPS), the 4 B allreduce median, and the CNN step median for ours and for
DDP with gloo (bench_gpu_ranks.py's rank bodies; the step is bench_gpu's CNN, batch 64).
``--timeline``: rank 0 writes the core's timeline of ours' step run there (not timed apart).
Needs a CUDA GPU; prints, never asserts.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpu_ranks  # after the path above


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=1000, help="4 B allreduces timed")
    parser.add_argument("--steps", type=int, default=40, help="CNN steps timed per system")
    parser.add_argument("--ddp-port", type=int, default=29533, help="torch.distributed's port")
    parser.add_argument("--timeline", help="rank 0's timeline of ours' step run")
    args = parser.parse_args()
    rank, size = int(os.environ["HVD_RANK"]), int(os.environ["HVD_SIZE"])
    if args.timeline:
        os.environ["HVD_TIMELINE"] = args.timeline
    ours = bench_gpu_ranks.rank_step("ours", rank, size, None, args.steps, 64)
    os.environ.pop("HVD_TIMELINE", None)
    latency = bench_gpu_ranks.rank_latency("ours", rank, size, None, args.iters)
    ddp = bench_gpu_ranks.rank_step("ddp", rank, size, args.ddp_port, args.steps, 64)
    print("BENCH " + json.dumps({
        "rank": rank, "path": latency["path"],  # what metrics() names mps_pipe_directory:
        "mps_pipe_directory": os.environ.get("CUDA_MPS_PIPE_DIRECTORY", ""),
        "latency_4B_us": round(statistics.median(latency["waited"]) * 1e6, 1),
        "step_ours_ms": round(statistics.median(ours["times"]) * 1e3, 3),
        "step_ddp_gloo_ms": round(statistics.median(ddp["times"]) * 1e3, 3)}), flush=True)


if __name__ == "__main__":
    main()
