"""The one-round board's stall warning (Note [One round] in
engine_native/csrc/runtime/one_round.cc; the rest of the board's tests: test_one_round.py): a
rank waiting on the board for a rank that has not submitted the op names that rank and the op,
and both finish on the board once it comes."""
import os
import threading
import time

import numpy as np

from multiproc import checks
from multiproc.harness import run_ranks


def board_stall_suite():
    """Rank 0 waits on the board in a small blocking allreduce; rank 1 submits it only once
    rank 0's own stall warning is in rank 0's stderr (a thread of rank 0 reads it), so the
    warning's text is the board's, then both finish on the board."""
    hvd = checks.init("shm")
    oob = checks.out_of_band()
    if hvd.rank() == 0:
        err_path = os.readlink("/proc/self/fd/2")

        def watch():
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                with open(err_path, errors="replace") as fh:
                    if "on the one-round board for rank(s) 1" in fh.read():
                        break
                time.sleep(0.2)  # polling a log file for the expected line
            oob.set("stall-seen", b"1")
        threading.Thread(target=watch, daemon=True).start()
    else:
        oob.get("stall-seen", timeout=60)
    out = hvd.allreduce(np.ones(2, np.float32), op=hvd.Sum, name="held_back").tolist()
    counted = hvd.metrics()["one_round_ops"]
    oob.close()
    hvd.shutdown()
    return {"out": out, "counted": counted}


def test_a_rank_held_back_from_the_board_is_named_by_the_stall_warning():
    results = run_ranks(board_stall_suite, 2, timeout=90, env={"HVD_STALL_CHECK_TIME": "1"})
    for r in results:
        assert r.value == {"out": [2.0, 2.0], "counted": 1}, r.value
    err = results[0].stderr
    assert ("rank 0 has waited" in err and "s on the one-round board for rank(s) 1, which "
            "submitted no op of the global set since; waiting: allreduce.held_back. Make sure "
            "every rank submits these ops" in err), err[-3000:]
