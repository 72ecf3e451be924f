"""init / shutdown / abort / re-init, topology queries and idle wake-ups on spawned ranks."""
import os
import time

import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import Failures
from multiproc.harness import run_ranks


def topology_suite(transport):
    import engine_native as hvd

    fails = Failures()
    fails.expect("not initialised yet", hvd.is_initialized() is False)
    for query in (hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.cross_rank,
                  hvd.cross_size):
        try:
            query()
            fails.items.append(f"{query.__name__}() before init: no error")
        except ValueError as exc:
            fails.expect(f"{query.__name__} message", "init" in str(exc), str(exc))
    hvd = checks.init(transport)
    hvd.init()  # a second init is a no-op
    n, me = int(os.environ["HVD_SIZE"]), int(os.environ["HVD_RANK"])
    fails.expect("initialised", hvd.is_initialized() is True)
    fails.expect("rank/size", (hvd.rank(), hvd.size()) == (me, n))
    got = (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
    want = (me, n, 0, 1) if transport == "shm" else (0, 1, me, n)
    fails.expect("local/cross", got == want, f"got {got}, expected {want}")
    fails.expect("works", np.all(hvd.allreduce(np.ones(2), op=hvd.Sum) == n))
    hvd.shutdown()
    fails.expect("shut down", hvd.is_initialized() is False)
    try:
        hvd.allreduce(np.ones(2), name="after-shutdown")
        fails.items.append("allreduce after shutdown: no error")
    except (ValueError, hvd.HorovodInternalError):
        pass
    hvd.shutdown()  # idempotent
    return fails.raise_if_any()


@pytest.mark.parametrize("np_, transport", [(1, "shm"), (3, "shm"), (3, "tcp")],
                         ids=["shm-np1", "shm-np3", "tcp-np3"])
def test_topology_and_state_queries(np_, transport):
    run_ranks(topology_suite, np_, args=(transport,), timeout=60,
              **checks.world_kwargs(np_, transport))


def cycles_suite(cycles):
    import engine_native as hvd

    fails = Failures()
    for c in range(cycles):
        hvd.init()
        out = hvd.allreduce(np.full(3, hvd.rank() + c, np.int64), op=hvd.Sum, name="cycle")
        n = hvd.size()
        fails.expect(f"cycle {c}", np.all(out == n * c + n * (n - 1) // 2), f"{out}")
        hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_", [2, 3])
def test_fifty_init_shutdown_cycles(np_):
    run_ranks(cycles_suite, np_, args=(50,), timeout=240)


def abort_suite(transport):
    """Rank 0 aborts while the others wait in an allreduce it never submits: every rank's
    pending and next op fail; shutdown + init in the same processes then works."""
    hvd = checks.init(transport)
    n, me = hvd.size(), hvd.rank()
    fails = Failures()
    fails.expect("before", np.all(hvd.allreduce(np.ones(2), op=hvd.Sum, name="pre") == n))
    start = time.monotonic()
    if me == 0:
        hvd.abort("test abort")
    else:
        try:
            hvd.allreduce(np.ones(2), name="never-completes")
            fails.items.append("pending op survived the abort")
        except hvd.HorovodInternalError as exc:
            fails.expect("abort named", "abort" in str(exc).lower(), str(exc))
    try:
        hvd.allreduce(np.ones(2), name="after-abort")
        fails.items.append("op after abort: no error")
    except hvd.HorovodInternalError as exc:
        fails.expect("later op named", "abort" in str(exc).lower(), str(exc))
    fails.expect("abort is prompt", time.monotonic() - start < 20)
    hvd.shutdown()
    hvd.init()
    out = hvd.allreduce(np.full(5, me, np.int32), op=hvd.Sum, name="reborn")
    fails.expect("works after re-init", np.all(out == n * (n - 1) // 2), f"{out}")
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_, transport", [(2, "shm"), (3, "shm"), (3, "tcp"), (1, "shm")],
                         ids=["shm-np2", "shm-np3", "tcp-np3", "shm-np1"])
def test_abort_then_reinit(np_, transport):
    run_ranks(abort_suite, np_, args=(transport,), timeout=120,
              **checks.world_kwargs(np_, transport, env={"HVD_TIMEOUT": "10"}))



def unnamed_ops_after_reinit_suite():
    """Unnamed ops are matched by a counter per process set: a new world must start it equal on
    every rank, after an abort that left one rank's unnamed op unsubmitted elsewhere, and for a
    set id the last world used with other members."""
    hvd = checks.init()
    n, me = hvd.size(), hvd.rank()
    fails = Failures()
    pair = hvd.add_process_set([0, 1])  # id 1 in this world: ranks 0 and 1
    if me in (0, 1):
        hvd.allreduce(np.ones(2), process_set=pair)
    if me == 0:
        hvd.allreduce_async(np.ones(2))  # only rank 0 counts it: the abort fails it
        hvd.abort("unnamed ops after re-init")
    try:
        hvd.allreduce(np.ones(2), name="fails")
        fails.items.append("op after abort: no error")
    except hvd.HorovodInternalError:
        pass
    hvd.shutdown()
    hvd.init()
    out = hvd.allreduce(np.full(2, me), op=hvd.Sum)
    fails.expect("global unnamed op", np.all(out == n * (n - 1) // 2), f"{out}")
    tail = hvd.add_process_set([1, 2])  # id 1 again, other members
    if me in (1, 2):
        out = hvd.allreduce(np.full(2, me), op=hvd.Sum, process_set=tail)
        fails.expect("set unnamed op", np.all(out == 3), f"{out}")
    hvd.barrier()  # rank 0 coordinates the set's op: it shuts down only after it
    hvd.shutdown()
    return fails.raise_if_any()


def test_unnamed_ops_match_after_abort_and_reinit():
    run_ranks(unnamed_ops_after_reinit_suite, 3, timeout=60, env={"HVD_TIMEOUT": "5"})


# The loop's idle tick (kTickMs in runtime/background_loop.cc): with nothing to do, the loop
# thread sleeps in one ppoll until a wake-up or this long.
TICK_S = 0.2


def idle_wakeups_suite(transport, seconds):
    hvd = checks.init(transport)
    hvd.allreduce(np.ones(1 << 16, np.float32), name="warm")  # threads and buffers are live
    before = hvd.metrics()["loop_wakeups"]
    start = time.monotonic()
    time.sleep(seconds)  # the idle window itself: nothing submitted, nobody sends
    window = time.monotonic() - start
    woke = hvd.metrics()["loop_wakeups"] - before
    hvd.shutdown()
    return woke, window


@pytest.mark.parametrize("np_, transport", [(3, "shm"), (3, "tcp")], ids=["shm", "tcp"])
def test_idle_loop_wakes_only_for_its_tick(np_, transport):
    """No busy spin in an idle world, by count (idle CPU itself: benchmarks/bench_idle.py):
    the loop's waits that ended (``loop_wakeups``) are at most the ticks the window holds,
    one more for the tick under way at its start, and a few for stragglers of the warm-up op
    (frames that reach the loop after its caller returned). A loaded machine only delays
    ticks; a loop that polls wakes once per poll, one woken by anything idle once per wake."""
    res = run_ranks(idle_wakeups_suite, np_, args=(transport, 3.0), timeout=60,
                    **checks.world_kwargs(np_, transport))
    for r in res:
        woke, window = r.value
        allowed = int(window / TICK_S) + 1 + 4
        assert woke <= allowed, (f"rank {r.rank}: the idle loop woke {woke} times in "
                                 f"{window:.2f} s, its {TICK_S * 1000:.0f} ms tick allows "
                                 f"{allowed}")


def exit_without_shutdown():
    hvd = checks.init()
    hvd.allreduce(np.ones(4), name="then-exit")
    return "bye"  # atexit must shut down cleanly, without hanging the process


def test_exit_without_shutdown_is_clean(monkeypatch):
    monkeypatch.setenv("HVD_HARNESS_ZYGOTE", "0")  # the whole exit: a forked rank skips C's
    res = run_ranks(exit_without_shutdown, 3, timeout=60)
    assert [r.returncode for r in res] == [0, 0, 0]
