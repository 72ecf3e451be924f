"""Allreduce algorithm paths picked by algo/allreduce.cc, each checked against NumPy.

- shm: the host collective segment pipeline (one host, np 2..5), every dtype and op, sizes
  0, 1, fewer elements than ranks, odd, both sides of the one-round threshold, and many chunks
  per block (slots reused within an op and across ops, fused batches);
- small: one-round direct exchange (HVD_TRANSPORT=tcp, one fake host per rank; and over shm
  pairs for a process set that leaves out a rank of the host, so no segment serves it);
- hierarchical: HVD_HIERARCHICAL_ALLREDUCE=1 with fake hosts 2+2 (segment and tcp-only
  intra-host), and uneven 2+1+2;
- ring: forced TCP at sizes above the small-message bound.
Every test also asserts that the path it covers was taken (the dispatcher logs each pick once
at info) and that all ranks got identical bits (each block is reduced by one rank only).
"""
import hashlib

import numpy as np
import pytest

from multiproc import checks, faults
from multiproc.checks import ALL_DTYPES, Failures
from multiproc.harness import run_ranks

PIECE_BYTES = 256 << 10  # the host pipeline's piece: a chunk is (ranks on the host) pieces
WHOLE_BYTES = 8 << 10    # at or below: the shm pipeline's one-round form
SMALL_BYTES = 16 << 10   # at or below: direct exchange (when (n-1) x size <= 256 KiB)
LOG = {"env": {"HVD_LOG": "info"}}


def _one(hvd, fails, digests, dtype, op, count, name, process_set=None):
    dtype = np.dtype(dtype)
    prod = op == hvd.Product
    members = process_set.ranks if process_set is not None else list(range(hvd.size()))
    x = checks.make_input(dtype, count, hvd.rank(), name, prod)
    kw = {} if process_set is None else {"process_set": process_set}
    out = hvd.allreduce(x, op=op, name=name, **kw)
    expected = checks.reference([checks.make_input(dtype, count, r, name, prod)
                                 for r in members], op)
    fails.check(name, checks.mismatch(out, expected, dtype, op))
    digests[name] = hashlib.sha1(out.tobytes()).hexdigest()


def _many_chunks(dtype, n, extra=3):
    """An odd count whose every block spans more chunks than the segment has slots (4)."""
    return (5 * PIECE_BYTES * n) // dtype.itemsize + 2 * n + extra


def _sweep(hvd, fails, digests, counts, tag, process_set=None):
    names = checks.op_names()
    for dtype in ALL_DTYPES:
        for op in checks.ops_for(dtype):
            for count in counts(dtype):
                _one(hvd, fails, digests, dtype, op, count, f"{tag}.{dtype}.{names[op]}.{count}",
                     process_set)


def _fused(hvd, fails, digests, tag):
    """Many small ops at once: fused into one buffer by the runtime, in any order."""
    cases = [(f"{tag}.fused.{dtype}.{k}", dtype) for dtype in ALL_DTYPES for k in range(2)]
    handles = {}
    for name, dtype in cases:
        op = hvd.Max if dtype == checks.BOOL else hvd.Sum
        handles[name] = (hvd.allreduce_async(checks.make_input(dtype, 333, hvd.rank(), name),
                                             op=op, name=name), dtype, op)
    for name, (handle, dtype, op) in handles.items():
        out = hvd.synchronize(handle)
        ref = checks.reference(checks.all_inputs(dtype, 333, hvd.size(), name), op)
        fails.check(name, checks.mismatch(out, ref, dtype, op))
        digests[name] = hashlib.sha1(out.tobytes()).hexdigest()


def shm_suite():
    hvd = checks.init("shm")
    fails, digests = Failures(), {}
    n = hvd.size()

    def counts(dtype):
        whole = WHOLE_BYTES // dtype.itemsize
        return (0, 1, n - 1, 1001, whole, whole + 1)

    _sweep(hvd, fails, digests, counts, "shm")
    names = checks.op_names()
    for i, dtype in enumerate(ALL_DTYPES):  # many chunks: every dtype, ops rotating
        ops = checks.ops_for(dtype)
        op = ops[i % len(ops)]
        count = _many_chunks(np.dtype(dtype), n)
        _one(hvd, fails, digests, dtype, op, count, f"shm.chunks.{dtype}.{names[op]}")
    for op in checks.ops_for(np.dtype(np.float32)):  # and every op once
        _one(hvd, fails, digests, np.float32, op, _many_chunks(np.dtype(np.float32), n, 11),
             f"shm.chunks.float32.all.{names[op]}")
    # Back-to-back ops of changing sizes: chunk numbers carry over between ops.
    for k, count in enumerate((5, 70001, 3, 400003, 0, 17, 250001)):
        _one(hvd, fails, digests, np.float64, hvd.Sum, count, f"shm.seq.{k}")
    _fused(hvd, fails, digests, "shm")
    hvd.shutdown()
    return fails.raise_if_any(), digests


def _assert_path(res, path, absent=()):
    for r in res:
        assert f"allreduce via {path}" in r.stderr, f"rank {r.rank} did not use {path}:\n" + \
            r.stderr[-3000:]
        for other in absent:
            assert f"allreduce via {other}" not in r.stderr, f"rank {r.rank} used {other}"


def _assert_same_bits(res):
    first = res[0].value[1]
    for r in res[1:]:
        differ = [k for k, v in r.value[1].items() if first.get(k) != v]
        assert not differ, f"rank {r.rank} differs from rank 0 on {differ[:5]}"


# 2-4 ranks (the pair, an odd and an even world); 5 ranks: every collective in checks.WORLDS
@pytest.mark.parametrize("np_", [2, 3, 4])
def test_shm_pipeline(np_):
    res = run_ranks(shm_suite, np_, timeout=400, **LOG)
    _assert_path(res, "shm", absent=("ring", "small", "hierarchical"))
    _assert_same_bits(res)
    assert all(r.value[0] > 300 for r in res)  # the checks actually ran


def small_suite():
    hvd = checks.init("tcp")
    fails, digests = Failures(), {}
    _sweep(hvd, fails, digests, lambda d: (1, hvd.size() + 1, 1001, SMALL_BYTES // d.itemsize),
           "small")
    _fused(hvd, fails, digests, "small")
    hvd.shutdown()
    return fails.raise_if_any(), digests


@pytest.mark.parametrize("np_", [2, 3, 5])
def test_small_message_path_over_tcp(np_):
    res = run_ranks(small_suite, np_, timeout=300,
                    **checks.world_kwargs(np_, "tcp", {"HVD_LOG": "info"}))
    _assert_path(res, "small", absent=("shm", "hierarchical"))
    _assert_same_bits(res)


def subset_suite():
    """A process set that leaves out a rank of the host: no segment serves it, so its ops go
    over the shm pairs (small, then ring); the global set keeps using the segment."""
    hvd = checks.init("shm")
    fails, digests = Failures(), {}
    outer = hvd.add_process_set([0, 2])
    for k in range(2):
        if hvd.rank() in outer.ranks:
            for count in (1, 1001, 300001):
                _one(hvd, fails, digests, np.float32, hvd.Sum, count, f"subset.{k}.{count}",
                     outer)
        for count in (7, 300001):
            _one(hvd, fails, digests, np.int32, hvd.Sum, count, f"global.{k}.{count}")
    hvd.shutdown()
    return fails.raise_if_any(), digests


def test_process_set_without_whole_host_uses_pairs():
    res = run_ranks(subset_suite, 3, timeout=200, **LOG)
    _assert_path(res, "shm")
    _assert_path([res[0], res[2]], "small")
    _assert_path([res[0], res[2]], "ring")
    assert res[0].value[1] == res[2].value[1]


def stopped_peer_suite(pid_dir):
    """The last rank stops (SIGSTOP) inside a long shm allreduce: the others must fail with a
    timeout naming it after about HVD_TIMEOUT, not hang and not blame another rank."""
    hvd = checks.init("shm")
    big = np.ones(64 << 20, np.float32)  # 256 MiB: long enough to stop a rank inside the op
    hvd.allreduce(np.ones(4), op=hvd.Sum, name="warm-up")
    result = faults.hung_peer(hvd, hvd.size() - 1, pid_dir,
                              lambda name: hvd.allreduce(big, op=hvd.Sum, name=name),
                              lambda name: hvd.allreduce_async(big, op=hvd.Sum, name=name))
    hvd.shutdown()
    return result


@pytest.mark.parametrize("np_", [2, 3])
def test_stopped_peer_times_out_inside_the_shm_pipeline(np_, tmp_path):
    timeout = 3.0
    res = run_ranks(stopped_peer_suite, np_, args=(str(tmp_path),), timeout=120, check=False,
                    env={"HVD_TIMEOUT": str(timeout), "HVD_LOG": "info"})
    for rank, took in faults.assert_hung_peer_named(res, timeout).items():
        assert took > 0.9 * timeout, f"rank {rank}: timed out after {took} s"
    _assert_path(res[:-1], "shm")


def declined_suite():
    hvd = checks.init("any")
    fails, digests = Failures(), {}
    for count in (3, 1001, 300001):
        _one(hvd, fails, digests, np.float32, hvd.Sum, count, f"declined.{count}")
    hvd.shutdown()
    return fails.raise_if_any(), digests


def test_one_rank_declining_shm_disables_the_segment_for_the_host():
    res = run_ranks(declined_suite, 3, timeout=200, rank_env={1: {"HVD_TRANSPORT": "tcp"}},
                    **LOG)
    _assert_path(res, "ring", absent=("shm",))
    _assert_same_bits(res)


def hierarchical_suite():
    import engine_native as hvd
    hvd.init()
    fails, digests = Failures(), {}
    names = checks.op_names()
    n = hvd.size()
    above_small = SMALL_BYTES // 4 + 1
    for dtype in (np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.float16), checks.BOOL):
        for op in checks.ops_for(dtype):
            for count in (1, above_small * 4 // dtype.itemsize + n, _many_chunks(dtype, 2)):
                _one(hvd, fails, digests, dtype, op, count, f"hier.{dtype}.{names[op]}.{count}")
    for dtype in ALL_DTYPES:
        op = hvd.Max if dtype == checks.BOOL else hvd.Sum
        _one(hvd, fails, digests, dtype, op, 70001, f"hier.all.{dtype}")
    _fused(hvd, fails, digests, "hier")
    hvd.shutdown()
    return fails.raise_if_any(), digests


HIER_ENV = {"HVD_HIERARCHICAL_ALLREDUCE": "1", "HVD_LOG": "info"}


@pytest.mark.parametrize("hosts, transport", [
    (["hA", "hA", "hB", "hB"], "auto"),
    (["hA", "hA", "hB", "hB"], "tcp"),
    (["hA", "hA", "hB", "hC", "hC"], "auto"),
], ids=["2x2-shm", "2x2-tcp", "2+1+2-shm"])
def test_hierarchical(hosts, transport):
    env = dict(HIER_ENV, HVD_TRANSPORT=transport)
    res = run_ranks(hierarchical_suite, len(hosts), env=env, hosts=hosts, timeout=400)
    _assert_path(res, "hierarchical", absent=("shm",))
    _assert_path(res, "small")
    _assert_same_bits(res)
    segment_lines = [r for r in res if "host collective segment" in r.stderr]
    if transport == "tcp":
        assert not segment_lines, "HVD_TRANSPORT=tcp must not map a host collective segment"
    else:
        assert len(segment_lines) == sum(hosts.count(h) for h in set(hosts) if hosts.count(h) > 1)


def ring_suite():
    hvd = checks.init("tcp")
    fails, digests = Failures(), {}
    names = checks.op_names()
    for i, dtype in enumerate(ALL_DTYPES):
        op = checks.ops_for(dtype)[i % len(checks.ops_for(dtype))]
        for count in (SMALL_BYTES // dtype.itemsize + 1, _many_chunks(dtype, hvd.size())):
            _one(hvd, fails, digests, dtype, op, count, f"ring.{dtype}.{names[op]}.{count}")
    hvd.shutdown()
    return fails.raise_if_any(), digests


@pytest.mark.parametrize("np_", [2, 4])
def test_ring_over_forced_tcp(np_):
    res = run_ranks(ring_suite, np_, timeout=300,
                    **checks.world_kwargs(np_, "tcp", {"HVD_LOG": "info"}))
    _assert_path(res, "ring", absent=("shm", "hierarchical"))
    _assert_same_bits(res)
