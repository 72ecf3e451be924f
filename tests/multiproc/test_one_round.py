"""The one-round board (Note [One round] in engine_native/csrc/runtime/one_round.cc): on one
host, a small blocking allreduce, broadcast, allgather, alltoall or reducescatter of the global
set is agreed and its data moved in one shared-memory round among the ranks, without rank 0's
negotiation. Counted by metrics()['one_round_ops'] so each case says which path it took: every
dtype and reduce op, scale factors, odd sizes, every root, in place, rows that differ per rank,
uneven splits and blocks take it and give the reference's values; async ops, groups, process
sets, large ops, joins and mismatched shapes go to negotiation (a mismatch is still an error on
every rank, and the core goes on); after a join completes the board is open again, join after
join, whoever joins first (a rank leaving closes it for the others, and an op negotiated after
the join is not waited for on it); ranks that submit the same names in different orders still
finish (owed ops); a rank asking for no board (HVD_ONE_ROUND_BYTES=0, or the deadlock shutdown
on) turns it off for all; a rank that dies while the others wait on its post fails them with the
cause. test_one_round_hosts.py runs these suites on ranks of several hosts and over TCP.
"""
import os
import time

import numpy as np
import pytest

from multiproc import checks, faults
from multiproc.harness import run_ranks


def _one_round(hvd) -> int:
    return hvd.metrics()["one_round_ops"]


def values_suite():
    """Every dtype, op, scale and root through the board, each checked against the
    reference; returns failures and how many ops took the board."""
    hvd = checks.init("shm")
    me, n = hvd.rank(), hvd.size()
    bad, ops = [], 0
    for dtype in checks.ALL_DTYPES:
        for count in (1, 7, 1024 // dtype.itemsize):
            for op in checks.ops_for(dtype):
                name = f"ar.{dtype}.{count}.{op}"
                product = op == hvd.Product
                x = checks.make_input(dtype, (count,), me, name, product)
                scaled = dtype.kind == "f" or dtype == checks.BFLOAT16
                pre, post = (0.5, 4.0) if scaled and op == hvd.Sum else (1.0, 1.0)
                got = hvd.allreduce(x, op=op, name=name, prescale_factor=pre,
                                    postscale_factor=post)
                want = checks.reference(checks.all_inputs(dtype, (count,), n, name, product),
                                        op, pre, post)
                ops += 1
                problem = checks.mismatch(got, want, dtype, op)
                if problem:
                    bad.append(f"{name}: {problem}")
            root = count % n
            name = f"bc.{dtype}.{count}"
            x = checks.make_input(dtype, (count, 1), me, name)
            want = checks.make_input(dtype, (count, 1), root, name)
            if not np.array_equal(hvd.broadcast(x, root_rank=root, name=name), want):
                bad.append(name)
            hvd.broadcast_(x, root_rank=root, name=name + ".inplace")
            if not np.array_equal(x, want):
                bad.append(name + " in place")
            ops += 2
    for dtype in checks.ALL_DTYPES:
        bad += _gathers_and_scatters(hvd, dtype, me, n)
        ops += 3 + (dtype != checks.BOOL)
    counted = _one_round(hvd)
    hvd.shutdown()
    return {"bad": bad, "ops": ops, "counted": counted}


def _gathers_and_scatters(hvd, dtype, me, n) -> list:
    """allgather (rows differ per rank), alltoall (uneven splits, then even), reducescatter
    (a row count that does not divide evenly, with scale factors) of ``dtype``."""
    bad = []
    name = f"ag.{dtype}"
    got = hvd.allgather(checks.make_input(dtype, (me + 1, 3), me, name), name=name)
    want = np.concatenate([checks.make_input(dtype, (k + 1, 3), k, name) for k in range(n)])
    if got.dtype != want.dtype or not np.array_equal(got, want):
        bad.append(name)
    name = f"a2a.{dtype}"

    def splits_of(r):
        return [(r + k) % 3 for k in range(n)]

    x = checks.make_input(dtype, (sum(splits_of(me)), 3), me, name)
    got, received = hvd.alltoall(x, splits=splits_of(me), name=name)
    want = checks.alltoall_expected(dtype, splits_of, me, n, name)
    if not np.array_equal(got, want) or list(received) != [splits_of(k)[me] for k in range(n)]:
        bad.append(name)
    got, _ = hvd.alltoall(np.full((n, 2), me, dtype), name=name + ".even")
    if not np.array_equal(got, np.repeat(np.arange(n), 2).reshape(n, 2).astype(dtype)):
        bad.append(name + " even")
    if dtype == checks.BOOL:
        return bad
    name = f"rs.{dtype}"
    rows = 2 * n + 1
    scaled = dtype.kind == "f" or dtype == checks.BFLOAT16
    pre, post = (0.5, 2.0) if scaled else (1.0, 1.0)
    got = hvd.reducescatter(checks.make_input(dtype, (rows, 2), me, name), op=hvd.Sum,
                            name=name, prescale_factor=pre, postscale_factor=post)
    lo = sum(rows // n + (k < rows % n) for k in range(me))
    hi = lo + rows // n + (me < rows % n)
    want = checks.reference(checks.all_inputs(dtype, (rows, 2), n, name, rows=(lo, hi)),
                            hvd.Sum, pre, post)
    problem = checks.mismatch(got, want, dtype, hvd.Sum)
    if problem:
        bad.append(f"{name}: {problem}")
    return bad


def test_small_blocking_ops_take_the_board_with_the_reference_values():
    for r in run_ranks(values_suite, 3, timeout=240):
        assert r.value["bad"] == [], r.value["bad"][:10]
        assert r.value["counted"] == r.value["ops"], r.value


def routes_suite():
    """Ops the board hands to negotiation, and ranks taking the same names in other orders."""
    hvd = checks.init("shm")
    me, n = hvd.rank(), hvd.size()
    out = {}
    pair = hvd.add_process_set([0, 1])  # (its own agreement may take the board)
    base = _one_round(hvd)
    ones = np.ones(4, np.float32)
    # async ops, a large op, a process set, a group: negotiated, right
    h = hvd.allreduce_async(ones, op=hvd.Sum, name="async")
    out["async"] = hvd.synchronize(h).tolist()
    big = np.ones(5000, np.float32)  # 20 000 bytes: over the 4 KiB default
    out["large"] = float(hvd.allreduce(big, op=hvd.Sum, name="large")[0])
    if me in (0, 1):
        out["set"] = hvd.allreduce(ones, op=hvd.Sum, name="set", process_set=pair).tolist()
    out["grouped"] = [a.tolist() for a in hvd.grouped_allreduce([ones, ones], op=hvd.Sum,
                                                                   name="grp")]  # rank 0 fuses
    out["negotiated"] = _one_round(hvd) - base
    # the same names in another order: rank 0 sends "b" async first, the others "a" async
    # first; each then waits on the other name (owed ops, Note [One round] D)
    first, second = ("b", "a") if me == 0 else ("a", "b")
    h = hvd.allreduce_async(np.full(2, me, np.float32), op=hvd.Sum, name=first)
    other = hvd.allreduce(np.full(2, me, np.float32), op=hvd.Sum, name=second)
    mine = hvd.synchronize(h)
    out["orders"] = sorted([(first, mine.tolist()), (second, other.tolist())])
    # owed: rank 0 sends "x" to negotiation alone and blocks on it; the others post "w" first
    # and take "x" only after that round (the pause makes that interleaving likely; any other
    # one must pass too). Without owed names they would post "x" and wait for a rank 0 that
    # posts nothing more: a deadlock (the run's timeout).
    if me == 0:
        x = hvd.synchronize(hvd.allreduce_async(np.ones(1, np.float32), op=hvd.Sum, name="x"))
        w = hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum, name="w")
    else:
        hw = hvd.allreduce_async(np.ones(1, np.float32), op=hvd.Sum, name="w")
        time.sleep(0.05)
        x = hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum, name="x")
        w = hvd.synchronize(hw)
    out["owed"] = [x.tolist(), w.tolist()]
    # the same with the owed op queued behind a round the others posted already: rank 0 blocks
    # on "x2" in negotiation and posts nothing more, so that round never completes
    if me == 0:
        x = hvd.synchronize(hvd.allreduce_async(np.ones(1, np.float32), op=hvd.Sum, name="x2"))
        hs = [hvd.allreduce_async(np.ones(1, np.float32), op=hvd.Sum, name=nm)
              for nm in ("w2", "v2")]
    else:
        hs = [hvd.allreduce_async(np.ones(1, np.float32), op=hvd.Sum, name="w2")]
        time.sleep(0.05)
        hs.append(hvd.allreduce_async(np.ones(1, np.float32), op=hvd.Sum, name="v2"))
        time.sleep(0.05)
        x = hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum, name="x2")
    out["owed_behind"] = [x.tolist()] + [hvd.synchronize(h).tolist() for h in hs]
    # a mismatch is an error on every rank, and the next op takes the board again
    shape = (3,) if me == 0 else (4,)
    try:
        hvd.allreduce(np.ones(shape, np.float32), name="mismatch")
        out["mismatch"] = "no error"
    except Exception as e:  # noqa: BLE001 - the type and message are what is checked
        out["mismatch"] = f"{type(e).__name__}: {str(e)[:34]}"
    # gathers posted with rows that do not fit each other: an error on every rank too
    for op, call in (("ALLGATHER", lambda: hvd.allgather(np.ones((1, 2 + (me == 1)), np.int32),
                                                         name="ag.mismatch")),
                     ("ALLTOALL", lambda: hvd.alltoall(np.ones((n, 1 + (me == 1)), np.int32),
                                                       name="a2a.mismatch"))):
        try:
            call()
            out[op] = "no error"
        except Exception as e:  # noqa: BLE001 - the type and message are what is checked
            out[op] = f"{type(e).__name__}: {str(e)}"
    # a reducescatter the board does not take (MAX): rank 0 reports it on every rank
    before = _one_round(hvd)
    try:
        hvd.reducescatter(np.ones(2 * n, np.float32), op=hvd.Max, name="rs.max")
        out["refused"] = "no error"
    except Exception as e:  # noqa: BLE001 - the type and message are what is checked
        out["refused"] = f"{type(e).__name__}: {str(e)[:43]}"
    out["refused_board"] = _one_round(hvd) - before
    before = _one_round(hvd)
    out["after"] = hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum, name="after").tolist()
    out["after_board"] = _one_round(hvd) - before
    # a rank that joins early: the others' ops get its zeros, negotiated from then on
    if me == n - 1:
        out["last_joined"] = hvd.join()
    else:
        out["joined"] = hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum, name="j").tolist()
        out["last_joined"] = hvd.join()
    before = _one_round(hvd)
    out["reopened"] = hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum, name="c").tolist()
    out["reopened_board"] = _one_round(hvd) - before
    hvd.shutdown()
    return out


def test_what_the_board_does_not_take_is_negotiated_and_orders_may_differ():
    values = [r.value for r in run_ranks(routes_suite, 3, timeout=120)]
    n = 3
    for me, v in enumerate(values):
        assert v["async"] == [n] * 4 and v["large"] == n, v
        assert v["grouped"] == [[n] * 4, [n] * 4], v
        assert v.get("set", [2.0] * 4) == [2.0] * 4, v
        assert v["negotiated"] == 0, v
        assert v["orders"] == [("a", [3.0, 3.0]), ("b", [3.0, 3.0])], v
        assert v["owed"] == [[n], [n]] and v["owed_behind"] == [[n]] * 3, v
        # as negotiation reports it without the board
        assert v["mismatch"] == "HorovodInternalError: Mismatched ALLREDUCE tensor shapes", v
        for op in ("ALLGATHER", "ALLTOALL"):
            assert v[op].startswith(f"HorovodInternalError: Mismatched {op} tensor shapes"), v
        assert v["refused"] == ("HorovodInternalError: REDUCESCATTER supports only SUM and "
                                "AVERAGE"), v
        assert v["refused_board"] == 0, v
        assert v["after"] == [n] and v["after_board"] == 1, v
        assert v["last_joined"] == values[0]["last_joined"] in (0, 1), v  # not the early one
        if me < n - 1:
            assert v["joined"] == [n - 1], v  # the joined rank's zeros
        # the join closed the board; once it completed, the board is open again (J)
        assert v["reopened"] == [n] and v["reopened_board"] == 1, v


def count_suite():
    hvd = checks.init(os.environ.get("EXPECT_TRANSPORT", "shm"))
    got = [hvd.allreduce(np.full(3, hvd.rank(), np.int32), op=hvd.Sum).tolist()
           for _ in range(20)]
    got.append(hvd.broadcast(np.full(2, hvd.rank(), np.int64), root_rank=hvd.size() - 1).tolist())
    counted = _one_round(hvd)
    hvd.shutdown()
    return {"got": got, "counted": counted}


@pytest.mark.parametrize("case", ["one rank asks for none", "deadlock shutdown",
                                  "a world of one"])
def test_the_board_is_off_for_every_rank_when_one_asks_for_none(case):
    n = 1 if case == "a world of one" else 2  # one rank has no one to agree with
    kwargs = {}
    if case == "deadlock shutdown":  # it needs every op at rank 0
        kwargs = {"rank_env": {0: {"HVD_STALL_SHUTDOWN_TIME": "30"}}}
    elif case == "one rank asks for none":
        kwargs = {"rank_env": {1: {"HVD_ONE_ROUND_BYTES": "0"}}}
    for r in run_ranks(count_suite, n, timeout=60, **kwargs):
        total = sum(range(n))
        assert r.value["got"] == [[total] * 3] * 20 + [[n - 1] * 2], r.value
        assert r.value["counted"] == 0, r.value


def dying_suite(folder):
    """Rank 1 takes two board rounds, then exits while rank 0 waits on its next post."""
    hvd = checks.init("shm")
    for _ in range(2):
        hvd.allreduce(np.ones(1, np.float32), name="before")
    if hvd.rank() == 1:
        faults.await_event(folder, "waiting")
        os._exit(0)
    faults.announce(folder, "waiting")  # just before its wait: rank 1 may go at once
    try:
        hvd.allreduce(np.ones(1, np.float32), name="never")
        return "no error"
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        return str(e)


def test_a_rank_that_dies_while_the_others_wait_on_its_post_fails_them(tmp_path):
    results = run_ranks(dying_suite, 2, args=(str(tmp_path),), timeout=60,
                        env={"HVD_TIMEOUT": "10"}, check=False)
    assert "rank 1" in str(results[0].value), results[0]


def join_cycles_suite(cycles: int):
    """Epochs of uneven length, each ended by a join: rank r runs r + 1 extra small ops (the
    joined ranks' zeros complete the others' through negotiation), then every rank joins, and
    the next epoch's first ops take the reopened board. Returns per cycle: the extra ops'
    values, the join's last rank, and the values and board count of the epoch's common ops."""
    hvd = checks.init("shm")
    me, n = hvd.rank(), hvd.size()
    cycles_out = []
    for c in range(cycles):
        before = _one_round(hvd)
        common = [hvd.allreduce(np.full(3, me + c, np.float32), op=hvd.Sum,
                                name=f"common.{c}.{k}").tolist() for k in range(3)]
        common.append(hvd.broadcast(np.full(2, me, np.int64), root_rank=c % n,
                                    name=f"bc.{c}").tolist())
        common.append(hvd.allgather(np.full((1, 2), me, np.int32), name=f"ag.{c}").tolist())
        on_board = _one_round(hvd) - before
        extra = [hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum,
                               name=f"extra.{c}.{k}").tolist() for k in range((me + c) % n + 1)]
        last = hvd.join()
        cycles_out.append({"common": common, "on_board": on_board, "extra": extra,
                           "last": last})
    hvd.shutdown()
    return cycles_out


@pytest.mark.parametrize("np_", [2, 3, 4, 5])
def test_the_board_reopens_after_every_join(np_):
    cycles = 6
    values = [r.value for r in run_ranks(join_cycles_suite, np_, args=(cycles,), timeout=180)]
    for c in range(cycles):
        lasts = {values[r][c]["last"] for r in range(np_)}
        assert len(lasts) == 1, (c, lasts)  # one answer on every rank
        for me in range(np_):
            v = values[me][c]
            want = [[float(sum(r + c for r in range(np_)))] * 3] * 3
            assert v["common"][:3] == want, (c, me, v)
            assert v["common"][3] == [c % np_] * 2, (c, me, v)
            assert v["common"][4] == [[r, r] for r in range(np_)], (c, me, v)
            assert v["on_board"] == 5, (c, me, v)  # every common op, the first epoch's too
            # extra op k: the ranks that still run it, each adding 1 (the joined add zeros)
            got = [x[0] for x in v["extra"]]
            assert got == [float(sum((r + c) % np_ + 1 > k for r in range(np_)))
                           for k in range((me + c) % np_ + 1)], (c, me, got)


def leaving_suite():
    """After a join, rank 1 shuts down while rank 0's next small op waits for its reopening or
    its post: rank 0's op ends with rank 1's departure, and a later init works."""
    hvd = checks.init("shm")
    hvd.allreduce(np.ones(1, np.float32), name="before")
    hvd.join()
    if hvd.rank() == 1:
        hvd.shutdown()
        return "left"
    try:
        hvd.allreduce(np.ones(1, np.float32), name="alone")
        out = "no error"
    except hvd.HorovodInternalError as error:
        out = str(error)
    hvd.shutdown()
    return out


def test_a_rank_that_leaves_after_a_join_ends_the_others_wait():
    results = run_ranks(leaving_suite, 2, timeout=90, env={"HVD_TIMEOUT": "5"})
    assert results[1].value == "left"
    assert "no error" != results[0].value and "rank 1" in results[0].value, results[0].value


def second_thread_suite(folder: str):
    """Rank 1's second thread waits in a blocking allreduce "loss" on the board while its main
    thread joins; rank 0 joins last without having posted "loss", then submits it. Rank 1's
    "loss" reaches rank 0's negotiation only after the join, so it pairs with rank 0's: the
    reopened board must not wait for rank 1 to post it (the first post after the join names
    it). Rank 1 joins only once "loss" waits on the board for rank 0, and rank 0 joins only
    once rank 1's join op is taken (its request sent to rank 0): both seen in rank 1's
    pending list. Should rank 0's coordinator still count its own join first (its loop not
    yet run since the request arrived), the join gives rank 1's "loss" rank 0's zeros and
    rank 0 submits none: the outcome is checked either way."""
    import threading
    hvd = checks.init("shm")
    hvd.allreduce(np.ones(1, np.float32), name="warm")
    if hvd.rank() == 1:
        got = {}
        worker = threading.Thread(target=lambda: got.setdefault(
            "loss", hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum, name="loss").tolist()))
        worker.start()
        faults.wait_until_pending(hvd, "allreduce.loss", waits_for=[0])

        def announce_once_joining():
            faults.wait_until_pending(hvd, "join")
            faults.announce(folder, "joined")
        announcer = threading.Thread(target=announce_once_joining)
        announcer.start()
        last = hvd.join()
        announcer.join(60)
        worker.join(60)
        loss = got.get("loss", "still waiting")
    else:
        faults.await_event(folder, "joined")
        last = hvd.join()
        loss = (hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum, name="loss").tolist()
                if last == 0 else None)
    after = hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum, name="after").tolist()
    hvd.shutdown()
    return {"last": last, "loss": loss, "after": after}


def test_an_op_negotiated_after_the_join_is_not_waited_for_on_the_reopened_board(tmp_path):
    values = [r.value for r in run_ranks(second_thread_suite, 2, args=(str(tmp_path),),
                                         timeout=90, env={"HVD_TIMEOUT": "30"})]
    last = values[0]["last"]
    assert values[1]["last"] == last, values
    if last == 0:  # the case the test is for: both "loss" ops paired after the join
        assert values[0]["loss"] == [2.0] and values[1]["loss"] == [2.0], values
    else:
        assert values[1]["loss"] == [1.0], values  # with rank 0's zeros
    assert values[0]["after"] == values[1]["after"] == [2.0], values
