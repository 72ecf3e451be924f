"""metrics()["main_blocked_seconds"]: how long the main thread has been blocked in a wait
(Note [Blocked main thread] in engine_native/csrc/runtime/metrics.h), on 2 spawned ranks.

The notebook driver ends a cell that can never finish only when every rank still running it
is blocked there (Note [A cell that can never finish] in hvd_magic.stall), so: it grows
while the main thread waits on a collective a peer has not joined, it is 0 once the wait is
over, and a wait on another thread (or an op merely pending) leaves it at 0.
"""
import threading
import time

import numpy as np

from multiproc import checks
from multiproc.harness import run_ranks

BLOCKED = 0.5  # s the main thread must be seen blocked


def _poll(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.02)  # polling the core's metrics, with a deadline


def blocked_suite():
    hvd = checks.init("shm")
    seen = {}
    if hvd.rank() == 0:
        # Phase 1: the main thread waits on 'x'; a watcher sees it blocked, then lets rank 1
        # in (broadcast 'go' from the watcher thread: rank 1 waits for it before joining 'x').
        def watch():
            _poll(lambda: hvd.metrics()["main_blocked_seconds"] >= BLOCKED, "main blocked")
            seen["while_blocked"] = hvd.metrics()["main_blocked_seconds"]
            hvd.broadcast(np.zeros(1), root_rank=0, name="go")

        watcher = threading.Thread(target=watch)
        watcher.start()
        x = hvd.allreduce(np.ones(2), op=hvd.Sum, name="x")
        watcher.join()
        seen["after"] = hvd.metrics()["main_blocked_seconds"]
        # Phase 2: another thread waits on 'y' while the main thread polls: 'y' pending for
        # BLOCKED s, the main thread not blocked; then broadcast 'go2' lets rank 1 into 'y'.
        box = {}
        waiter = threading.Thread(target=lambda: box.update(
            y=hvd.allreduce(np.ones(2), op=hvd.Sum, name="y.late")))
        waiter.start()

        def y_pending_long():
            return any("y.late" in p["name"] and p["age_seconds"] >= BLOCKED
                       for p in hvd.metrics()["pending"])

        _poll(y_pending_long, "'y' pending")
        seen["other_thread_waits"] = hvd.metrics()["main_blocked_seconds"]
        hvd.broadcast(np.zeros(1), root_rank=0, name="go2")
        waiter.join()
        y = box["y"]
    else:
        hvd.broadcast(np.zeros(1), root_rank=0, name="go")
        x = hvd.allreduce(np.ones(2), op=hvd.Sum, name="x")
        hvd.broadcast(np.zeros(1), root_rank=0, name="go2")
        y = hvd.allreduce(np.ones(2), op=hvd.Sum, name="y.late")
    hvd.shutdown()
    return x.tolist(), y.tolist(), seen


def test_main_blocked_seconds_marks_only_the_main_threads_wait():
    res = run_ranks(blocked_suite, 2, timeout=120)
    for r in res:
        assert r.value[:2] == ([2.0, 2.0], [2.0, 2.0])
    seen = res[0].value[2]
    assert seen["while_blocked"] >= BLOCKED
    assert seen["after"] == 0.0
    assert seen["other_thread_waits"] == 0.0
