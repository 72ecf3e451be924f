"""Single-copy reads between ranks of one host (issue #20 part 3: transport/shm/cross_memory.cc,
algo/single_copy.cc): broadcast, allgather and alltoall at >= HVD_SINGLE_COPY_MIN_BYTES per
transfer (256 KiB here) read the peers' inputs with process_vm_readv instead of copying through
the segment's slots.

- np 1..5, every dtype, uneven splits with zero-size parts, in place and not: results equal
  NumPy's, and equal what HVD_SINGLE_COPY=0 (the slot path) and HVD_TRANSPORT=tcp give (each
  rank returns a digest of every output; the three runs must agree byte for byte);
  metrics()["single_copy_ops"] proves which path ran (> 0 with it, 0 without), and
  metrics()["helper_reads"] that a broadcast of at least 1 MiB was read on two threads where
  the host has two CPUs per reader (Note [Two-thread reads]: np=2 here) and on one elsewhere,
  also where fake hosts of two ranks share two CPUs (the machine's ranks outnumber them);
- a process set (a subset of the host's ranks keeps the pairs; the whole host's set reads);
- the setup probe: every rank agrees, HVD_SINGLE_COPY=0 on one rank or a probe forced to fail
  on one rank (HVD_TEST_SINGLE_COPY_PROBE_FAIL=1) turns it off on every rank, and
  metrics()["host_copy_reason"] names that rank; with it off on a rank no probe runs at all
  (metrics()["single_copy_probes"] == 0) and every rank takes the slots; the default (auto)
  reads only broadcasts directly, and only where every rank would read them on two threads
  (else no probe either); on one rank and auto on another: broadcasts only; the setting is
  auto or a bool in any spelling, anything else warned about and read as auto;
- a real EPERM: one rank non-dumpable (prctl(PR_SET_DUMPABLE, 0), CAP_SYS_PTRACE dropped so
  root meets the same rule) turns it off on every rank, the reason naming EPERM and the rank;
- faults (a failed read, a slow reader, abort, a killed owner): test_single_copy_faults.py.
"""
import hashlib
import os

import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import ALL_DTYPES, Failures
from multiproc.harness import run_ranks

BIG = 300 << 10  # above the threshold these tests set (the default, 16 MiB, is too slow here)
ON = {"HVD_SINGLE_COPY": "1"}  # every op (the default, auto: broadcasts where they pay)
LOW = {**ON, "HVD_SINGLE_COPY_MIN_BYTES": str(256 << 10)}


def _rows(dtype, i, n):
    """Rows (of 3 elements) of set rank i: zero on rank 1, largest on the last, all > BIG
    except the zero part."""
    per_row = 3 * np.dtype(dtype).itemsize
    if n > 1 and i == 1:
        return 0
    return BIG // per_row + 1 + 7 * i + (BIG // per_row if i == n - 1 else 0)


def collectives(tag):
    hvd = checks.init("any")
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    digest = hashlib.sha256()
    before = hvd.metrics()["single_copy_ops"]
    helped = hvd.metrics()["helper_reads"]
    for dtype in ALL_DTYPES:
        # allgather, uneven with a zero-size part
        name = f"ag.{dtype}"
        x = checks.make_input(dtype, (_rows(dtype, me, n), 3), me, name)
        out = hvd.allgather(x, name=name)
        expected = np.concatenate([checks.make_input(dtype, (_rows(dtype, r, n), 3), r, name)
                                   for r in range(n)])
        fails.check(name, checks.mismatch(out, expected, dtype))
        digest.update(np.ascontiguousarray(out).tobytes())
        # broadcast from every root
        count = BIG // np.dtype(dtype).itemsize + 13
        for root in range(n):
            name = f"bc.{dtype}.{root}"
            y = checks.make_input(dtype, count, me, name)
            out = hvd.broadcast(y, root, name=name)
            fails.check(name, checks.mismatch(out, checks.make_input(dtype, count, root, name),
                                              dtype))
            digest.update(out.tobytes())
        # alltoall, uneven: rank me sends (me + j) % 3 blocks of `unit` rows to j, none to j==1
        unit = BIG // (3 * np.dtype(dtype).itemsize) + 5

        def splits_of(r):
            return [0 if j == 1 and n > 1 else unit * ((r + j) % 3 + 1) for j in range(n)]
        name = f"a2a.{dtype}"
        z = checks.make_input(dtype, (sum(splits_of(me)), 3), me, name)
        got, got_splits = hvd.alltoall(z, splits=splits_of(me), name=name)
        fails.check(name, checks.mismatch(
            got, checks.alltoall_expected(dtype, splits_of, me, n, name), dtype))
        fails.expect(f"{name}.splits", list(got_splits) == [splits_of(r)[me] for r in range(n)])
        digest.update(np.ascontiguousarray(got).tobytes())
    # from every root, a broadcast large enough to be read on two threads where that pays
    # (Note [Two-thread reads]: at least 1 MiB)
    for root in range(n):
        name = f"bc.two.{root}"
        y = checks.make_input(np.float32, (2 << 20) // 4 + 5, me, name)
        out = hvd.broadcast(y, root, name=name)
        fails.check(name, checks.mismatch(out, checks.make_input(np.float32, y.size, root, name),
                                          np.float32))
        digest.update(out.tobytes())
    used = hvd.metrics()["single_copy_ops"] - before
    mode = hvd.metrics()["host_copy"]
    helped = hvd.metrics()["helper_reads"] - helped
    # Note [Two-thread reads]: a broadcast's reader reads on two threads where the host has two
    # CPUs per reader (ranks are bound by default only where they outnumber the CPUs, so
    # never there); this rank read the other roots' "bc.two"
    two_threads = n > 1 and 2 * (n - 1) <= len(os.sched_getaffinity(0))
    hvd.shutdown()
    fails.raise_if_any()
    return digest.hexdigest(), used, mode, helped, two_threads


# 2-4 ranks (the pair, an odd and an even world); 5 ranks: every collective in checks.WORLDS
@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_single_copy_matches_the_slot_path_and_tcp(np_):
    on = run_ranks(collectives, np_, args=("on",), timeout=300, env=LOW)
    off = run_ranks(collectives, np_, args=("off",), timeout=300,
                    env={**LOW, "HVD_SINGLE_COPY": "0"})
    if np_ >= 2:
        tcp = run_ranks(collectives, np_, args=("tcp",), timeout=300,
                        env={**LOW, "HVD_TRANSPORT": "tcp"})
    for r in range(np_):
        digest, used, mode, helped, two_threads = on[r].value
        assert digest == off[r].value[0], f"rank {r}: single-copy and slot path differ"
        if np_ == 1:
            assert used == 0 and mode == "none" and helped == 0
            continue
        assert digest == tcp[r].value[0], f"rank {r}: single-copy and tcp differ"
        assert mode == "single-copy" and used > 0, (r, mode, used)
        # one helper read per "bc.two" this rank read, from each of the np - 1 other roots
        assert helped == (np_ - 1 if two_threads else 0), (r, helped)
        assert off[r].value[1:4] == (0, "segment", 0)
        assert tcp[r].value[1:4] == (0, "none", 0)


def subset_and_whole(_):
    hvd = checks.init("shm")
    n, me = hvd.size(), hvd.rank()
    fails = Failures()
    odd = hvd.add_process_set([r for r in range(n) if r % 2 == 1])
    count = (BIG >> 2) + 9
    before = hvd.metrics()["single_copy_ops"]
    if me % 2 == 1:
        out = hvd.allgather(np.full(count, me, np.float32), name="odd", process_set=odd)
        fails.expect("odd", np.array_equal(out, np.repeat(np.arange(1, n, 2), count)
                                           .astype(np.float32)))
    subset_ops = hvd.metrics()["single_copy_ops"] - before
    out = hvd.allgather(np.full(count, me, np.float32), name="all")
    fails.expect("all", np.array_equal(out, np.repeat(np.arange(n), count).astype(np.float32)))
    whole_ops = hvd.metrics()["single_copy_ops"] - before - subset_ops
    hvd.shutdown()
    fails.raise_if_any()
    return subset_ops, whole_ops


def test_process_set_subset_keeps_the_pairs_whole_host_reads():
    res = run_ranks(subset_and_whole, 4, args=(None,), timeout=120, env=LOW)
    for r in res:
        assert r.value == (0, 1), (r.rank, r.value)


def probe_report(_):
    import engine_native as hvd
    hvd.init()
    m = hvd.metrics()
    count = (BIG >> 2) + 9
    out = hvd.broadcast(np.full(count, hvd.rank(), np.float32), 0, name="b")
    ok = bool(np.all(out == 0))
    used = hvd.metrics()["single_copy_ops"]
    hvd.shutdown()
    return m["host_copy"], m["host_copy_reason"], used, ok


@pytest.mark.parametrize("var,value,words", [
    ("HVD_TEST_SINGLE_COPY_PROBE_FAIL", "1", "failed its probe on purpose"),
    ("HVD_SINGLE_COPY", "0", "has HVD_SINGLE_COPY off"),
])
def test_one_rank_refusing_turns_it_off_everywhere(var, value, words):
    odd = 2
    res = run_ranks(probe_report, 4, args=(None,), timeout=120, env=LOW,
                    rank_env={odd: {var: value}})
    for r in res:
        mode, reason, used, ok = r.value
        assert ok and mode == "segment" and used == 0, (r.rank, r.value)
        assert words in reason and f"rank {odd}" in reason, (r.rank, reason)
    agreed = run_ranks(probe_report, 3, args=(None,), timeout=120, env=LOW)
    assert all(r.value == ("single-copy", "", 1, True) for r in agreed), [r.value for r in agreed]


def test_the_leaders_threshold_holds_for_the_host():
    """Rank 0 (the host's leader) lowers HVD_SINGLE_COPY_MIN_BYTES, the others keep 16 MiB: all
    take the single-copy path for the 300 KiB broadcast (one threshold per host)."""
    res = run_ranks(probe_report, 3, args=(None,), timeout=120, env=ON, rank_env={0: LOW})
    assert all(r.value == ("single-copy", "", 1, True) for r in res), [r.value for r in res]
    # and the default threshold keeps that broadcast on the slots
    res = run_ranks(probe_report, 2, args=(None,), timeout=120, env=ON)
    assert all(r.value == ("single-copy", "", 0, True) for r in res), [r.value for r in res]


def probes_run(_):
    import engine_native as hvd
    hvd.init()
    count = (BIG >> 2) + 9
    out = hvd.broadcast(np.full(count, hvd.rank(), np.float32), 0, name="b")
    m = hvd.metrics()
    hvd.shutdown()
    return (m["host_copy"], m["host_copy_reason"], m["single_copy_probes"],
            m["single_copy_ops"], bool(np.all(out == 0)))


def default_paths(_):
    """A broadcast and an allgather at the default threshold (16 MiB a transfer): which path
    each took, and the host's verdict. Every rank runs on the same two CPUs, as on the 2-vCPU
    test VM, whatever this machine has: two ranks do not outnumber them, three do."""
    import engine_native as hvd
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:2]))
    hvd.init()
    count = (16 << 20) // 4 + 9
    out = hvd.broadcast(np.full(count, hvd.rank(), np.float32), 0, name="b")
    broadcast_ops = hvd.metrics()["single_copy_ops"]
    gathered = hvd.allgather(np.full(count, hvd.rank(), np.float32), name="g")
    m = hvd.metrics()
    ok = bool(np.all(out == 0)) and bool(np.array_equal(
        gathered, np.repeat(np.arange(hvd.size()), count).astype(np.float32)))
    hvd.shutdown()
    return (m["host_copy"], m["host_copy_reason"], m["single_copy_probes"], broadcast_ops,
            m["single_copy_ops"] - broadcast_ops, ok)


@pytest.mark.parametrize("np_", [2, 3])
def test_the_default_reads_broadcasts_directly_where_every_reader_has_two_cpus(np_):
    """HVD_SINGLE_COPY=auto (the default): a host whose ranks would all read a broadcast on two
    threads probes once and reads broadcasts directly, allgather still through the slots; one
    where they would not (np=3 on 2 CPUs) sends no probe message and takes the slots, the
    reason saying so."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    res = run_ranks(default_paths, np_, args=(None,), timeout=120)
    for r in res:
        mode, reason, probes, broadcast_ops, other_ops, ok = r.value
        assert ok and other_ops == 0, (r.rank, r.value)
        if np_ == 2:
            assert (mode, probes, broadcast_ops) == ("single-copy broadcast", 1, 1), r.value
            assert "rank 0 has HVD_SINGLE_COPY=auto (the default): broadcasts only" in reason
        else:
            assert (mode, probes, broadcast_ops) == ("segment", 0, 0), (r.rank, r.value)
            assert "rank 0 would read a broadcast on one thread" in reason, (r.rank, reason)
    # on everywhere: exactly one probe per process, and every op reads directly
    res = run_ranks(probes_run, 3, args=(None,), timeout=120, env=LOW)
    assert all(r.value == ("single-copy", "", 1, 1, True) for r in res), [r.value for r in res]


def setting_read(_):
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:2]))
    import engine_native as hvd
    hvd.init()
    mode = hvd.metrics()["host_copy"]
    hvd.shutdown()
    return mode


@pytest.mark.parametrize("value,mode", [
    ("YES", "single-copy"), ("on", "single-copy"), ("Off", "segment"), ("false", "segment"),
    ("AUTO", "single-copy broadcast"), ("bogus", "single-copy broadcast"),
])
def test_the_setting_is_read_as_auto_or_a_bool(value, mode):
    """HVD_SINGLE_COPY takes auto or any of the core's bool spellings, in any case; anything
    else is warned about and read as auto (two ranks on two CPUs: auto reads broadcasts)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    res = run_ranks(setting_read, 2, args=(None,), timeout=60, env={"HVD_SINGLE_COPY": value})
    assert [r.value for r in res] == [mode, mode]
    if value == "bogus":
        assert "HVD_SINGLE_COPY='bogus' is not valid (expected auto, or one of" in res[0].stderr


@pytest.mark.parametrize("on_rank,off_rank", [(1, 0), (0, 1)])
def test_mixed_setting_agrees_on_the_segment_without_a_probe(on_rank, off_rank):
    """One rank asks for single-copy, the others have it off: every rank takes the slot
    path (no hang: they all agree), no rank probes, the reason names the first rank that is off."""
    res = run_ranks(probes_run, 3, args=(None,), timeout=120,
                    env={"HVD_SINGLE_COPY_MIN_BYTES": str(256 << 10), "HVD_SINGLE_COPY": "0"},
                    rank_env={on_rank: ON})
    for r in res:
        mode, reason, probes, used, ok = r.value
        assert (mode, probes, used, ok) == ("segment", 0, 0, True), (r.rank, r.value)
        assert f"rank {off_rank} has HVD_SINGLE_COPY off" in reason, (r.rank, reason)


def test_one_rank_on_and_one_on_auto_read_broadcasts_only():
    """HVD_SINGLE_COPY=1 on rank 0, auto on rank 1: the host takes the lesser scope."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    res = run_ranks(default_paths, 2, args=(None,), timeout=120, rank_env={0: ON})
    for r in res:
        mode, reason, probes, broadcast_ops, other_ops, ok = r.value
        assert (mode, probes, broadcast_ops, other_ops, ok) == \
            ("single-copy broadcast", 1, 1, 0, True), (r.rank, r.value)
        assert "rank 1 has HVD_SINGLE_COPY=auto" in reason, (r.rank, reason)


def undumpable_rank(which):
    """Rank `which` makes itself non-dumpable before init (prctl(PR_SET_DUMPABLE, 0)), so the
    kernel refuses its peers' process_vm_readv with EPERM: a real refusal, no test hook."""
    import ctypes
    checks.drop_ptrace_capability()
    if int(os.environ["HVD_RANK"]) == which:
        assert ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
    return probes_run(None)


def test_a_non_dumpable_rank_turns_it_off_everywhere_with_eperm():
    which = 2
    res = run_ranks(undumpable_rank, 4, args=(which,), timeout=120, env=LOW)
    for r in res:
        mode, reason, probes, used, ok = r.value
        assert (mode, probes, used, ok) == ("segment", 1, 0, True), (r.rank, r.value)
        assert f"may not read rank {which}'s memory (EPERM" in reason, (r.rank, reason)


def misaddressed_peer(victim):
    """Rank 0's core is told by the bootstrap that rank `victim` runs in rank 0's own process;
    rank `victim`'s real pid must not reach rank 0's reads by any other way."""
    import engine_native as hvd
    from engine_native import bootstrap
    real_init = bootstrap._core.init

    def init(rank, peers, secret, job_id):
        if rank == 0:
            peers = [tuple(p) for p in peers]
            peers[victim] = (*peers[victim][:3], os.getpid(), *peers[victim][4:])
        return real_init(rank, peers, secret, job_id)

    bootstrap._core.init = init
    hvd.init()
    m = hvd.metrics()
    hvd.shutdown()
    return m["host_copy"], m["host_copy_reason"], m["shared_outputs"], m["shared_outputs_reason"]


def test_peers_are_addressed_by_the_pid_the_bootstrap_announced():
    """Issue #35: process_vm_readv and pidfd_getfd address the pid fixed at bootstrap, never one
    read from the segment (which any process mapping it could rewrite). Rank 0 believes rank 1
    is itself, so both probes look into the wrong process and turn their path off everywhere;
    a core that took the pid from the segment (as before) passes both probes and fails this."""
    victim = 1
    res = run_ranks(misaddressed_peer, 2, args=(victim,), timeout=120, env=LOW)
    for r in res:
        copy, copy_reason, outputs, outputs_reason = r.value
        assert copy == "segment" and f"rank {victim}" in copy_reason, (r.rank, r.value)
        assert not outputs and f"rank {victim}" in outputs_reason, (r.rank, r.value)


def outnumbered_broadcast():
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:2]))
    hvd = checks.init("hosts:A,A,B,B")
    y = checks.make_input(np.float32, (2 << 20) // 4 + 5, hvd.rank(), "bc")
    out = hvd.broadcast(y, 0, name="bc")
    m = hvd.metrics()
    hvd.shutdown()
    return bool(np.array_equal(out, checks.make_input(np.float32, y.size, 0, "bc"))), \
        m["single_copy_ops"], m["helper_reads"], m["spin_yields"]


def test_no_two_thread_read_where_fake_hosts_outnumber_their_machines_cpus():
    # Two fake hosts of two ranks on two CPUs: each host has a CPU per reader and then some,
    # but the machine's four ranks have two (Note [Two-thread reads]).
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    res = run_ranks(outnumbered_broadcast, 4, hosts=["A", "A", "B", "B"], timeout=120, env=LOW)
    assert [r.value[0] for r in res] == [True] * 4
    assert [(r.value[1] > 0, r.value[2], r.value[3]) for r in res] == [(True, 0, True)] * 4
