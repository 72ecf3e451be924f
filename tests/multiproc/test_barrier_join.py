"""barrier and join on spawned ranks."""
import os

import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import Failures
from multiproc.harness import run_ranks


def barrier_suite(transport, shared_dir):
    """Each round every rank leaves a marker, then barriers: after the barrier every marker of
    that round must exist, on every rank."""
    hvd = checks.init(transport)
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    for round_ in range(5):
        with open(os.path.join(shared_dir, f"r{round_}.rank{me}"), "w") as fh:
            fh.write("x")
        hvd.barrier()
        present = [os.path.exists(os.path.join(shared_dir, f"r{round_}.rank{r}"))
                   for r in range(n)]
        fails.expect(f"round {round_}", all(present), f"markers present: {present}")
    # A barrier between collectives keeps them working.
    fails.expect("allreduce after barrier",
                 np.all(hvd.allreduce(np.ones(3), op=hvd.Sum, name="after") == n))
    hvd.shutdown()
    return fails.raise_if_any()


@checks.world_params()
def test_barrier(np_, transport, tmp_path):
    run_ranks(barrier_suite, np_, args=(transport, str(tmp_path)), timeout=120,
              **checks.world_kwargs(np_, transport))


def join_suite(transport):
    """Rank r submits r+1 allreduces then joins. Joined ranks contribute zeros, so allreduce k
    sums the ranks >= k; Average still divides by the full size (Horovod's semantics). The last
    rank to join is size-1, and every rank learns it."""
    hvd = checks.init(transport)
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    for epoch in range(2):  # join works more than once per init
        for k in range(me + 1):
            op = hvd.Sum if k % 2 == 0 else hvd.Average
            x = np.full(1001, float(me + 1), dtype=np.float32)
            out = hvd.allreduce(x, op=op, name=f"join.{epoch}.{k}")
            total = float(sum(r + 1 for r in range(k, n)))
            expected = total if op == hvd.Sum else total / n
            fails.check(f"epoch {epoch} allreduce {k}",
                        checks.mismatch(out, np.full(1001, expected), np.float32))
        last = hvd.join()
        fails.expect(f"epoch {epoch} join result", last == n - 1, f"got {last}")
        out = hvd.allreduce(np.full(4, me, np.int64), op=hvd.Sum, name=f"after-join.{epoch}")
        fails.expect(f"epoch {epoch} after join", np.all(out == n * (n - 1) // 2), f"{out}")
    hvd.shutdown()
    return fails.raise_if_any()


@checks.world_params()
def test_join(np_, transport):
    res = run_ranks(join_suite, np_, args=(transport,), timeout=120,
                    **checks.world_kwargs(np_, transport))
    assert all(r.ok for r in res)


def join_then_barrier_suite():
    hvd = checks.init()
    last = hvd.join()
    hvd.barrier()
    hvd.shutdown()
    return last


@pytest.mark.parametrize("np_", [1, 3])
def test_join_without_work(np_):
    res = run_ranks(join_then_barrier_suite, np_, timeout=60)
    values = {r.value for r in res}
    assert len(values) == 1 and values.pop() in range(np_)


def set_barrier_then_global_suite():
    """A barrier of a process set, then a global one: the set's barrier must not shift the
    global barrier's name on its members only (the global barrier then never completes)."""
    hvd = checks.init()
    pair = hvd.add_process_set([0, 1])
    if hvd.rank() in (0, 1):
        hvd.barrier(process_set=pair)
        hvd.barrier(process_set=pair)
    hvd.barrier()
    out = hvd.allreduce(np.ones(2), op=hvd.Sum, name="after-barriers")
    hvd.shutdown()
    return out.tolist()


def test_a_set_barrier_leaves_the_global_barrier_alone():
    res = run_ranks(set_barrier_then_global_suite, 3, timeout=60)
    assert [r.value for r in res] == [[3.0, 3.0]] * 3
