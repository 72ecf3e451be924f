"""Process sets: collectives inside disjoint subsets running at the same time."""
import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import Failures
from multiproc.harness import run_ranks


def _set_checks(hvd, fails, ps, tag):
    members = ps.ranks
    me = hvd.rank()
    k = len(members)
    fails.expect(f"{tag} size/rank", (ps.size(), ps.rank(), ps.included())
                 == (k, members.index(me), True), f"{ps.size(), ps.rank(), ps.included()}")
    for dtype in (np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.float16)):
        for count in (1, 1001, checks.large_count(dtype)):
            name = f"{tag}.{dtype}.{count}"
            x = checks.make_input(dtype, count, me, name)
            out = hvd.allreduce(x, op=hvd.Sum, name=name, process_set=ps)
            ref = checks.reference([checks.make_input(dtype, count, r, name) for r in members],
                                   hvd.Sum)
            fails.check(name, checks.mismatch(out, ref, dtype, hvd.Sum))
    gathered = hvd.allgather(np.full((me + 1, 2), me, np.int32), name=f"{tag}.ag",
                             process_set=ps)
    expected = np.concatenate([np.full((r + 1, 2), r, np.int32) for r in members])
    fails.check(f"{tag} allgather", checks.mismatch(gathered, expected, np.int32))
    root = members[-1]  # roots are global ranks
    out = hvd.broadcast(np.full(3, me, np.int16), root, name=f"{tag}.bc", process_set=ps)
    fails.expect(f"{tag} broadcast", np.all(out == root), f"{out}")
    rs = hvd.reducescatter(np.full((k, 2), float(me)), op=hvd.Sum, name=f"{tag}.rs",
                           process_set=ps)
    fails.check(f"{tag} reducescatter", checks.mismatch(rs, np.full((1, 2), float(sum(members))),
                                                        np.float64))
    out, splits = hvd.alltoall(np.full(k, me, np.int64), name=f"{tag}.a2a", process_set=ps)
    fails.expect(f"{tag} alltoall", list(out) == members and list(splits) == [1] * k,
                 f"{out} {splits}")
    hvd.barrier(process_set=ps)


def process_set_suite(transport):
    hvd = checks.init(transport)
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    evens = hvd.add_process_set([r for r in range(n) if r % 2 == 0])
    odds = hvd.add_process_set([r for r in range(n) if r % 2 == 1])
    pair = hvd.add_process_set([0, 1])  # spans both parity sets
    mine, other = (evens, odds) if me % 2 == 0 else (odds, evens)
    fails.expect("not included", other.included() is False and other.rank() == -1)
    # Disjoint sets run concurrently; interleave with global ops.
    _set_checks(hvd, fails, mine, "mine")
    out = hvd.allreduce(np.full(7, me, np.int64), op=hvd.Sum, name="global.between")
    fails.expect("global between", np.all(out == n * (n - 1) // 2))
    if me in (0, 1):
        _set_checks(hvd, fails, pair, "pair")
    # A rank outside a set cannot use it.
    try:
        hvd.allreduce(np.ones(2), name="outsider", process_set=other)
        fails.items.append("collective on a set without this rank: no error")
    except ValueError:
        pass
    # Removal: every rank, same order; a removed set is unusable; ids are not confused.
    fails.expect("remove", hvd.remove_process_set(pair) is True)
    try:
        hvd.allreduce(np.ones(2), name="removed", process_set=pair)
        fails.items.append("collective on a removed set: no error")
    except ValueError:
        pass
    again = hvd.add_process_set([0, 1])
    if me in (0, 1):
        _set_checks(hvd, fails, again, "re-added")
    out = hvd.allreduce(np.full(3, 1.0), op=hvd.Sum, name="global.end")
    fails.expect("global end", np.all(out == n))
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_, transport", [(3, "shm"), (4, "shm"), (5, "tcp"), (4, "tcp")],
                         ids=["shm-np3", "shm-np4", "tcp-np5", "tcp-np4"])
def test_process_sets(np_, transport):
    run_ranks(process_set_suite, np_, args=(transport,), timeout=240,
              **checks.world_kwargs(np_, transport))


def disagreeing_sets_suite():
    hvd = checks.init()
    ranks = [0, 1] if hvd.rank() == 0 else [0, 2]
    try:
        hvd.add_process_set(ranks)
        outcome = "no error"
    except ValueError as exc:
        outcome = str(exc)
    out = hvd.allreduce(np.ones(2), op=hvd.Sum, name="after-disagreement")
    hvd.shutdown()
    return outcome, float(out[0])


def test_ranks_disagreeing_on_a_set_fail_everywhere():
    res = run_ranks(disagreeing_sets_suite, 3, timeout=60)
    for r in res:
        outcome, after = r.value
        assert "disagree" in outcome or "differ" in outcome, outcome
        assert after == 3.0


def empty_rank_list_suite():
    """Horovod 0.28.1 registers ``add_process_set([])`` as a new set of every rank (its core
    duplicates the global communicator for an empty list); so do we."""
    hvd = checks.init()
    everyone = hvd.add_process_set([])
    described = (everyone.ranks, everyone.process_set_id > 0, everyone.size(), everyone.rank())
    out = hvd.allreduce(np.ones(3), op=hvd.Sum, name="every.rank", process_set=everyone)
    removed = hvd.remove_process_set(everyone)
    hvd.shutdown()
    return described, out.tolist(), removed


def test_an_empty_rank_list_is_a_set_of_every_rank():
    for r in run_ranks(empty_rank_list_suite, 2, timeout=60):
        assert r.value == (([0, 1], True, 2, r.rank), [2.0] * 3, True), r.value


def shutdown_while_a_set_works_suite(marker_dir):
    """Ranks 0 and 1 shut down while ranks 2 and 3 go on with allreduces in their own set for
    half a second after rank 0 announced it (a window, not an ordering: rank 0's loop takes
    the shutdown within a tick, so most of the ops land while it waits for the agreement)."""
    import os
    import time
    hvd = checks.init()
    pair = hvd.add_process_set([2, 3])
    marker = os.path.join(marker_dir, "rank0-shuts-down")
    if hvd.rank() == 0:
        open(marker, "w").close()
    if hvd.rank() < 2:
        hvd.shutdown()
        return None
    deadline = time.monotonic() + 30
    while not os.path.exists(marker):
        assert time.monotonic() < deadline, "rank 0 never announced its shutdown"
        time.sleep(0.01)  # polling a condition, with a deadline
    done, until, going = 0, time.monotonic() + 0.5, True
    while going:  # (both ranks stop after the same op: each says whether it wants more)
        more = done < 20 or time.monotonic() < until
        out = hvd.allreduce(np.array([hvd.rank(), more], np.float32), op=hvd.Sum,
                            name=f"pair.{done}", process_set=pair)
        assert out[0] == 5.0, out
        going = out[1] > 0
        done += 1
    hvd.shutdown()
    return done


def test_a_set_keeps_working_while_other_ranks_shut_down(tmp_path):
    """Rank 0 coordinates every set: while it waits for the shutdown agreement it must go on
    answering the ranks still running (before, their next op waited for its deadline and
    failed with 'lost connection to rank 0')."""
    results = run_ranks(shutdown_while_a_set_works_suite, 4, args=(str(tmp_path),),
                        env={"HVD_TIMEOUT": "10"}, timeout=60)
    assert [r.value is None for r in results] == [True, True, False, False]
    assert all(r.value >= 20 for r in results[2:]), [r.value for r in results]
