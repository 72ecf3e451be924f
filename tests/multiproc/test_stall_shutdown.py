"""HVD_STALL_SHUTDOWN_TIME (Note [Deadlock shutdown] in csrc/coord/deadlock.cc): ranks whose op
sequences diverged fail their pending ops on every rank, in bounded time, with a report of
what each rank waits for, and the job stays usable; a rank that is merely late is not failed."""
import time

import numpy as np
import pytest

from multiproc.harness import run_ranks

pytestmark = pytest.mark.multiproc

SHUTDOWN_S = 3.0
ENV = {"HVD_STALL_SHUTDOWN_TIME": str(SHUTDOWN_S)}


def _failed(fn):
    """(seconds fn took, its error message or None)."""
    t0 = time.monotonic()
    try:
        fn()
    except RuntimeError as exc:
        return time.monotonic() - t0, str(exc)
    return time.monotonic() - t0, None


def numpy_named_divergence():
    import engine_native as hvd
    hvd.init()
    me = hvd.rank()
    async_error = None
    if me == 2:
        h = hvd.allreduce_async(np.ones(2), name="async.c")  # only rank 2 submits it
        took, error = _failed(lambda: hvd.allreduce(np.ones(2), name="step.b"))
        async_error = _failed(lambda: hvd.synchronize(h))[1]
    else:
        took, error = _failed(lambda: hvd.allreduce(np.ones(2), name="step.a"))
    # Usable afterwards: ops the ranks agree on run.
    after = hvd.allreduce(np.full(2, me), op=hvd.Sum, name="after")
    hvd.shutdown()
    return took, error, async_error, after.tolist()


def test_diverged_names_fail_with_the_report_in_bounded_time():
    results = run_ranks(numpy_named_divergence, 3, env=ENV, timeout=90)
    for r in results:
        took, error, async_error, after = r.value
        assert error is not None, f"rank {r.rank}: no error"
        assert SHUTDOWN_S * 0.9 <= took < SHUTDOWN_S + 20, f"rank {r.rank}: {took:.1f} s"
        assert error.startswith("Deadlock: ranks 0, 1, 2 have been waiting"), error
        assert "\n0: [allreduce.step.a (missing ranks: 2)]\n" in error, error
        assert "\n1: [allreduce.step.a (missing ranks: 2)]\n" in error, error
        assert ("\n2: [allreduce.async.c (missing ranks: 0, 1), allreduce.step.b (missing ranks:"
                " 0, 1)]\n") in error, error
        assert "HVD_STALL_SHUTDOWN_TIME=3" in error, error
        assert after == [3, 3], f"rank {r.rank}: {after}"
    assert results[2].value[2] == results[2].value[1]  # the async op failed with the report


def torch_unnamed_divergence():
    import torch

    import engine_native.torch as hvd
    hvd.init()
    me = hvd.rank()
    hvd.allreduce(torch.ones(2))  # allreduce.noname.0 everywhere

    def step():
        if me == 2:
            hvd.allreduce(torch.ones(2))  # one unnamed op more than the others: noname.1
        hvd.allreduce(torch.ones(2), name="loss")

    took, error = _failed(step)
    after = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after").tolist()
    hvd.shutdown()
    return took, error, after


@pytest.mark.parametrize("env", [ENV, {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "3"},
                                 {"HVD_STALL_SHUTDOWN_TIME": "-1",  # negative: 4 warnings
                                  "HVD_STALL_CHECK_TIME": "0.75"}],
                         ids=["hvd", "horovod-alias", "four-warnings"])
def test_an_extra_unnamed_op_fails_instead_of_hanging(env):
    for r in run_ranks(torch_unnamed_divergence, 3, env=env, timeout=90):
        took, error, after = r.value
        expected = ("\n2: [allreduce.noname.1 (missing ranks: 0, 1)]" if r.rank == 2
                    else f"\n{r.rank}: [allreduce.loss (missing ranks: 2)]")
        assert error is not None and expected in error, f"rank {r.rank}: {error}"
        assert "(HVD_STALL_SHUTDOWN_TIME=3)" in error, error
        assert took < SHUTDOWN_S + 20, f"rank {r.rank}: {took:.1f} s"
        assert after == [3.0, 3.0]


def numpy_late_rank(late_s):
    """Ranks 0 and 1 wait for "x"; rank 2 waits for "pre" (which they submit after "x") and
    is late with "x" by late_s: the same waits as a deadlock, but rank 2 is still going."""
    import engine_native as hvd
    hvd.init()
    me = hvd.rank()
    if me == 2:
        pre = hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="pre")
        time.sleep(late_s)
        x = hvd.allreduce(np.ones(2), op=hvd.Sum, name="x")
        pre = hvd.synchronize(pre)
    else:
        x = hvd.allreduce(np.ones(2), op=hvd.Sum, name="x")
        pre = hvd.allreduce(np.ones(2), op=hvd.Sum, name="pre")
    hvd.shutdown()
    return x.tolist(), pre.tolist()


def test_a_rank_late_by_less_than_the_shutdown_time_is_not_failed():
    for r in run_ranks(numpy_late_rank, 3, env=ENV, timeout=90, args=(SHUTDOWN_S / 2,)):
        assert r.value == ([3.0, 3.0], [3.0, 3.0])


def numpy_idle_rank(idle_s):
    """Rank 2 submits nothing for longer than the shutdown time: it may be computing, so the
    ranks waiting for it are not failed."""
    import engine_native as hvd
    hvd.init()
    if hvd.rank() == 2:
        time.sleep(idle_s)
    out = hvd.allreduce(np.ones(2), op=hvd.Sum, name="x").tolist()
    hvd.shutdown()
    return out


def test_ranks_waiting_for_a_rank_that_submits_nothing_are_not_failed():
    for r in run_ranks(numpy_idle_rank, 3, env=ENV, timeout=90, args=(SHUTDOWN_S + 2,)):
        assert r.value == [3.0, 3.0]


def torch_join_divergence():
    """Rank 1 joins; ranks 0 and 2 wait for different names: they are deadlocked, the joined
    rank only waits for them."""
    import torch

    import engine_native.torch as hvd
    hvd.init()
    me = hvd.rank()
    if me == 1:
        took, error = _failed(hvd.join)
        after = None
    else:
        took, error = _failed(lambda: hvd.allreduce(torch.ones(2), name=f"only.{me}"))
        # Rank 1 is still joined: it contributes zeros, and the join completes now.
        after = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after").tolist()
        hvd.join()
    final = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="final").tolist()
    hvd.shutdown()
    return took, error, after, final


def test_diverged_ranks_fail_and_a_rank_joined_meanwhile_is_not_failed():
    for r in run_ranks(torch_join_divergence, 3, env=ENV, timeout=90):
        took, error, after, final = r.value
        assert final == [3.0, 3.0], f"rank {r.rank}: {final}"
        if r.rank == 1:
            assert error is None, error
            continue
        assert error is not None and error.startswith("Deadlock: ranks 0, 2 "), error
        assert "\n0: [allreduce.only.0 (missing ranks: 2)]\n" in error, error
        assert "\n2: [allreduce.only.2 (missing ranks: 0)]\n" in error, error
        assert after == [2.0, 2.0], f"rank {r.rank}: {after}"


def numpy_set_deadlock_with_a_waiter():
    """Ranks 1 and 2 deadlock in their process set while rank 0 waits for them on a global op:
    only the deadlocked ops fail; once ranks 1 and 2 go on, rank 0's op completes."""
    import engine_native as hvd
    hvd.init()
    me = hvd.rank()
    ps = hvd.add_process_set([1, 2])
    error = None
    if me != 0:
        error = _failed(lambda: hvd.allreduce(np.ones(2), name=f"p.{me}", process_set=ps))[1]
    g = hvd.allreduce(np.ones(2), op=hvd.Sum, name="g").tolist()
    hvd.shutdown()
    return error, g


def test_only_the_deadlocked_ranks_fail():
    for r in run_ranks(numpy_set_deadlock_with_a_waiter, 3, env=ENV, timeout=90):
        error, g = r.value
        assert g == [3.0, 3.0], f"rank {r.rank}: {g}"
        if r.rank == 0:
            assert error is None
            continue
        assert error is not None and error.startswith("Deadlock: ranks 1, 2 "), error
        assert f"\n{r.rank}: [allreduce.p.{r.rank} in process set 1 (missing ranks: " in error
        assert "\n0: [" not in error, error


def numpy_join_in_a_deadlock():
    """Ranks 0 and 2 join the global set while rank 1 waits for rank 0 in set {0, 1}: rank 0
    and 1 deadlock through the join, which fails (for rank 2 too: the same op)."""
    import engine_native as hvd
    hvd.init()
    me = hvd.rank()
    ps = hvd.add_process_set([0, 1])
    if me == 1:
        error = _failed(lambda: hvd.allreduce(np.ones(2), name="a", process_set=ps))[1]
    else:
        error = _failed(hvd.join)[1]
    after = hvd.allreduce(np.ones(2), op=hvd.Sum, name="after").tolist()
    last = hvd.join()  # a join every rank runs works
    hvd.shutdown()
    return error, after, last


def test_a_join_in_a_deadlock_fails_and_a_later_join_works():
    for r in run_ranks(numpy_join_in_a_deadlock, 3, env=ENV, timeout=90):
        error, after, last = r.value
        assert error is not None and error.startswith("Deadlock: ranks 0, 1 "), error
        assert "\n0: [join" in error and "\n2: [join" in error, error
        assert "\n1: [allreduce.a in process set 1 (missing ranks: 0)]\n" in error, error
        assert after == [3.0, 3.0] and last in (0, 1, 2), f"rank {r.rank}: {after} {last}"


def test_by_default_a_computing_rank_with_async_ops_pending_is_never_failed():
    # The deadlock shutdown is off unless HVD_STALL_SHUTDOWN_TIME asks for it, as Horovod's:
    # with it on at 4 stall periods (4 s here) this job failed on every rank.
    # numpy_late_rank: rank 2, with "pre" pending, computes for longer than that before "x".
    env = {"HVD_STALL_CHECK_TIME": "1"}
    for r in run_ranks(numpy_late_rank, 3, env=env, timeout=90, args=(6.0,)):
        assert r.value == ([3.0, 3.0], [3.0, 3.0])
