"""Pipeline training step, np=2 (issue #36, "against the peer"): the same MLP split in two
stages, trained with GPipe and 1F1B by ``engine_native.torch.pipelining`` (under ``hvdrun``)
and by ``torch.distributed.pipelining`` on gloo (under ``torchrun``), in the same run.

    python benchmarks/bench_pipeline.py [--steps 20] [--launches 3]

Cases (the issue's): an 8-block MLP of hidden 1024, batch 64, 8 micro-batches (compute-bound);
the same MLP at hidden 64, 16 micro-batches (bound by the hand-offs). A block is
Linear(h, h) + Tanh; each stage holds 4 blocks. Step time: the median of ``--steps`` steps
after 3 warm-up steps, the slowest rank's; each launch is one process pair per system and
schedule, and a launch that runs past ``--timeout`` counts as a hang. Prints one table: the
median over launches and ours / torch (time; < 1: ours faster).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CASES = [("hidden 1024, batch 64, 8 micro-batches", 1024, 64, 8),
         ("hidden 64, batch 64, 16 micro-batches", 64, 64, 16)]
SCHEDULES = ("gpipe", "1f1b")


def rank_main(system: str, hidden: int, batch: int, micro: int, schedule: str,
              steps: int, out_dir: str) -> None:
    import torch
    torch.set_num_threads(1)
    if system == "ours":
        import engine_native.torch as hvd
        from engine_native.torch import pipelining as pp
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        make_stage = lambda mod: pp.PipelineStage(mod, rank, size)
        barrier = hvd.barrier
    else:
        import torch.distributed as dist
        from torch.distributed import pipelining as pp
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        make_stage = lambda mod: pp.PipelineStage(mod, rank, size, torch.device("cpu"))
        barrier = dist.barrier
    torch.manual_seed(0)
    blocks = []
    for _ in range(8):
        blocks += [torch.nn.Linear(hidden, hidden), torch.nn.Tanh()]
    per = len(blocks) // size
    part = torch.nn.Sequential(*blocks[rank * per:(rank + 1) * per])
    cls = pp.ScheduleGPipe if schedule == "gpipe" else pp.Schedule1F1B
    last = rank == size - 1
    # every rank passes loss_fn: torch's schedules run forward only on a rank without one
    sched = cls(make_stage(part), micro, loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD(part.parameters(), lr=1e-3)
    x, y = torch.randn(batch, hidden), torch.randn(batch, hidden)
    times = []
    for i in range(3 + steps):
        barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        if rank == 0:
            sched.step(x)
        elif last:
            sched.step(target=y, losses=[])
        else:
            sched.step()
        opt.step()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:  # (torchrun mixes stdouts)
        json.dump(times, f)


def launch(system: str, case, schedule: str, steps: int, timeout: float):
    _, hidden, batch, micro = case
    here = os.path.abspath(__file__)
    out_dir = tempfile.mkdtemp(prefix="bench_pipeline_")
    args = [here, "--rank-main", system, str(hidden), str(batch), str(micro), schedule,
            str(steps), out_dir]
    if system == "ours":
        cmd = ["hvdrun", "-np", "2", sys.executable] + args
    else:
        cmd = ["torchrun", "--nproc-per-node", "2", "--master-port", "29517",
               "--log-dir", "/tmp/bench_pipeline_torchrun"] + args
    try:
        subprocess.run(cmd, check=False, capture_output=True, timeout=timeout,
                       start_new_session=True)
        per_rank = []
        for rank in range(2):
            with open(os.path.join(out_dir, f"{rank}.json")) as f:
                per_rank.append(json.load(f))
    except (subprocess.TimeoutExpired, OSError):  # hung, or a rank wrote no result
        return None
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    slowest = [max(pair) for pair in zip(*per_rank)]
    return statistics.median(slowest)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        s, h, b, m, sched, steps, out_dir = sys.argv[2:9]
        rank_main(s, int(h), int(b), int(m), sched, int(steps), out_dir)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    rows = []
    for case in CASES:
        for schedule in SCHEDULES:
            got = {"ours": [], "torch": []}
            hangs = {"ours": 0, "torch": 0}
            for i in range(a.launches):
                order = ("ours", "torch") if i % 2 == 0 else ("torch", "ours")
                for system in order:
                    t = launch(system, case, schedule, a.steps, a.timeout)
                    if t is None:
                        hangs[system] += 1
                    else:
                        got[system].append(t)
            ours = statistics.median(got["ours"]) if got["ours"] else None
            peer = statistics.median(got["torch"]) if got["torch"] else None
            ratio = f"{ours / peer:.2f}x" if ours and peer else "-"
            fmt = lambda t: f"{t * 1e3:.1f} ms" if t else "-"
            rows.append(f"| {case[0]} | {schedule} | {fmt(ours)} | {fmt(peer)} | {ratio} | "
                        f"{hangs['ours']} / {hangs['torch']} |")
    print("| case | schedule | ours (step) | torch.distributed.pipelining, gloo | ours / torch "
          "| launches failed or hung: ours / torch |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
