"""alltoall and reducescatter through the host collective segment (algo/alltoall_shm.cc,
algo/reducescatter_shm.cc) and the picks of algo/alltoall.cc, each checked against NumPy on
spawned ranks.

- one host (np 1..5): alltoall with splits that differ per sender and receiver (zero blocks,
  one rank sending everything, the largest block on a middle rank, blocks across pieces and
  over more chunks than the segment has slots), every dtype; reducescatter with every numeric dtype,
  Sum and Average (its only ops), prescale and postscale, first dimensions below the set size (empty blocks), uneven
  and across many chunks; both interleaved with allreduce and allgather of changing sizes (the
  chunk counters carry over between ops of all kinds), and several in flight;
- bit for bit: the same suite under HVD_TRANSPORT=tcp (the pairwise exchange and the ring)
  gives every rank the same bytes for every result as the segment does (Note [Reduce-scatter
  fold order]);
- the fallbacks keep working and are picked: forced TCP, mixed hosts (2+1, 2+2+1), a process
  set that leaves out a rank of the host.
Every test also asserts which path was taken (the dispatchers log each pick once at info).
"""
import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import ALL_DTYPES, Failures
from multiproc.harness import run_ranks

PIECE_BYTES = 256 << 10  # a rank's slot is (ranks on the host) x this; depth 4 slots
SHM = "shm (host collective segment)"
PAIRWISE, RING = "pairwise (pairs)", "ring (pairs)"
LOG = {"HVD_LOG": "info"}
REDUCIBLE = checks.INT_DTYPES + checks.FLOAT_DTYPES  # reducescatter: Sum and Average only


def _alltoall(hvd, fails, dtype, splits_of, name, width=(), process_set=None):
    """splits_of(sender set index) -> rows it sends to each set index."""
    members = process_set.ranks if process_set is not None else list(range(hvd.size()))
    me = members.index(hvd.rank())
    x = checks.make_input(dtype, (sum(splits_of(me)),) + width, hvd.rank(), name)
    before = x.copy()
    kw = {} if process_set is None else {"process_set": process_set}
    out, received = hvd.alltoall(x, splits=splits_of(me), name=name, **kw)
    parts = []
    for i, r in enumerate(members):
        s = splits_of(i)
        lo = sum(s[:me])  # only the rows sent to this rank
        parts.append(checks.make_input(dtype, (sum(s),) + width, r, name, rows=(lo, lo + s[me])))
    fails.check(name, checks.mismatch(out, np.concatenate(parts), dtype))
    fails.expect(f"{name} splits", list(received) == [splits_of(i)[me]
                                                      for i in range(len(members))])
    fails.expect(f"{name} input untouched", np.array_equal(x, before))
    fails.digest(name, out)


def _rows(dim0, n, i):
    base, extra = divmod(dim0, n)
    start = i * base + min(i, extra)
    return start, start + base + (1 if i < extra else 0)


def _inexact(x):
    """Floats whose sums round (make_input's k/8 add exactly in any order): what makes the
    fold order visible in the bits."""
    return (x.astype(np.float64) * 0.7071067811865476 + 1 / 3).astype(x.dtype)


def _reducescatter(hvd, fails, dtype, dim0, op, name, width=(), process_set=None,
                   inexact=False, **scales):
    members = process_set.ranks if process_set is not None else list(range(hvd.size()))
    n, me = len(members), members.index(hvd.rank())
    shape = (dim0,) + width

    def make(r, rows=None):
        x = checks.make_input(dtype, shape, r, name, rows=rows)
        return _inexact(x) if inexact else x
    x = make(hvd.rank())
    before = x.copy()
    kw = {} if process_set is None else {"process_set": process_set}
    out = hvd.reducescatter(x, op=op, name=name, **kw, **scales)
    rows = _rows(dim0, n, me)
    inputs = [make(r, rows) for r in members]
    pre, post = scales.get("prescale_factor", 1.0), scales.get("postscale_factor", 1.0)
    if scales and dtype.kind in "iu":  # Horovod truncates after each scaling of integers
        acc = sum(checks.horovod_scale(x, pre).astype(np.int64) for x in inputs)
        post = post / n if op == hvd.Average else post
        expected = checks.horovod_scale(acc.astype(dtype), post)
    else:
        expected = checks.reference(inputs, op, pre, post)
    fails.check(name, checks.mismatch(out, expected, dtype, op))
    fails.expect(f"{name} input untouched", np.array_equal(x, before))
    fails.digest(name, out)


def _alltoall_cases(n, itemsize):
    """name -> splits_of(sender) (rows of one element each)."""
    across = 3 * PIECE_BYTES // itemsize  # a few pieces (more: Note [Piece size]'s minimum)
    many = 5 * PIECE_BYTES // itemsize   # more chunks than slots: slots reused in the op
    return {
        "uneven": lambda s: [(s * 5 + 3 * d + 1) % 6 for d in range(n)],  # zeros included
        "one-sender": lambda s: [7 + d if s == n - 1 else 0 for d in range(n)],
        "diagonal-only": lambda s: [11 if d == s else 0 for d in range(n)],
        "middle-largest": lambda s: [across + 4097 if s == n // 2 and d != s else
                                     13 * d + s for d in range(n)],
        "across": lambda s, a=across: [a + 17 * d + s for d in range(n)],
        "many": lambda s, m=many: [m + 3 * d + s for d in range(n)],
    }


def _reducescatter_dims(n, itemsize):
    return {"empty": 0, "below-n": max(n - 1, 1), "uneven": 2 * n + 1, "odd": 1001,
            "across": 3 * PIECE_BYTES // itemsize * n + n - 1,
            "many": 5 * PIECE_BYTES // itemsize * n + 1}


def collectives_suite(transport):
    hvd = checks.init(transport)
    fails = Failures()
    n = hvd.size()
    big = (1, 8)  # itemsizes that run the large cases: byte copies, two sizes cover the layout
    for dtype in ALL_DTYPES:
        for case, splits_of in _alltoall_cases(n, dtype.itemsize).items():
            if case == "many" and dtype.itemsize not in big:
                continue
            _alltoall(hvd, fails, dtype, splits_of, f"a2a.{case}.{dtype}")
        _alltoall(hvd, fails, dtype, lambda s: [(s + d) % 3 for d in range(n)],
                  f"a2a.2d.{dtype}", width=(3, 5))
    _alltoall(hvd, fails, np.float32, lambda s: [0] * n, "a2a.nothing", width=(4,))
    names = checks.op_names()
    for dtype in REDUCIBLE:
        for op in (hvd.Sum, hvd.Average):  # reducescatter's ops, as Horovod's
            for case, dim0 in _reducescatter_dims(n, dtype.itemsize).items():
                if case in ("across", "many") and (op != hvd.Sum or dtype.itemsize not in (2, 4)):
                    continue  # the reduction loop is per dtype, the layout per size: enough
                _reducescatter(hvd, fails, dtype, dim0, op, f"rs.{case}.{dtype}.{names[op]}")
            _reducescatter(hvd, fails, dtype, 2 * n + 1, op, f"rs.3d.{dtype}.{names[op]}",
                           width=(3, 2))
            _reducescatter(hvd, fails, dtype, 3 * n + 2, op, f"rs.scaled.{dtype}.{names[op]}",
                           width=(4,), prescale_factor=0.5, postscale_factor=3.0)
        _reducescatter(hvd, fails, dtype, 70001 * n + 3, hvd.Sum, f"rs.scaled-big.{dtype}",
                       prescale_factor=0.25, postscale_factor=2.0)
    for dtype in checks.FLOAT_DTYPES:
        for op in (hvd.Sum, hvd.Average):
            for dim0 in (1001, 300001 * n + 1):
                _reducescatter(hvd, fails, dtype, dim0, op,
                               f"rs.inexact.{dim0}.{dtype}.{names[op]}", inexact=True)
            _reducescatter(hvd, fails, dtype, 3001, op, f"rs.inexact-scaled.{dtype}.{names[op]}",
                           inexact=True, prescale_factor=0.3, postscale_factor=1.7)
    _interleaved(hvd, fails)
    _in_flight(hvd, fails)
    hvd.shutdown()
    return fails.raise_if_any(), fails.digests


def _interleaved(hvd, fails):
    """Ops of four kinds and changing sizes back to back: every op starts where the last one
    left the counters (Note [Host pipeline]), whatever its kind and chunk count."""
    n = hvd.size()
    for k, count in enumerate((5, 300001, 0, 17, 1 << 20, 3)):
        x = checks.make_input(np.float64, count, hvd.rank(), f"seq.ar.{k}")
        expected = checks.reference(checks.all_inputs(np.float64, count, n, f"seq.ar.{k}"),
                                    hvd.Sum)
        fails.check(f"seq.ar.{k}", checks.mismatch(hvd.allreduce(x, op=hvd.Sum,
                                                                 name=f"seq.ar.{k}"),
                                                   expected, np.float64, hvd.Sum))
        _alltoall(hvd, fails, np.int32, lambda s, c=count: [(c + s + d) // (d + 1)
                                                            for d in range(n)], f"seq.a2a.{k}")
        _reducescatter(hvd, fails, np.float32, count, hvd.Sum, f"seq.rs.{k}")
        out = hvd.allgather(np.full(count % 1000 + hvd.rank(), k, np.int16), name=f"seq.ag.{k}")
        fails.expect(f"seq.ag.{k}", out.size == sum(count % 1000 + r for r in range(n)))


def _in_flight(hvd, fails):
    """Several alltoalls and reducescatters submitted before any is waited for."""
    n, me = hvd.size(), hvd.rank()
    handles = []
    for i in range(6):
        rows = [100000 * (i % 3) + me + d for d in range(n)]
        x = np.full((sum(rows), 2), 10 * i + me, np.int32)
        handles.append(("a2a", i, hvd.alltoall_async(x, splits=rows, name=f"fl.a2a.{i}")))
        y = np.full(70001 * i + n, me + i, np.int64)
        handles.append(("rs", i, hvd.reducescatter_async(y, op=hvd.Sum, name=f"fl.rs.{i}")))
    for kind, i, h in handles:
        out = hvd.synchronize(h)
        if kind == "a2a":
            out, _ = out
            expected = np.concatenate([np.full((100000 * (i % 3) + r + me, 2), 10 * i + r,
                                               np.int32) for r in range(n)])
            fails.check(f"fl.a2a.{i}", checks.mismatch(out, expected, np.int32))
        else:
            lo, hi = _rows(70001 * i + n, n, me)
            fails.expect(f"fl.rs.{i}", out.size == hi - lo and
                         np.all(out == sum(r + i for r in range(n))), f"got {out[:4]}")


def _assert_paths(res, alltoall, reducescatter):
    for r in res:
        for op, path in (("alltoall", alltoall), ("reducescatter", reducescatter)):
            assert f"{op} via {path}" in r.stderr, f"rank {r.rank}: no {op} via {path}:\n" + \
                r.stderr[-3000:]
            for other in {SHM, PAIRWISE, RING} - {path}:
                assert f"{op} via {other}" not in r.stderr, f"rank {r.rank}: {op} via {other}"


def test_one_rank():
    res = run_ranks(collectives_suite, 1, args=("shm",), timeout=300, env=LOG)
    assert res[0].value[0] > 300  # the checks actually ran


# 2-4 ranks (the pair, an odd and an even world); 5 ranks: every collective in checks.WORLDS
@pytest.mark.parametrize("np_", [2, 3, 4])
def test_segment_matches_pairs_bit_for_bit(np_):
    """np ranks on one host through the segment, then over forced TCP (pairwise exchange and
    ring): both right against NumPy, and every result identical to the byte."""
    # the segment's algorithms for small ops too (not the one-round board, whose fold order
    # is its own: test_one_round checks its values)
    shm = run_ranks(collectives_suite, np_, args=("shm",), timeout=400,
                    env=dict(LOG, HVD_ONE_ROUND_BYTES="0"))
    _assert_paths(shm, SHM, SHM)
    tcp = run_ranks(collectives_suite, np_, args=("tcp",), timeout=400,
                    **checks.world_kwargs(np_, "tcp", dict(LOG, HVD_ONE_ROUND_BYTES="0")))
    _assert_paths(tcp, PAIRWISE, RING)
    for a, b in zip(shm, tcp):
        assert a.value[0] > 300 and a.value[0] == b.value[0]
        differ = sorted(k for k in a.value[1] if a.value[1][k] != b.value[1].get(k))
        assert not differ, f"rank {a.rank}: segment and pairs differ for {differ[:20]}"


@pytest.mark.parametrize("hosts", [["a", "a", "b"], ["a", "a", "b", "b", "c"]],
                         ids=["2+1", "2+2+1"])
def test_mixed_hosts_use_pairs(hosts):
    res = run_ranks(collectives_suite, len(hosts), args=("any",), timeout=400, hosts=hosts,
                    env=LOG)
    _assert_paths(res, PAIRWISE, RING)
    assert all(r.value[0] > 300 for r in res)


def subset_suite():
    """A process set without rank 1 of the host: no segment serves it (its counters would
    fall behind), so it goes over the pairs; the global set keeps using the segment."""
    hvd = checks.init("shm")
    fails = Failures()
    outer = hvd.add_process_set([0, 2])
    for k in range(2):
        if hvd.rank() in outer.ranks:
            _alltoall(hvd, fails, np.float32, lambda s: [300001 * s + d for d in range(2)],
                      f"sub.a2a.{k}", process_set=outer)
            _reducescatter(hvd, fails, np.float32, 1 << 20, hvd.Sum, f"sub.rs.{k}",
                           process_set=outer)
        _alltoall(hvd, fails, np.int64, lambda s: [100003 + s + d for d in range(3)],
                  f"all.a2a.{k}")
        _reducescatter(hvd, fails, np.float16, 500001, hvd.Average, f"all.rs.{k}")
    hvd.shutdown()
    return fails.raise_if_any()


def test_process_set_without_whole_host_uses_pairs():
    res = run_ranks(subset_suite, 3, timeout=200, env=LOG)
    _assert_paths([res[1]], SHM, SHM)
    for r in (res[0], res[2]):
        for op, path in (("alltoall", PAIRWISE), ("reducescatter", RING)):
            assert f"{op} via {path}" in r.stderr and f"{op} via {SHM}" in r.stderr, r.stderr
