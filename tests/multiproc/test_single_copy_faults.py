"""Single-copy reads between ranks of one host under faults (Note [Single-copy ops] in
algo/single_copy.cc; the paths themselves: test_single_copy.py). Real processes, hard timeouts.

- a read that fails mid-job (the owner made itself non-dumpable after init): the reader's op
  ends with EPERM, the owner's wait for its release ends at once naming the reader (step 5);
- the owner outlives its readers: a reader that sleeps before reading
  (HVD_TEST_SINGLE_COPY_READ_DELAY_MS) keeps every owner of an input it reads in its op;
- abort() on a rank waiting for a slow reader's release ends the op there and on the other
  waiting rank within a few seconds; the slow reader's op (or its next) fails too;
- the owner killed while its peers are to read its input: their op ends with an error naming
  it (ESRCH from the read, or rank 0 lost), no hang.
"""
import re

import numpy as np
import pytest

from multiproc import checks
from multiproc.harness import run_ranks

BIG = 300 << 10  # above the threshold these tests set
LOW = {"HVD_SINGLE_COPY": "1", "HVD_SINGLE_COPY_MIN_BYTES": str(256 << 10)}


def reader_fails(owner):
    """Rank `owner` turns non-dumpable after init (the probe passed), so its peers' reads of its
    broadcast input fail with EPERM mid-job: each reader's op ends with
    that error, and the owner's wait for their release ends at once with an error naming a
    reader (Note [Single-copy ops] step 5), not a lost connection after the readers' abort."""
    import ctypes
    import time

    import engine_native as hvd
    checks.drop_ptrace_capability()
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
        _, ok, used = r.value
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


def killed_owner(_):
    """Rank 0, the root, SIGKILLs itself once its big broadcast has entered the single-copy op
    (its ``single_copy_ops`` counter moved: the op counts itself just before it posts its
    input), while ranks 1 and 2 hold off their reads (HVD_TEST_SINGLE_COPY_READ_DELAY_MS), so
    they read a dead owner's input and must end with an error naming it, not hang. Returns
    (error, seconds)."""
    import os
    import signal
    import threading
    import time
    hvd = checks.init("shm")
    big = np.ones(256 << 20, np.uint8)
    hvd.broadcast(np.ones(4), 0, name="warm-up")  # below the threshold: the slot path
    before = hvd.metrics()["single_copy_ops"]
    if hvd.rank() == 0:
        def die_in_the_op():
            while hvd.metrics()["single_copy_ops"] == before:
                threading.Event().wait(0.0005)  # a bounded poll of the core's state, not a nap
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Thread(target=die_in_the_op, daemon=True).start()
    start = time.monotonic()
    try:
        for i in range(20):
            hvd.broadcast(big, 0, name=f"big.{i}")
    except hvd.HorovodInternalError as exc:
        return str(exc), time.monotonic() - start
    return None, time.monotonic() - start


# What a survivor may report, each naming rank 0: its read (or, through the failure fan-out,
# its peer's) found the owner gone; or its loop lost rank 0 before it started the op, or its
# wait did (the owner died before posting).
OWNER_GONE = re.compile(r"single-copy read of rank 0's input: .*the process is gone \(ESRCH\)"
                        r"|lost connection to rank 0\b")


# np=2: the reader reads on two threads (Note [Two-thread reads]: the host has two CPUs per
# reader), both halves from the dead owner; np=3 on two CPUs: one thread each
@pytest.mark.parametrize("np_", [2, 3])
def test_owner_killed_while_read_ends_the_readers_op(np_):
    """The kill is ordered by the root's own counter, not a sleep. That it also lands before
    the readers' reads rests on their 1 s read delay against a kill one 0.5 ms poll after the
    counter moved (holding a reader until the test releases it would need a core hook); a
    kill after the reads ends the next op, and the error must name rank 0 either way."""
    import signal
    res = run_ranks(killed_owner, np_, args=(None,), timeout=60, check=False,
                    env={**LOW, "HVD_TIMEOUT": "20"},
                    rank_env={r: {"HVD_TEST_SINGLE_COPY_READ_DELAY_MS": "1000"}
                              for r in range(1, np_)})
    assert res[0].returncode == -signal.SIGKILL, res[0].describe()
    for r in res[1:]:
        assert r.ok, r.describe()
        error, took = r.value
        assert error, f"rank {r.rank}: no error after {took} s"
        assert OWNER_GONE.search(error), f"rank {r.rank}: {error!r} does not name rank 0's loss"
        assert took < 15, f"rank {r.rank}: {error!r} only after {took} s"
