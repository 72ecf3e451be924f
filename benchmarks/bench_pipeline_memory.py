"""What each pipeline stage keeps from its forwards to its backwards, counted (issue #36,
"Memory"), and what counting it and checking the ranks' arguments cost.

    python benchmarks/bench_pipeline_memory.py [--steps 40]

Two ranks, one stage each: 4 blocks of Linear(512, 512) + tanh (float32), a batch of 256 rows
in M = 8 micro-batches (32 rows, 64 KiB a 32 x 512 tensor). For GPipe and 1F1B, with and
without ``checkpoint=True``, one training step with ``schedule.count_kept = True`` gives per
stage the micro-batches held at once (``peak_activations``) and the tensors and bytes kept at
the peak (``peak_kept``; engine_native/torch/pipelining/kept.py), printed as a Markdown table.

Then the cost: 1F1B steps without re-materialisation, alternating count_kept off and on
(``--steps`` of each after 5 warm-up steps), median and fastest (a step as slow as its
slowest rank); one micro-batch's forward alone, best of 200: the module called directly (what
the step called before counting existed), ``stage.forward`` (what it calls with count_kept
off) and counted; and the ranks' argument check (one allgather before a schedule's first
step), timed on its own. Timings only; the counts are asserted by
tests/multiproc/test_pipelining.py.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spawned_ranks import run_ranks, step_stats  # noqa: E402

WIDTH, BLOCKS, ROWS, M = 512, 4, 256, 8


def _stage_module(rank: int):
    import torch
    torch.manual_seed(rank)
    layers = []
    for _ in range(BLOCKS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def rank_main(rank: int, steps: int):
    import torch

    import engine_native.torch as hvd
    from engine_native.torch.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    torch.set_num_threads(1)
    hvd.init()
    k = hvd.size()
    x = torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(1))
    y = torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(2))
    module = _stage_module(rank)

    def make(cls, checkpoint):
        return cls(PipelineStage(module, rank, k, checkpoint=checkpoint), M,
                   loss_fn=torch.nn.functional.mse_loss)

    def step(schedule):
        module.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)

    rows = []
    for cls in (ScheduleGPipe, Schedule1F1B):
        for checkpoint in (False, True):
            schedule = make(cls, checkpoint)
            schedule.count_kept = True
            step(schedule)
            kept = schedule.peak_kept[rank]
            rows.append((rank, cls.__name__, checkpoint, schedule.peak_activations,
                         kept.tensors, kept.bytes))

    forwards = _per_forward(PipelineStage(module, rank, k), x[:ROWS // M])
    schedule = make(Schedule1F1B, False)
    for _ in range(5):
        step(schedule)
    times = {False: [], True: []}
    for i in range(2 * steps):
        schedule.count_kept = bool(i % 2)
        hvd.barrier()  # (every step starts together: a step's time is its own)
        t0 = time.perf_counter()
        step(schedule)
        times[schedule.count_kept].append(time.perf_counter() - t0)
    checks = []
    for _ in range(20):
        hvd.barrier()
        t0 = time.perf_counter()
        schedule._agree(None)
        checks.append(time.perf_counter() - t0)
    hvd.shutdown()
    return rows, times, statistics.median(checks), forwards


def _per_forward(stage, x, n: int = 200) -> tuple:
    """Best-of-``n`` seconds of one micro-batch's forward through the stage: its module called
    directly (the step before counting existed), ``stage.forward`` (the step now, count_kept
    off) and the counted forward (count_kept on)."""
    from engine_native.torch.pipelining.kept import KeptCounter
    counter = KeptCounter({stage.stage_index: stage})

    def best(call) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        return min(times)

    def counted():
        counter.forward(stage.stage_index, 0, stage.forward, x)
        counter.backward(stage.stage_index, 0)
    return best(lambda: stage.submod(x)), best(lambda: stage.forward(x)), best(counted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    results = run_ranks(rank_main, 2, args=(args.steps,), timeout=600)
    print(f"2 ranks, a stage of {BLOCKS} x (Linear({WIDTH}, {WIDTH}) + tanh) float32 each, "
          f"batch {ROWS} rows, M = {M} (a micro-batch's {ROWS // M} x {WIDTH} tensor: "
          f"{ROWS // M * WIDTH * 4 // 1024} KiB)\n")
    print("| stage | schedule | checkpoint | micro-batches held at peak | tensors kept at peak "
          "| bytes kept at peak | per micro-batch |")
    print("|---|---|---|---|---|---|---|")  # (a sending stage's peak: its newest output too)
    rows = sorted((row for rows, _, _, _ in results for row in rows),
                  key=lambda r: (r[1] != "ScheduleGPipe", r[0], r[2]))
    for stage, name, checkpoint, held, tensors, nbytes in rows:
        print(f"| {stage} | {name} | {'on' if checkpoint else 'off'} | {held} | {tensors} | "
              f"{nbytes / 1024:.0f} KiB | {tensors / held:.3g} tensors, "
              f"{nbytes / held / 1024:.0f} KiB |")
    print()
    for counting in (False, True):
        median, p90, fastest = step_stats([times[counting] for _, times, _, _ in results])
        print(f"1F1B step, count_kept {'on ' if counting else 'off'}: median "
              f"{median * 1e3:.2f} ms, p90 {p90 * 1e3:.2f} ms, fastest {fastest * 1e3:.2f} ms "
              f"({args.steps} steps)")
    check = max(c for _, _, c, _ in results)
    for rank, (_, _, _, (module, plain, counted)) in enumerate(results):
        print(f"rank {rank}, one micro-batch's forward (best of 200): the module "
              f"{module * 1e6:.1f} us, stage.forward (count_kept off) {plain * 1e6:.1f} us, "
              f"counted {counted * 1e6:.1f} us")
    print(f"the ranks' argument check (one allgather, once per schedule): {check * 1e6:.0f} us "
          "(median of 20, slowest rank)")


if __name__ == "__main__":
    main()
