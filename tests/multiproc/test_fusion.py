"""Tensor fusion on spawned ranks: which allreduces share a fused batch, and that fused results
are the same as unfused ones (checked against NumPy).

Covered: dtypes interleaved in submission order (look-ahead fusion keeps one batch per dtype),
HVD_FUSION_THRESHOLD=0 (nothing fuses), a threshold smaller than one tensor (nothing fuses),
a grouped allreduce (one batch), a step's worth of async allreduces under a wide batching
window (one batch: Note [Batching window]), and the numpy API's pooled outputs (Note [Output
pool]: a result still referenced is never handed out again).
"""
import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import Failures
from multiproc.harness import run_ranks

INTERLEAVED = (np.float32, np.float16, np.int32, np.float64)


def _fused_batches(hvd) -> int:
    return hvd.metrics()["fused_batches"]


def _check(hvd, fails, name, dtype, count, out, op, label=None):
    ref = checks.reference(checks.all_inputs(dtype, count, hvd.size(), name), op)
    fails.check(label or name, checks.mismatch(out, ref, dtype, op))


def _submit_all(hvd, cases, count):
    """Async allreduces of `cases` (name, dtype) in order; returns {name: (handle, dtype)}."""
    handles = {}
    for name, dtype in cases:
        x = checks.make_input(dtype, count, hvd.rank(), name)
        handles[name] = (hvd.allreduce_async(x, op=hvd.Sum, name=name), dtype)
    return handles


def interleaved_suite(count):
    """Mixed dtypes submitted interleaved; returns the fused batches the set took."""
    hvd = checks.init("shm")
    fails = Failures()
    cases = [(f"mix.{k}.{np.dtype(d)}", d) for k in range(8) for d in INTERLEAVED]
    hvd.barrier()
    before = _fused_batches(hvd)
    handles = _submit_all(hvd, cases, count)
    for name, (handle, dtype) in handles.items():
        _check(hvd, fails, name, dtype, count, hvd.synchronize(handle), hvd.Sum)
    batches = _fused_batches(hvd) - before
    hvd.shutdown()
    return fails.raise_if_any(), batches


@pytest.mark.parametrize("np_", [2, 3])
def test_interleaved_dtypes_fuse_per_dtype(np_):
    # A window far wider than scheduling noise: every tensor is submitted inside it.
    res = run_ranks(interleaved_suite, np_, env={"HVD_CYCLE_TIME_MS": "500"}, timeout=120,
                    args=(333,))
    batches = {r.value[1] for r in res}
    assert len(batches) == 1, f"ranks disagree on the fused batches: {batches}"
    # One batch per dtype when the whole set lands in one window; never one per tensor.
    assert batches.pop() <= 2 * len(INTERLEAVED)


@pytest.mark.parametrize("threshold", ["0", "1024"], ids=["threshold-0", "below-one-tensor"])
def test_threshold_zero_or_below_one_tensor_never_fuses(threshold):
    # 333 elements: every tensor here is over half of 1024 bytes, so no two fit together.
    res = run_ranks(interleaved_suite, 2, env={"HVD_FUSION_THRESHOLD": threshold},
                    timeout=120, args=(333,))
    assert [r.value[1] for r in res] == [0, 0]


def grouped_suite():
    hvd = checks.init("shm")
    fails = Failures()
    arrays = [checks.make_input(np.float32, 100 + i, hvd.rank(), f"grp.{i}") for i in range(6)]
    hvd.barrier()
    before = _fused_batches(hvd)
    outs = hvd.grouped_allreduce(arrays, op=hvd.Sum, name="grp")
    batches = _fused_batches(hvd) - before
    for i, out in enumerate(outs):
        _check(hvd, fails, f"grp.{i}", np.float32, 100 + i, out, hvd.Sum)
    hvd.shutdown()
    return fails.raise_if_any(), batches


def test_grouped_allreduce_is_one_fused_batch():
    res = run_ranks(grouped_suite, 3, timeout=120)
    assert [r.value[1] for r in res] == [1, 1, 1]


def step_suite(steps):
    """Each step submits 64 async allreduces, then waits (a training step's gradients)."""
    hvd = checks.init("shm")
    fails = Failures()
    per_step = []
    for step in range(steps):
        cases = [(f"step.grad.{i}", np.float32) for i in range(64)]
        before = _fused_batches(hvd)
        handles = _submit_all(hvd, cases, 1024)
        for name, (handle, dtype) in handles.items():
            _check(hvd, fails, name, dtype, 1024, hvd.synchronize(handle), hvd.Sum,
                   label=f"{name}@{step}")
        per_step.append(_fused_batches(hvd) - before)
    hvd.shutdown()
    return fails.raise_if_any(), per_step


def test_a_repeated_step_is_one_fused_batch():
    # The first step may be cut where ranks happen to be in lockstep; once rank 0 has seen a
    # step, the same step is held until complete (Note [Batching window]).
    res = run_ranks(step_suite, 2, env={"HVD_CYCLE_TIME_MS": "500"}, timeout=120, args=(4,))
    per_step = [r.value[1] for r in res]
    assert per_step[0] == per_step[1], per_step
    assert per_step[0][1:] == [1, 1, 1], per_step


def sequential_suite(rounds):
    """Blocking allreduces under alternating names (a loss, then an accuracy): never fused,
    never held for the other name (each would wait out the window: Note [Batching window])."""
    hvd = checks.init("shm")
    fails = Failures()
    before = _fused_batches(hvd)
    for k in range(rounds):
        for name in ("seq.loss", "seq.accuracy"):
            out = hvd.allreduce(np.full(3, hvd.rank() + k, np.float64), op=hvd.Sum, name=name)
            expected = sum(r + k for r in range(hvd.size()))
            fails.expect(f"{name}@{k}", np.array_equal(out, np.full(3, expected, np.float64)))
    batches = _fused_batches(hvd) - before
    hvd.shutdown()
    return fails.raise_if_any(), batches


def test_sequential_ops_are_never_held_for_each_other():
    # A wrong hold costs a 2 s window per op: 80 ops would run far past the hard timeout.
    res = run_ranks(sequential_suite, 2, env={"HVD_CYCLE_TIME_MS": "2000"}, timeout=60,
                    args=(40,))
    assert [r.value[1] for r in res] == [0, 0]


def reused_names_suite(rounds):
    """A step of two async allreduces (a loss and an accuracy, waited together), then the same
    names as blocking allreduces one at a time (an evaluation): each of those goes at once,
    not held for the other name of the step (which its caller submits only after it)."""
    hvd = checks.init("shm")
    fails = Failures()
    for k in range(rounds):
        for step in range(2):
            handles = [hvd.allreduce_async(np.full(3, hvd.rank() + k, np.float64), op=hvd.Sum,
                                           name=name) for name in ("reuse.loss", "reuse.acc")]
            for name, handle in zip(("reuse.loss", "reuse.acc"), handles):
                fails.expect(f"{name}@{k}.{step}", hvd.synchronize(handle)[0] == 2 * k + 1)
        for name in ("reuse.loss", "reuse.acc"):
            out = hvd.allreduce(np.full(3, hvd.rank() + k, np.float64), op=hvd.Sum, name=name)
            fails.expect(f"{name}@{k} alone", out[0] == 2 * k + 1)
    hvd.shutdown()
    return fails.raise_if_any(), 0


def test_a_step_s_names_reused_one_at_a_time_are_not_held():
    # Held for the missing name, each lone op would wait out the cap (5 cycles = 10 s): 8 of
    # them would run far past the hard timeout.
    run_ranks(reused_names_suite, 2, env={"HVD_CYCLE_TIME_MS": "2000"}, timeout=40, args=(8,))


def pool_suite():
    """Large numpy results come from a pool: never one the caller still holds."""
    hvd = checks.init("shm")
    fails = Failures()
    count = (3 << 20) // 4  # 3 MiB of float32: pooled
    x = checks.make_input(np.float32, count, hvd.rank(), "pool")
    first = hvd.allreduce(x, op=hvd.Sum, name="pool.a")
    kept = first.copy()
    view = hvd.allreduce(x, op=hvd.Sum, name="pool.b")[10:20]  # only a view survives
    second = hvd.allreduce(x * 2, op=hvd.Sum, name="pool.c")
    fails.expect("held result untouched", np.array_equal(first, kept))
    fails.expect("distinct arrays", not np.shares_memory(first, second)
                 and not np.shares_memory(view, second))
    fails.expect("view untouched", np.array_equal(view, kept[10:20]))
    _check(hvd, fails, "pool", np.float32, count, first, hvd.Sum, label="pool.a")
    del first
    for k in range(3):  # a loop dropping each result reuses the freed array
        out = hvd.allreduce(x, op=hvd.Sum, name=f"pool.loop.{k}")
        fails.expect(f"loop {k}", np.array_equal(out, kept))
        del out
    hvd.shutdown()
    return fails.raise_if_any(), 0


def test_pooled_outputs_never_alias_a_live_result():
    run_ranks(pool_suite, 2, timeout=120)
