"""Negotiation state across steps on spawned ranks: the request/response caches and the key
table (coord/key_table.h) whose unreferenced names the loop sweeps.

Covered: caching off (HVD_CACHE_CAPACITY=0) and a cache smaller than a step (every step
evicts), with a name whose shape changes between steps; thousands of unnamed broadcasts,
enough for several sweeps of the key table, between repeats of a named allreduce step, which
must keep fusing into one batch (the step memory survives the sweeps; broadcasts are not
allreduce steps, so the named step still follows itself) and keep giving NumPy's results.
"""
import time

import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import Failures
from multiproc.harness import run_ranks

COUNT = 257


def _step(hvd, fails, names, count, tag):
    handles = {}
    for name in names:
        x = checks.make_input(np.float32, count, hvd.rank(), name)
        handles[name] = hvd.allreduce_async(x, op=hvd.Sum, name=name)
    for name, handle in handles.items():
        ref = checks.reference(checks.all_inputs(np.float32, count, hvd.size(), name), hvd.Sum)
        fails.check(f"{tag}:{name}", checks.mismatch(hvd.synchronize(handle), ref, np.float32))


def repeated_steps_suite(steps):
    """The same 10 names every step; the last step changes one name's shape."""
    hvd = checks.init("shm")
    fails = Failures()
    names = [f"cache.{i}" for i in range(10)]
    for s in range(steps):
        _step(hvd, fails, names, COUNT, f"step {s}")
    _step(hvd, fails, names[:1], COUNT + 3, "new shape")
    _step(hvd, fails, names, COUNT, "after")
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("capacity", ["0", "4"], ids=["cache-off", "cache-smaller-than-a-step"])
@pytest.mark.parametrize("np_", [2, 3])
def test_repeated_steps_with_small_or_no_cache(np_, capacity):
    run_ranks(repeated_steps_suite, np_, args=(6,), timeout=120,
              env={"HVD_CACHE_CAPACITY": capacity})


def sweep_suite(unnamed):
    """A named allreduce step twice, then many unnamed broadcasts (key sweeps), then the step
    paced in lockstep; returns the fused batches of each named step."""
    hvd = checks.init("shm")
    fails = Failures()
    names = [f"swept.{i}" for i in range(16)]
    batches = []

    def step(tag, pace_every=0):
        hvd.barrier()
        before = hvd.metrics()["fused_batches"]
        handles = {}
        for i, name in enumerate(names):
            x = checks.make_input(np.float32, COUNT, hvd.rank(), name)
            handles[name] = hvd.allreduce_async(x, op=hvd.Sum, name=name)
            if pace_every and (i + 1) % pace_every == 0:
                time.sleep(0.01)
        for name, handle in handles.items():
            ref = checks.reference(checks.all_inputs(np.float32, COUNT, hvd.size(), name),
                                   hvd.Sum)
            fails.check(f"{tag}:{name}", checks.mismatch(hvd.synchronize(handle), ref,
                                                         np.float32))
        batches.append(hvd.metrics()["fused_batches"] - before)

    step("first")
    step("second")  # rank 0 has now seen the whole step together
    mine = np.full(3, hvd.rank(), np.float32)
    for _ in range(unnamed):
        out = hvd.broadcast(mine, root_rank=hvd.size() - 1)  # a fresh noname key each time
    fails.expect("unnamed broadcasts", bool(np.all(out == hvd.size() - 1)), f"{out}")
    # Paced in lockstep, every 4 tensors are complete before the next 4 come: only the memory
    # of the previous step keeps the window open (Note [Batching window]), and that memory
    # must outlive the sweeps the broadcasts caused.
    step("paced", pace_every=4)
    hvd.shutdown()
    return fails.raise_if_any(), batches


def test_key_sweeps_keep_results_and_step_memory():
    # 6000 unnamed broadcasts: the key table sweeps after every ~4096 new names.
    res = run_ranks(sweep_suite, 2, args=(6000,), timeout=240,
                    env={"HVD_CYCLE_TIME_MS": "500"})
    batches = [r.value[1] for r in res]
    assert batches[0] == batches[1], f"ranks disagree on the fused batches: {batches}"
    assert batches[0][1:] == [1, 1], batches  # the first step may be cut; then one batch
