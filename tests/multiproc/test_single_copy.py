"""Single-copy reads between ranks of one host (issue #20 part 3: transport/shm/cross_memory.cc,
algo/single_copy.cc): broadcast, allgather and alltoall at >= HVD_SINGLE_COPY_MIN_BYTES per
transfer (256 KiB here) read the peers' inputs with process_vm_readv instead of copying through
the segment's slots.

- np 1..5, every dtype, uneven splits with zero-size parts, in place and not: results equal
  NumPy's, and equal what HVD_SINGLE_COPY=0 (the slot path) and HVD_TRANSPORT=tcp give (each
  rank returns a digest of every output; the three runs must agree byte for byte);
  metrics()["single_copy_ops"] proves which path ran (> 0 with it, 0 without);
- a process set (a subset of the host's ranks keeps the pairs; the whole host's set reads);
- the setup probe: every rank agrees, HVD_SINGLE_COPY=0 on one rank or a probe forced to fail
  on one rank (HVD_TEST_SINGLE_COPY_PROBE_FAIL=1) turns it off on every rank, and
  metrics()["host_copy_reason"] names that rank; with the default (off) or a mixed setting no
  probe runs at all (metrics()["single_copy_probes"] == 0) and every rank takes the slots;
- a real EPERM: one rank non-dumpable (prctl(PR_SET_DUMPABLE, 0), CAP_SYS_PTRACE dropped so
  root meets the same rule) turns it off on every rank, the reason naming EPERM and the rank;
- a read that fails mid-job (the owner made itself non-dumpable after init): the readers' op
  ends with EPERM, the owner's wait for their release ends at once naming a reader;
- the owner outlives its readers: a reader that sleeps before reading
  (HVD_TEST_SINGLE_COPY_READ_DELAY_MS) keeps every owner of an input it reads in its op;
- abort() on a rank waiting for a slow reader's release ends the op there and on the other
  waiting rank within a few seconds; the slow reader's op (or its next) fails too;
- a rank killed while its peers read its input: the others' op ends with an error, no hang.
"""
import hashlib
import os

import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import ALL_DTYPES, Failures
from multiproc.harness import run_ranks

BIG = 300 << 10  # above the threshold these tests set (the default, 16 MiB, is too slow here)
ON = {"HVD_SINGLE_COPY": "1"}  # opt-in (the default is off)
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
        parts = []
        for r in range(n):
            src = checks.make_input(dtype, (sum(splits_of(r)), 3), r, name)
            start = sum(splits_of(r)[:me])
            parts.append(src[start:start + splits_of(r)[me]])
        fails.check(name, checks.mismatch(got, np.concatenate(parts), dtype))
        fails.expect(f"{name}.splits", list(got_splits) == [splits_of(r)[me] for r in range(n)])
        digest.update(np.ascontiguousarray(got).tobytes())
    used = hvd.metrics()["single_copy_ops"] - before
    mode = hvd.metrics()["host_copy"]
    hvd.shutdown()
    fails.raise_if_any()
    return digest.hexdigest(), used, mode


@pytest.mark.parametrize("np_", [1, 2, 3, 4, 5])
def test_single_copy_matches_the_slot_path_and_tcp(np_):
    on = run_ranks(collectives, np_, args=("on",), timeout=300, env=LOW)
    off = run_ranks(collectives, np_, args=("off",), timeout=300,
                    env={**LOW, "HVD_SINGLE_COPY": "0"})
    if np_ >= 2:
        tcp = run_ranks(collectives, np_, args=("tcp",), timeout=300,
                        env={**LOW, "HVD_TRANSPORT": "tcp"})
    for r in range(np_):
        digest, used, mode = on[r].value
        assert digest == off[r].value[0], f"rank {r}: single-copy and slot path differ"
        if np_ == 1:
            assert used == 0 and mode == "none"
            continue
        assert digest == tcp[r].value[0], f"rank {r}: single-copy and tcp differ"
        assert mode == "single-copy" and used > 0, (r, mode, used)
        assert off[r].value[1:] == (0, "segment")
        assert tcp[r].value[1:] == (0, "none")


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


def test_off_by_default():
    """Opt-in until it is measured faster on a quiet machine (RESULTS.md, issue #20 part 3),
    and off costs nothing at init: the host agrees at segment set-up that nobody asked, so no
    probe message is sent (single_copy_probes counts the probes a process ran)."""
    res = run_ranks(probes_run, 3, args=(None,), timeout=120)
    for r in res:
        mode, reason, probes, used, ok = r.value
        assert ok and mode == "segment" and used == 0, (r.rank, r.value)
        assert probes == 0, f"rank {r.rank} ran {probes} probe(s) with single-copy off"
        assert "rank 0 has HVD_SINGLE_COPY off (the default" in reason, (r.rank, reason)
    # on everywhere: exactly one probe per process
    res = run_ranks(probes_run, 3, args=(None,), timeout=120, env=LOW)
    assert all(r.value == ("single-copy", "", 1, 1, True) for r in res), [r.value for r in res]


@pytest.mark.parametrize("on_rank,off_rank", [(1, 0), (0, 1)])
def test_mixed_setting_agrees_on_the_segment_without_a_probe(on_rank, off_rank):
    """One rank asks for single-copy, the others keep the default: every rank takes the slot
    path (no hang: they all agree), no rank probes, the reason names the first rank that is off."""
    res = run_ranks(probes_run, 3, args=(None,), timeout=120,
                    env={"HVD_SINGLE_COPY_MIN_BYTES": str(256 << 10)}, rank_env={on_rank: ON})
    for r in res:
        mode, reason, probes, used, ok = r.value
        assert (mode, probes, used, ok) == ("segment", 0, 0, True), (r.rank, r.value)
        assert f"rank {off_rank} has HVD_SINGLE_COPY off" in reason, (r.rank, reason)


def _drop_ptrace_capability():
    """Clears CAP_SYS_PTRACE from this process's effective set (kept in the permitted set, so
    the ranks' permitted sets stay equal): a root test run then meets the same ptrace rules as
    a normal user, for whom a non-dumpable peer is off limits."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    assert libc.capget(ctypes.byref(header), data) == 0, os.strerror(ctypes.get_errno())
    data[0].effective &= ~(1 << 19)  # CAP_SYS_PTRACE
    assert libc.capset(ctypes.byref(header), data) == 0, os.strerror(ctypes.get_errno())


def undumpable_rank(which):
    """Rank `which` makes itself non-dumpable before init (prctl(PR_SET_DUMPABLE, 0)), so the
    kernel refuses its peers' process_vm_readv with EPERM: a real refusal, no test hook."""
    import ctypes
    _drop_ptrace_capability()
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


def reader_fails(owner):
    """Rank `owner` turns non-dumpable after init (the probe passed), so its peers' reads of its
    broadcast input fail with EPERM mid-job: each reader's op ends with
    that error, and the owner's wait for their release ends at once with an error naming a
    reader (Note [Single-copy ops] step 5), not a lost connection after the readers' abort."""
    import ctypes
    import time
    import engine_native as hvd
    _drop_ptrace_capability()
    hvd.init()
    me = hvd.rank()
    if me == owner:
        assert ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
    hvd.broadcast(np.ones(4), 0, name="after-prctl")  # the slot path: every rank is past it
    data = np.full((BIG >> 2) + 9, me, np.float32)
    start = time.monotonic()
    try:
        hvd.broadcast(data, owner, name="big")
    except hvd.HorovodInternalError as exc:
        return str(exc), time.monotonic() - start
    return None, time.monotonic() - start


def test_a_failed_read_ends_the_owners_wait_naming_the_reader():
    """np=2, so the one reader is surely inside the op when its read fails (with more readers,
    one that has not started the op yet learns of the failure from rank 0's fan-out first and
    never releases, and the owner's wait ends on that fan-out instead: also prompt, but not
    this path)."""
    owner = 1
    res = run_ranks(reader_fails, 2, args=(owner,), timeout=120, check=False,
                    env={**LOW, "HVD_TIMEOUT": "60"})
    for r in res:
        assert r.ok, r.describe()
        error, took = r.value
        assert error is not None, f"rank {r.rank}: no error after {took} s"
        assert took < 10, f"rank {r.rank}: {error!r} only after {took} s"
        if r.rank == owner:
            assert "rank 0 of this host could not read its peers' inputs" in error, error
        else:
            assert f"single-copy read of rank {owner}'s input" in error and "EPERM" in error, \
                (r.rank, error)


def owner_timing(_):
    """Every rank times its single-copy broadcast (root 0) and allgather; rank 2 sleeps before
    its reads (HVD_TEST_SINGLE_COPY_READ_DELAY_MS), so an owner that returned before its readers
    released its input would take less than the delay."""
    import time
    hvd = checks.init("shm")
    n, me = hvd.size(), hvd.rank()
    count = (BIG >> 2) + 9
    took, ok = {}, {}
    start = time.monotonic()
    out = hvd.broadcast(np.full(count, me, np.float32), 0, name="bc")
    took["bc"], ok["bc"] = time.monotonic() - start, bool(np.all(out == 0))
    start = time.monotonic()
    out = hvd.allgather(np.full(count, me, np.float32), name="ag")
    took["ag"] = time.monotonic() - start
    ok["ag"] = bool(np.array_equal(out, np.repeat(np.arange(n), count).astype(np.float32)))
    used = hvd.metrics()["single_copy_ops"]
    hvd.shutdown()
    return took, ok, used


def test_the_owner_outlives_a_slow_reader():
    delay = 1.5
    res = run_ranks(owner_timing, 3, args=(None,), timeout=120, env=LOW,
                    rank_env={2: {"HVD_TEST_SINGLE_COPY_READ_DELAY_MS": str(int(delay * 1000))}})
    for r in res:
        took, ok, used = r.value
        assert all(ok.values()) and used == 2, (r.rank, r.value)
    # the root of the broadcast and every rank of the allgather own an input rank 2 reads late
    assert res[0].value[0]["bc"] >= delay, res[0].value
    for r in res:
        assert r.value[0]["ag"] >= delay, (r.rank, r.value)


def aborted_in_wait(_):
    """alltoall: rank 2 sleeps 4 s before its reads, so ranks 0 and 1 wait for its release;
    rank 0 calls abort() 0.5 s in. Ranks 0 and 1 end with an error well before rank 2 wakes;
    rank 2 ends too (its op, or the next one, fails), nobody hangs."""
    import threading
    import time
    hvd = checks.init("shm")
    me, n = hvd.rank(), hvd.size()
    unit = (BIG >> 2) + 9
    hvd.broadcast(np.ones(4), 0, name="warm-up")
    if me == 0:
        threading.Timer(0.5, hvd.abort, args=("test abort",)).start()
    start = time.monotonic()
    errors = []
    try:
        hvd.alltoall(np.full(unit * n, me, np.float32), name="a2a")
    except hvd.HorovodInternalError as exc:
        errors.append(str(exc))
    took = time.monotonic() - start
    if not errors:
        try:
            hvd.broadcast(np.ones(4), 0, name="after")
        except hvd.HorovodInternalError as exc:
            errors.append(str(exc))
    return errors, took


def test_abort_during_a_single_copy_wait_ends_every_rank():
    res = run_ranks(aborted_in_wait, 3, args=(None,), timeout=90, check=False,
                    env={**LOW, "HVD_TIMEOUT": "60"},
                    rank_env={2: {"HVD_TEST_SINGLE_COPY_READ_DELAY_MS": "4000"}})
    for r in res:
        assert r.ok, r.describe()
        errors, took = r.value
        assert errors, f"rank {r.rank}: no error ({took} s)"
        if r.rank != 2:  # waiting for rank 2's release when rank 0 aborted
            assert took < 3, f"rank {r.rank}: {errors} only after {took} s"


def killed_owner(pid_dir):
    """Rank 1 SIGKILLs rank 0 (the root) once its own big broadcast is under way, so rank 2 is
    likely inside process_vm_readv of the root's 256 MiB input; the readers must end with an
    error (ESRCH from the read, or the lost root in their wait), not hang."""
    import signal
    import threading
    import time
    hvd = checks.init("shm")
    me = hvd.rank()
    big = np.ones(256 << 20, np.uint8)
    if me == 0:
        with open(os.path.join(pid_dir, "root"), "w") as fh:
            fh.write(str(os.getpid()))
    hvd.broadcast(np.ones(4), 0, name="warm-up")
    if me == 1:
        def kill_root():
            while "big" not in str(hvd.metrics().get("current")):
                time.sleep(0.0002)
            time.sleep(0.005)
            with open(os.path.join(pid_dir, "root")) as fh:
                os.kill(int(fh.read()), signal.SIGKILL)
        threading.Thread(target=kill_root, daemon=True).start()
    start = time.monotonic()
    try:
        for i in range(20):
            hvd.broadcast(big, 0, name=f"big.{i}")
    except hvd.HorovodInternalError as exc:
        return str(exc), time.monotonic() - start
    return None, time.monotonic() - start


def test_owner_killed_while_read_ends_the_readers_op(tmp_path):
    import signal
    res = run_ranks(killed_owner, 3, args=(str(tmp_path),), timeout=60, check=False,
                    env={**LOW, "HVD_TIMEOUT": "20"})
    assert res[0].returncode == -signal.SIGKILL, res[0].describe()
    errors = []
    for r in res[1:]:
        assert r.ok, r.describe()
        error, took = r.value
        assert error, f"rank {r.rank}: no error after {took} s"
        assert took < 15, f"rank {r.rank}: {error!r} only after {took} s"
        errors.append(error)
    print(errors)
