"""allgather and broadcast through the host collective segment (algo/allgather_shm.cc,
algo/broadcast_shm.cc) and the picks of algo/allgather.cc and algo/broadcast.cc, each checked
against NumPy on spawned ranks.

- one host (np 1..5): allgather with first dimensions that differ per rank (zero rows, one
  rank alone, the largest part on a middle rank), every dtype, parts inside one piece, across
  pieces, and over more chunks than the segment has slots; broadcast from every root, every
  dtype, 0 / 1 / odd / several pieces / more pieces than slots; both interleaved with
  allreduce of changing sizes (the chunk counters carry over between ops of all kinds);
  several in flight; the torch API's grouped_allgather and in-place broadcast_;
- the fallbacks keep working and are picked: forced TCP (one fake host per rank) and a process
  set that leaves out a rank of the host go through ring and tree; mixed hosts (2+1, 2+2+1)
  through the hierarchical allgather (each host, leaders' ring, each host) and broadcast (a
  tree over one leader per host, then each host from its leader: its segment, or its pairs
  under TCP); hosts interleaved in rank order (a,b,a,b,b over TCP only) through the ring and
  the hierarchical broadcast.
Every test also asserts which path was taken (the dispatchers log each pick once at info).
"""
import numpy as np
import pytest

from multiproc import checks, faults
from multiproc.checks import ALL_DTYPES, Failures
from multiproc.harness import run_ranks

PIECE_BYTES = 256 << 10  # a rank's slot is (ranks on the host) x this; depth 4 slots
SHM = "shm (host collective segment)"
RING, TREE = "ring (pairs)", "tree (pairs)"
HIER = "hierarchical (leaders' tree, then each host)"
HIER_AG = "hierarchical (each host, leaders' ring, each host)"
LOG = {"HVD_LOG": "info"}


def _gather(hvd, fails, dtype, rows_of, name, width=(), process_set=None):
    members = process_set.ranks if process_set is not None else list(range(hvd.size()))
    me = hvd.rank()
    x = checks.make_input(dtype, (rows_of(members.index(me)),) + width, me, name)
    before = x.copy()
    kw = {} if process_set is None else {"process_set": process_set}
    out = hvd.allgather(x, name=name, **kw)
    expected = np.concatenate([checks.make_input(dtype, (rows_of(i),) + width, r, name)
                               for i, r in enumerate(members)])
    fails.check(name, checks.mismatch(out, expected, dtype))
    fails.expect(f"{name} input untouched", np.array_equal(x, before))


def _bcast(hvd, fails, dtype, count, root, name, process_set=None):
    x = checks.make_input(dtype, count, hvd.rank(), name)
    before = x.copy()
    kw = {} if process_set is None else {"process_set": process_set}
    out = hvd.broadcast(x, root, name=name, **kw)
    fails.check(name, checks.mismatch(out, checks.make_input(dtype, count, root, name), dtype))
    fails.expect(f"{name} input untouched", np.array_equal(x, before))
    fails.expect(f"{name} new array", not np.shares_memory(out, x))


def _allgather_cases(n, itemsize):
    """name -> rows of set rank i (rows of one element each)."""
    across = 3 * PIECE_BYTES // itemsize  # a few pieces (more: Note [Piece size]'s minimum)
    many = 5 * n * PIECE_BYTES // itemsize  # more chunks than slots: slots reused in the op
    return {
        "uneven": lambda i: (i * 5 + 3) % 6,             # 3, 2, 1, 0, 5
        "first-empty": lambda i: 0 if i == 0 else 1001 + i,
        "last-only": lambda i: 7 if i == n - 1 else 0,
        "middle-largest": lambda i: across + 4097 if i == n // 2 else 13 * i + 1,
        "across": lambda i, a=across: a + 17 * i + 1,
        "many": lambda i, m=many: m + 3 * i + 1,
    }


def collectives_suite(transport, cut_probe=False):
    hvd = checks.init(transport)
    fails = Failures()
    n = hvd.size()
    if cut_probe:  # the chunks of a 256 KiB broadcast (Note [Piece size]), with the count
        before = hvd.metrics()["host_chunks"]
        hvd.broadcast_(np.ones(PIECE_BYTES // 4, np.float32), 0, name="cut")
        chunks = hvd.metrics()["host_chunks"] - before
    for dtype in ALL_DTYPES:
        for case, rows in _allgather_cases(n, dtype.itemsize).items():
            if case == "many" and dtype.itemsize not in (1, 8):
                continue  # byte copies: two element sizes cover the layout, and keep it short
            _gather(hvd, fails, dtype, rows, f"ag.{case}.{dtype}")
        _gather(hvd, fails, dtype, lambda i: (i + 2) % 3, f"ag.2d.{dtype}", width=(3, 5))
    _gather(hvd, fails, np.float32, lambda i: 0, "ag.all-empty", width=(4,))
    for root in range(n):
        for dtype in ALL_DTYPES:
            across = 3 * PIECE_BYTES // dtype.itemsize + 5
            for count in (0, 1, 1001, across):
                _bcast(hvd, fails, dtype, count, root, f"bc.{dtype}.{count}.root{root}")
        many = 5 * n * PIECE_BYTES // 8 + 3
        _bcast(hvd, fails, np.float64, many, root, f"bc.many.root{root}")
        _bcast(hvd, fails, np.uint8, (3, 4, 5), root, f"bc.3d.root{root}")
    _interleaved(hvd, fails)
    _in_flight(hvd, fails)
    hvd.shutdown()
    return (fails.raise_if_any(), chunks) if cut_probe else fails.raise_if_any()


def _interleaved(hvd, fails):
    """Ops of all three kinds and changing sizes back to back: every op starts where the last
    one left the counters (Note [Host pipeline]), whatever its kind and chunk count."""
    n = hvd.size()
    sizes = (5, 300001, 0, 17, 1 << 20, 3, 700001)
    for k, count in enumerate(sizes):
        x = checks.make_input(np.float64, count, hvd.rank(), f"seq.ar.{k}")
        expected = checks.reference(checks.all_inputs(np.float64, count, n, f"seq.ar.{k}"),
                                    hvd.Sum)
        fails.check(f"seq.ar.{k}", checks.mismatch(hvd.allreduce(x, op=hvd.Sum,
                                                                 name=f"seq.ar.{k}"),
                                                   expected, np.float64, hvd.Sum))
        _gather(hvd, fails, np.int32, lambda i, c=count: (c + i) // (i + 1), f"seq.ag.{k}")
        _bcast(hvd, fails, np.int16, count, k % n, f"seq.bc.{k}")


def _in_flight(hvd, fails):
    """Several allgathers and broadcasts submitted before any is waited for."""
    n, me = hvd.size(), hvd.rank()
    handles = []
    for i in range(6):
        rows = 100000 * (i % 3) + me + 1
        handles.append(("ag", i, hvd.allgather_async(np.full((rows, 2), 10 * i + me, np.int32),
                                                     name=f"fl.ag.{i}")))
        handles.append(("bc", i, hvd.broadcast_async(np.full(70001 * i + 1, me + i, np.int64),
                                                     i % n, name=f"fl.bc.{i}")))
    for kind, i, h in handles:
        out = hvd.synchronize(h)
        if kind == "ag":
            expected = np.concatenate([np.full((100000 * (i % 3) + r + 1, 2), 10 * i + r,
                                               np.int32) for r in range(n)])
            fails.check(f"fl.ag.{i}", checks.mismatch(out, expected, np.int32))
        else:
            fails.expect(f"fl.bc.{i}", out.size == 70001 * i + 1 and np.all(out == i % n + i),
                         f"got {out[:4]}")


def _assert_paths(res, allgather, broadcast):
    for r in res:
        for op, path in (("allgather", allgather), ("broadcast", broadcast)):
            assert f"{op} via {path}" in r.stderr, f"rank {r.rank}: no {op} via {path}:\n" + \
                r.stderr[-3000:]
            others = {SHM, RING, TREE, HIER, HIER_AG} - {path}
            for other in others:
                assert f"{op} via {other}" not in r.stderr, f"rank {r.rank}: {op} via {other}"


# 2-4 ranks (the pair, an odd and an even world); 5 ranks: every collective in checks.WORLDS.
@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_one_host_goes_through_the_segment(np_):
    res = run_ranks(collectives_suite, np_, args=("shm",), timeout=300, env=LOG)
    if np_ > 1:
        _assert_paths(res, SHM, SHM)
    assert all(r.value > 300 for r in res)  # the checks actually ran


def test_both_cuts_of_pieces_at_three_ranks():
    # Pieces are cut two ways (Note [Piece size]): 128 KiB at least where the host's ranks
    # share cores (on a 2-core machine from 3 ranks on), down to 16 KiB otherwise. The switch
    # forces the way this machine would not take at 3 ranks, so both are covered anywhere:
    # a 256 KiB broadcast goes in 2 pieces, or 8. (Reductions keep the fine cut either way.)
    import os

    from engine_native import _core
    if not _core.TEST_SWITCHES:  # an installed wheel (.ci/wheel.sh's smoke): no switch to flip
        pytest.skip("needs a core built with the test switches (./dev.sh)")
    shared = 3 > len(os.sched_getaffinity(0))
    res = run_ranks(collectives_suite, 3, args=("shm", True), timeout=300,
                    env={**LOG, "HVD_TEST_HOST_OUTNUMBERED": "0" if shared else "1"})
    _assert_paths(res, SHM, SHM)
    assert [r.value[1] for r in res] == [8 if shared else 2] * 3
    assert all(r.value[0] > 300 for r in res)


@pytest.mark.parametrize("np_", [2, 3, 5])
def test_forced_tcp_uses_ring_and_tree(np_):
    res = run_ranks(collectives_suite, np_, args=("tcp",), timeout=400,
                    **checks.world_kwargs(np_, "tcp", LOG))
    _assert_paths(res, RING, TREE)
    assert all(r.value > 300 for r in res)


@pytest.mark.parametrize("hosts, transport, allgather", [
    (["a", "a", "b"], "auto", HIER_AG),
    (["a", "a", "b", "b", "c"], "auto", HIER_AG),
    (["a", "a", "b", "b", "b"], "tcp", HIER_AG),
    (["a", "b", "a", "b", "b"], "tcp", RING),  # a host's ranks not consecutive: no blocks
], ids=["2+1", "2+2+1", "2+3-tcp", "2+3-tcp-interleaved"])
def test_mixed_hosts_use_hierarchical_paths(hosts, transport, allgather):
    res = run_ranks(collectives_suite, len(hosts), args=("any",), timeout=400, hosts=hosts,
                    env=dict(LOG, HVD_TRANSPORT=transport))
    _assert_paths(res, allgather, HIER)
    assert all(r.value > 300 for r in res)


def subset_suite():
    """A process set without rank 1 of the host: no segment serves it (its counters would
    fall behind), so it goes over the pairs; the global set keeps using the segment."""
    hvd = checks.init("shm")
    fails = Failures()
    outer = hvd.add_process_set([0, 2])
    for k in range(2):
        if hvd.rank() in outer.ranks:
            _gather(hvd, fails, np.float32, lambda i: 300001 * i + 2, f"sub.ag.{k}",
                    process_set=outer)
            _bcast(hvd, fails, np.uint8, 1 << 20, 2, f"sub.bc.{k}", process_set=outer)
        _gather(hvd, fails, np.int64, lambda i: 100003 + i, f"all.ag.{k}")
        _bcast(hvd, fails, np.float16, 500001, k, f"all.bc.{k}")
    hvd.shutdown()
    return fails.raise_if_any()


def test_process_set_without_whole_host_uses_pairs():
    res = run_ranks(subset_suite, 3, timeout=200, env=LOG)
    _assert_paths([res[1]], SHM, SHM)
    for r in (res[0], res[2]):
        for op, path in (("allgather", RING), ("broadcast", TREE)):
            assert f"{op} via {path}" in r.stderr and f"{op} via {SHM}" in r.stderr, r.stderr


def torch_suite():
    import torch

    import engine_native.torch as hvd
    hvd.init()
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    a = [torch.arange(r * 300007, r * 300007 + (r + 1) * 100001, dtype=torch.float64)
         for r in range(n)]
    b = [torch.full((r % 2, 3), r, dtype=torch.int16) for r in range(n)]
    outs = hvd.grouped_allgather([a[me], b[me]], name="g")
    fails.expect("grouped.a", torch.equal(outs[0], torch.cat(a)))
    fails.expect("grouped.b", torch.equal(outs[1], torch.cat(b)))
    for root in range(n):
        t = torch.full((400003,), float(me), dtype=torch.float32)
        same = hvd.broadcast_(t, root, name=f"inplace.{root}")
        fails.expect(f"inplace.{root}", same is t and bool(torch.all(t == root)))
    model = torch.nn.Linear(300, 500)
    torch.nn.init.constant_(model.weight, float(me))
    hvd.broadcast_parameters(model.state_dict(), root_rank=n - 1)
    fails.expect("parameters", bool(torch.all(model.weight == n - 1)))
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_", [2, 3])
def test_torch_grouped_allgather_and_inplace_broadcast(np_):
    res = run_ranks(torch_suite, np_, timeout=200, env=LOG)
    _assert_paths(res, SHM, SHM)


def stopped_root_suite(pid_dir):
    """The root stops (SIGSTOP) inside a long shm broadcast: every reader must fail after about
    HVD_TIMEOUT naming the root (the rank it waits for), not a fellow reader, and not hang."""
    hvd = checks.init("shm")
    root = hvd.size() - 1
    big = np.ones(64 << 20, np.float32)  # 256 MiB: long enough to stop the root inside the op
    hvd.broadcast(np.ones(4), root, name="warm-up")
    result = faults.hung_peer(hvd, root, pid_dir,
                              lambda name: hvd.broadcast(big, root, name=name),
                              lambda name: hvd.broadcast_async(big, root, name=name))
    hvd.shutdown()
    return result


def test_stopped_root_times_out_naming_the_root(tmp_path):
    timeout = 3.0
    # The slot path's waits are what this test is about. With single-copy reads (a 256 MiB
    # broadcast takes them) the readers copy the stopped root's input and finish the op; it is
    # the next op's negotiation that then waits for the root (the stall check's business).
    res = run_ranks(stopped_root_suite, 3, args=(str(tmp_path),), timeout=120, check=False,
                    env={"HVD_TIMEOUT": str(timeout), "HVD_LOG": "info",
                         "HVD_SINGLE_COPY": "0"})
    faults.assert_hung_peer_named(res, timeout)


def mixed_cpus_suite(pin_rank_0: bool):
    """Rank 0 may use one CPU where pinned (its spins yield: 2 ranks, 1 CPU), rank 1 both (they
    do not): the ranks must still cut every op into the same chunks, pieces of at least
    128 KiB for ops that only copy where any rank of the host shares its cores (Note [Piece
    size]). Returns (spins yield, chunks of a 256 KiB broadcast)."""
    import os
    if pin_rank_0 and os.environ["HVD_RANK"] == "0":
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    hvd = checks.init("shm")
    fails = Failures()
    me, n = hvd.rank(), hvd.size()
    count = 3 * PIECE_BYTES // 4  # several pieces either way
    before = hvd.metrics()["host_chunks"]
    hvd.broadcast_(np.ones(PIECE_BYTES // 4, np.float32), 0, name="cut")  # 2 pieces, or 8
    chunks = hvd.metrics()["host_chunks"] - before
    for dtype in (np.float32, np.int64):
        x = checks.make_input(dtype, count, me, "ar")
        out = hvd.allreduce(x, op=hvd.Sum, name=f"ar.{dtype.__name__}")
        fails.check(f"allreduce.{dtype.__name__}", checks.mismatch(
            out, sum(checks.make_input(dtype, count, r, "ar") for r in range(n)), dtype))
        _gather(hvd, fails, dtype, lambda i: count // 2 + i, f"ag.{dtype.__name__}")
        _bcast(hvd, fails, dtype, count, 0, f"bc.{dtype.__name__}")
        x = checks.make_input(dtype, (2 * count,), me, "a2a")
        got = hvd.alltoall(x, name=f"a2a.{dtype.__name__}")[0]
        want = np.concatenate([checks.make_input(dtype, (2 * count,), r, "a2a")[
            me * count:(me + 1) * count] for r in range(n)])
        fails.check(f"alltoall.{dtype.__name__}", checks.mismatch(got, want, dtype))
    yields = hvd.metrics()["spin_yields"]
    hvd.shutdown()
    fails.raise_if_any()
    return yields, chunks


@pytest.mark.parametrize("pinned", [True, False])
def test_ranks_that_see_different_cpus_cut_ops_alike(pinned):
    import os
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    res = run_ranks(mixed_cpus_suite, 2, args=(pinned,), timeout=90,
                    env={"HVD_TIMEOUT": "10", "HVD_SHARED_OUTPUTS": "0"})
    # The premise (rank 0's spins yield where pinned) and the cut: 2 pieces of the 256 KiB
    # broadcast where any rank of the host shares its cores, else 8.
    assert [r.value for r in res] == ([(True, 2), (False, 2)] if pinned else [(False, 8)] * 2)
