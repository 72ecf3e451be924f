"""What recording a pipeline step for the dashboard's strip costs (issue #36).

    python benchmarks/bench_pipeline_strip.py

One process, one rank holding both stages of an interleaved 1F1B schedule (no messages: the
recording is per forward and backward, so what is measured is the same on any rank). Prints:

- per action: the step's timing of a forward or backward before the strip (two clock reads)
  and with it (the same, plus a tuple appended), best of 5 x 1e6;
- per step: ``last_step.record`` on the training thread, and ``last_step.latest`` (the
  publisher thread's conversion, once per step it sends) at 16 and 256 actions;
- a whole training step (2 stages of a 64 x 64 layer and tanh) for scale, median of 50.

Timings only; nothing is asserted.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
import timeit

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo
import engine_native.torch as hvd  # noqa: E402
from engine_native.pipeline import last_step  # noqa: E402
from engine_native.pipeline.schedule import Action  # noqa: E402
from engine_native.torch.pipelining import PipelineStage, ScheduleInterleaved1F1B  # noqa: E402


def per_action() -> float:
    env = {"pc": time.perf_counter, "a": Action("F", 0, 0)}
    n = 1_000_000
    before = min(timeit.repeat("t0 = pc(); busy = 0.0; busy += pc() - t0", globals=env,
                               number=n, repeat=5)) / n
    after = min(timeit.repeat("t0 = pc(); busy = 0.0; t1 = pc(); busy += t1 - t0; "
                              "s.append((a, t0, t1))", setup="s = []", globals=env,
                              number=n, repeat=5)) / n
    print(f"per action: {before * 1e9:.0f} ns before, {after * 1e9:.0f} ns with the strip "
          f"(+{(after - before) * 1e9:.0f} ns)")
    return after - before


def per_step() -> None:
    for n in (16, 256):
        spans = [(Action("FB"[i % 2], 0, i // 2), 1.0 + i, 1.5 + i) for i in range(n)]

        def record():
            last_step.record(spans, 1.0, 2.0 + n, 0.1, 0.1, "1f1b")

        def convert():
            record()
            last_step.latest()
        rec = min(timeit.repeat(record, number=100_000, repeat=5)) / 100_000
        both = min(timeit.repeat(convert, number=2_000, repeat=5)) / 2_000
        print(f"{n} actions: record() {rec * 1e9:.0f} ns on the training thread, latest() "
              f"{(both - rec) * 1e6:.1f} us on the publisher thread")


def whole_step(added: float) -> None:
    torch.manual_seed(0)
    for m in (8, 64):
        stages = [PipelineStage(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh()),
                                i, 2) for i in range(2)]
        schedule = ScheduleInterleaved1F1B(stages, m, loss_fn=torch.nn.functional.mse_loss)
        x = torch.randn(4 * m, 64)
        times = []
        for i in range(55):
            t = time.perf_counter()
            schedule.step(x, target=x)
            if i >= 5:
                times.append(time.perf_counter() - t)
        step = statistics.median(times)
        actions = 4 * m  # a forward and a backward per micro-batch and stage
        print(f"step of M = {m} ({actions} actions): {step * 1e3:.2f} ms; the strip adds "
              f"{actions * added * 1e6:.1f} us ({actions * added / step:.3%})")


if __name__ == "__main__":
    hvd.init()
    try:
        whole_step(per_action())
        per_step()
    finally:
        hvd.shutdown()
