"""Alltoall and allgather into shared outputs (issue #20; Note [Shared outputs] in
algo/shared_outputs.cc, transport/shm/shared_blocks.cc): where the ranks of a host may map each
other's memfds (probed at init, on by default), an alltoall or allgather whose largest transfer
is at least 64 KiB puts every rank's output in a shared block and each rank writes what it
sends straight into the receivers' outputs.

- np 1..5, every dtype, uneven splits with zero-size blocks and a rank that receives nothing
  (alltoall), uneven parts with a zero-size one (allgather):
  results equal NumPy's and, byte for byte, what HVD_SHARED_OUTPUTS=0 (the slots) and
  HVD_TRANSPORT=tcp give; metrics()["shared_output_ops"] proves which path ran;
- outputs kept alive land in blocks of their own (a later op never writes into an earlier
  output), and a loop's outputs reuse the pool's blocks, so peers map each block once;
- the probe: every rank agrees; HVD_SHARED_OUTPUTS=0 or a forced failure on one rank turns it
  off everywhere, the reason naming that rank; a rank that is non-dumpable from the start
  (a real EPERM, no test hook) does too;
- a cache of peers' mappings bounded below what one op needs never drops the op's own;
- a rank that may open few descriptors, with outputs kept alive: past its cap on live shared
  blocks every rank's ops take the slots, correctly, and write into outputs again once the
  outputs are dropped;
- a rank turning non-dumpable mid-job: its peers cannot map its next output, every rank's op
  ends with an error naming the cause or the rank, promptly, not at HVD_TIMEOUT.
"""
import ctypes
import hashlib
import time

import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import ALL_DTYPES, Failures
from multiproc.harness import run_ranks

BIG = 200 << 10  # bytes of the largest block: above the 64 KiB the shared path starts at


def _splits(r, n, unit):
    """Rows rank r sends to each rank: uneven, none to rank 1, and rank 2 gets nothing at all
    (when there is a rank 2), so some outputs are empty."""
    return [0 if (j == 1 or j == 2) and n > 2 else unit * ((r + j) % 3 + 1) for j in range(n)]


def exchanges(tag):
    hvd = checks.init("any")
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    digest = hashlib.sha256()
    before = hvd.metrics()["shared_output_ops"]
    for dtype in ALL_DTYPES:
        unit = BIG // (3 * 3 * np.dtype(dtype).itemsize) + 5  # 3 columns, up to 3 units

        def splits_of(r):
            return _splits(r, n, unit) if n > 1 else [unit]
        name = f"a2a.{dtype}"
        z = checks.make_input(dtype, (sum(splits_of(me)), 3), me, name)
        got, got_splits = hvd.alltoall(z, splits=splits_of(me), name=name)
        fails.check(name, checks.mismatch(
            got, checks.alltoall_expected(dtype, splits_of, me, n, name), dtype))
        fails.expect(f"{name}.splits", list(got_splits) == [splits_of(r)[me] for r in range(n)])
        digest.update(np.ascontiguousarray(got).tobytes())

        def rows_of(r):
            return 0 if r == 1 and n > 2 else 3 * unit + 11 * r
        name = f"ag.{dtype}"
        x = checks.make_input(dtype, (rows_of(me), 3), me, name)
        out = hvd.allgather(x, name=name)
        expected = np.concatenate([checks.make_input(dtype, (rows_of(r), 3), r, name)
                                   for r in range(n)])
        fails.check(name, checks.mismatch(out, expected, dtype))
        digest.update(np.ascontiguousarray(out).tobytes())
    m = hvd.metrics()
    hvd.shutdown()
    fails.raise_if_any()
    return digest.hexdigest(), m["shared_output_ops"] - before, m["shared_outputs"]


@pytest.mark.parametrize("np_", [1, 2, 3, 4, 5])
def test_shared_outputs_match_the_slots_and_tcp(np_):
    on = run_ranks(exchanges, np_, args=("on",), timeout=300)
    off = run_ranks(exchanges, np_, args=("off",), timeout=300, env={"HVD_SHARED_OUTPUTS": "0"})
    tcp = run_ranks(exchanges, np_, args=("tcp",), timeout=300, env={"HVD_TRANSPORT": "tcp"})
    for r in range(np_):
        digest, used, on_ = on[r].value
        assert digest == off[r].value[0], f"rank {r}: shared outputs and the slots differ"
        assert digest == tcp[r].value[0], f"rank {r}: shared outputs and tcp differ"
        assert off[r].value[1:] == (0, False) and tcp[r].value[1:] == (0, False)
        if np_ == 1:
            assert (used, on_) == (0, False)
        else:
            assert on_ and used == 2 * len(ALL_DTYPES), (r, used, on_)


def kept_and_looped(_):
    hvd = checks.init("shm")
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    kept = []
    for i in range(12):  # every output stays alive: each needs a block of its own
        count = (BIG >> 2) * (1 + i % 3) * n
        x = np.full(count, 1000 * i + me, np.float32)
        out, _ = hvd.alltoall(x, name=f"kept.{i}")
        kept.append((i, count, out))
    for i, count, out in kept:
        want = np.repeat(1000 * i + np.arange(n), count // n).astype(np.float32)
        fails.expect(f"kept.{i}", np.array_equal(out, want))
    maps_kept = hvd.metrics()["peer_block_maps"]
    del kept
    for i in range(30):  # a loop that drops each output: the pool hands back the same blocks
        x = np.full((BIG >> 2) * n, i + me, np.float32)
        out, _ = hvd.alltoall(x, name="loop")
        fails.expect(f"loop.{i}", np.array_equal(out, np.repeat(i + np.arange(n), BIG >> 2)
                                                 .astype(np.float32)))
        del out
    maps_loop = hvd.metrics()["peer_block_maps"] - maps_kept
    used = hvd.metrics()["shared_output_ops"]
    hvd.shutdown()
    fails.raise_if_any()
    return maps_kept, maps_loop, used


def test_kept_outputs_keep_their_blocks_and_a_loop_maps_each_block_once():
    n = 3
    for r in run_ranks(kept_and_looped, n, args=(None,), timeout=180):
        maps_kept, maps_loop, used = r.value
        assert used == 42, (r.rank, r.value)
        # the kept outputs: one block each, each mapped by this rank for each peer that
        # sends to it (the 12 blocks of each of the n - 1 peers)
        assert maps_kept >= 12 * (n - 1), (r.rank, r.value)
        # the loop: a few pool blocks per peer, mapped once each, not once per op
        assert maps_loop <= 4 * (n - 1), (r.rank, r.value)


def many_blocks_per_op(_):
    """allgathers whose outputs (3 x 1.5 MiB: 8 MiB blocks) are all kept, so every op writes
    into a new block of each peer, with each rank's cache of peers' mappings bounded (by
    HVD_TEST_PEER_BLOCK_CACHE_BYTES) below what one op needs: the op's own mappings must
    survive until it ends, older ones go."""
    hvd = checks.init("shm")
    n, me = hvd.size(), hvd.rank()
    fails = Failures()
    kept = []
    for i in range(6):
        x = np.full((3 << 20) // 8, 10 * i + me, np.float32)  # 1.5 MiB part per rank
        kept.append((i, hvd.allgather(x, name="g")))
    for i, out in kept:
        fails.expect(f"g.{i}", np.array_equal(out, np.repeat(10 * i + np.arange(n), (3 << 20) // 8)
                                              .astype(np.float32)))
    m = hvd.metrics()
    hvd.shutdown()
    fails.raise_if_any()
    return m["shared_output_ops"], m["peer_block_maps"]


def test_an_ops_own_mappings_outlive_a_cache_bound_it_exceeds():
    bound = {"HVD_TEST_PEER_BLOCK_CACHE_BYTES": str(8 << 20)}  # one peer's block
    for r in run_ranks(many_blocks_per_op, 3, args=(None,), timeout=120, env=bound):
        assert r.value == (6, 12), (r.rank, r.value)  # 6 ops x 2 peers' new blocks, all mapped


def few_descriptors(low_rank):
    """Rank `low_rank` may open few descriptors (RLIMIT_NOFILE 128: at most 16 live shared
    blocks), and every rank keeps its outputs alive: past that rank's cap its outputs are
    private, and every rank's ops take the slots instead, correctly; once the outputs are
    dropped, ops write into shared outputs again."""
    import resource

    import engine_native as hvd
    if int(__import__("os").environ["HVD_RANK"]) == low_rank:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(
            resource.RLIMIT_NOFILE)[1]))
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    fails = Failures()
    kept = []
    for i in range(30):
        x = np.full((BIG >> 2) * n, 100 * i + me, np.float32)
        out, _ = hvd.alltoall(x, name="kept")
        fails.expect(f"kept.{i}", np.array_equal(out, np.repeat(100 * i + np.arange(n),
                                                                 BIG >> 2).astype(np.float32)))
        kept.append(out)
    m = hvd.metrics()
    kept_ops, kept_fallbacks = m["shared_output_ops"], m["shared_output_fallbacks"]
    del kept, out
    for i in range(5):
        x = np.full((BIG >> 2) * n, i + me, np.float32)
        y, _ = hvd.alltoall(x, name="after")
        fails.expect(f"after.{i}", np.array_equal(y, np.repeat(i + np.arange(n), BIG >> 2)
                                                  .astype(np.float32)))
    m = hvd.metrics()
    hvd.shutdown()
    fails.raise_if_any()
    return kept_ops, kept_fallbacks, m["shared_output_ops"] - kept_ops


def test_outputs_past_a_ranks_descriptor_cap_take_the_slots_on_every_rank():
    for r in run_ranks(few_descriptors, 3, args=(1,), timeout=120):
        kept_ops, kept_fallbacks, after_ops = r.value
        # rank 1's cap is 128 / 8 = 16 live blocks: 16 ops wrote into the outputs, the other
        # 14 fell back, the same counts on every rank
        assert (kept_ops, kept_fallbacks) == (16, 14), (r.rank, r.value)
        assert after_ops == 5, (r.rank, r.value)


def probe_report(_):
    import engine_native as hvd
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    x = np.full((BIG >> 2) * n, me, np.float32)
    out, _ = hvd.alltoall(x, name="a")
    ok = bool(np.array_equal(out, np.repeat(np.arange(n), BIG >> 2).astype(np.float32)))
    m = hvd.metrics()
    hvd.shutdown()
    return m["shared_outputs"], m["shared_outputs_reason"], m["shared_output_ops"], ok


@pytest.mark.parametrize("var,value,words", [
    ("HVD_TEST_SHARED_OUTPUTS_PROBE_FAIL", "1", "failed its probe on purpose"),
    ("HVD_SHARED_OUTPUTS", "0", "has HVD_SHARED_OUTPUTS=0"),
])
def test_one_rank_refusing_turns_it_off_everywhere(var, value, words):
    odd = 2
    res = run_ranks(probe_report, 4, args=(None,), timeout=120, rank_env={odd: {var: value}})
    for r in res:
        on, reason, used, ok = r.value
        assert ok and not on and used == 0, (r.rank, r.value)
        assert words in reason and f"rank {odd}" in reason, (r.rank, reason)
    agreed = run_ranks(probe_report, 3, args=(None,), timeout=120)
    assert all(r.value == (True, "", 1, True) for r in agreed), [r.value for r in agreed]


def undumpable_from_the_start(which):
    checks.drop_ptrace_capability()
    if int(__import__("os").environ["HVD_RANK"]) == which:
        assert ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
    return probe_report(None)


def test_a_non_dumpable_rank_turns_it_off_everywhere_with_eperm():
    which = 1
    for r in run_ranks(undumpable_from_the_start, 3, args=(which,), timeout=120):
        on, reason, used, ok = r.value
        assert ok and not on and used == 0, (r.rank, r.value)
        assert f"may not map rank {which}'s blocks (EPERM" in reason, (r.rank, reason)


def undumpable_mid_job(owner):
    import engine_native as hvd
    checks.drop_ptrace_capability()
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    assert hvd.metrics()["shared_outputs"]
    if me == owner:
        assert ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
    hvd.allreduce(np.ones(4), name="after-prctl")  # every rank is past it
    x = np.full((BIG >> 2) * n, me, np.float32)
    start = time.monotonic()
    try:
        hvd.alltoall(x, name="big")
    except hvd.HorovodInternalError as exc:
        return str(exc), time.monotonic() - start
    return None, time.monotonic() - start


def test_a_peer_that_cannot_be_mapped_mid_job_ends_the_op_on_every_rank():
    owner = 1
    res = run_ranks(undumpable_mid_job, 2, args=(owner,), timeout=120, check=False,
                    env={"HVD_TIMEOUT": "60"})
    for r in res:
        assert r.ok, r.describe()
        error, took = r.value
        assert error is not None, f"rank {r.rank}: no error after {took} s"
        assert took < 10, f"rank {r.rank}: {error!r} only after {took} s"
        if r.rank == owner:
            assert "rank 0 of this host could not write into its peers' outputs" in error, error
        else:
            assert "alltoall into the peers' outputs" in error and "EPERM" in error, error
