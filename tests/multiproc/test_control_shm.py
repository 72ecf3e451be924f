"""Negotiation between ranks of one host goes through shared memory (Note [Control over shm]
in engine_native/csrc/transport/shm/ring_stream.cc), on spawned ranks.

Covered: which road each control channel takes (shm on one host, tcp across hosts: mixed
hosts use both at once); request and response lists far larger than the 64 KiB control ring,
sent both ways at the same moment (written in pieces, each side draining its own ring while
it waits for room); a loop thread asleep in poll() is woken by a frame in its ring, both
ways (a lost wake would cost the 200 ms tick on every op). That every other op negotiates
correctly over the rings is what the rest of tests/multiproc checks (checks.init asserts the
control road of every shm and tcp world).
"""
import statistics
import time

import numpy as np

from multiproc import checks
from multiproc.checks import Failures
from multiproc.harness import run_ranks

# 2500 names of ~90 bytes: each worker's request list and rank 0's response list are over
# 200 KiB, three times the control ring.
MANY = 2500


def many_names_suite():
    import engine_native as hvd

    hvd.init()
    fails = Failures()
    prefix = "a-long-tensor-name-so-that-the-negotiation-frames-outgrow-the-control-ring."
    for round_ in range(2):
        handles = [hvd.allreduce_async(np.full(2, hvd.rank() + i, np.float32), op=hvd.Sum,
                                       name=f"{prefix}{round_}.{i}") for i in range(MANY)]
        for i, h in enumerate(handles):
            out = hvd.synchronize(h)
            want = sum(r + i for r in range(hvd.size()))
            if not np.all(out == want):
                fails.check(f"round {round_} tensor {i}", f"{out} != {want}")
                break
    controls = hvd.metrics()["control_transports"]
    hvd.shutdown()
    return fails.raise_if_any(), controls


def test_frames_larger_than_the_ring_both_ways():
    res = run_ranks(many_names_suite, 3, timeout=240)
    assert [r.value[1] for r in res] == [["none", "shm", "shm"], ["shm", "none", "none"],
                                         ["shm", "none", "none"]]


def test_mixed_hosts_use_shm_and_tcp_side_by_side():
    res = run_ranks(many_names_suite, 3, timeout=240, hosts=["a", "a", "b"])
    assert [r.value[1] for r in res] == [["none", "shm", "tcp"], ["shm", "none", "none"],
                                         ["tcp", "none", "none"]]


ROUNDS = 12
LATE_S = 0.05


def sleeping_loop_suite(late_rank: int):
    """The other rank submits first, so its loop thread is asleep in poll() when the late
    rank's frame arrives. Async ops: no caller drives them (Note [Caller drives] E)."""
    hvd = checks.init("shm")
    latencies = []
    for i in range(ROUNDS):
        hvd.barrier()
        if hvd.rank() == late_rank:
            time.sleep(LATE_S)
        t0 = time.perf_counter()
        out = hvd.synchronize(hvd.allreduce_async(np.ones(1, np.float32), op=hvd.Sum,
                                                  name=f"late.{i}"))
        if hvd.rank() == late_rank:
            latencies.append(time.perf_counter() - t0)
        assert out[0] == hvd.size(), out
    hvd.shutdown()
    return latencies


def test_a_sleeping_loop_is_woken_by_its_ring():
    # Late worker: its request wakes rank 0 and rank 0's response wakes the worker. Late rank
    # 0: the worker's request is waiting, and rank 0's response wakes the worker's loop.
    # A woken loop answers far inside the bound (not recorded in benchmarks/); a lost wake
    # waits for the loop's 200 ms tick.
    for late in (1, 0):
        res = run_ranks(sleeping_loop_suite, 2, args=(late,), timeout=120)
        waits = res[late].value
        assert statistics.median(waits) < 0.06, (late, [round(w * 1e3, 2) for w in waits])
