"""A rank whose caller drove its collectives over TCP (Note [Caller drives] D) leaves its loop
thread in standby; that thread must still read what a peer sends unasked. Rank 0 sends 64 MiB
(more than the two socket buffers hold) to rank 1, which posts its receive only once the send
returned: the send completes only if rank 1's loop reads the bytes meanwhile. Before the
park of Note D, rank 1's standby loop ignored the socket and the send timed out
(HVD_TIMEOUT)."""
import numpy as np

from multiproc import checks, faults
from multiproc.harness import run_ranks

BIG = 64 << 20


def unasked_send_suite(folder: str):
    hvd = checks.init("tcp")
    for _ in range(3):  # driven by the caller: the loop thread stays in standby
        hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum, name="driven")
    driven = hvd.metrics()["caller_driven_ops"]
    if hvd.rank() == 0:
        try:
            hvd.send(np.zeros(BIG // 4, np.float32), 1, tag=5)
            outcome = "sent"
        except Exception as e:  # noqa: BLE001 - the message is what is checked
            outcome = f"{type(e).__name__}: {e}"
        faults.announce(folder, "send returned")
    else:
        faults.await_event(folder, "send returned", timeout=60)
        outcome = int(hvd.recv(0, tag=5).size)
    hvd.shutdown()
    return {"outcome": outcome, "driven": driven}


def test_an_unasked_send_is_read_by_a_rank_in_standby(tmp_path):
    res = run_ranks(unasked_send_suite, 2, args=(str(tmp_path),), timeout=120,
                    hosts=["A", "B"], env={"HVD_TIMEOUT": "3", "HVD_CALLER_SPIN_US": "2000000"})
    assert res[0].value["outcome"] == "sent", res[0].value
    assert res[1].value["outcome"] == BIG // 4, res[1].value
    assert all(r.value["driven"] >= 1 for r in res), [r.value for r in res]


def unasked_send_while_driving_suite(warm_s: float):
    import time

    hvd = checks.init("tcp")
    start = time.monotonic()
    while True:  # driven ops for a while: rank 1's loop thread sleeps in standby afterwards
        warm = hvd.rank() == 0 and time.monotonic() - start > warm_s
        if hvd.allreduce(np.array([float(warm)], np.float32), op=hvd.Max, name="warm")[0]:
            break
    if hvd.rank() == 0:  # the send first, the allreduce rank 1 waits in only after it
        try:
            hvd.isend(np.zeros(BIG // 4, np.float32), 1, tag=6).wait()
            outcome = "sent"
        except Exception as e:  # noqa: BLE001 - the message is what is checked
            outcome = f"{type(e).__name__}: {e}"
        hvd.allreduce(np.ones(1, np.float32), name="after")
    else:  # its caller drives this op (spinning) while rank 0's bytes come, unasked
        hvd.allreduce(np.ones(1, np.float32), name="after")
        outcome = int(hvd.recv(0, tag=6).size)
    driven = hvd.metrics()["caller_driven_ops"]
    hvd.shutdown()
    return {"outcome": outcome, "driven": driven}


def test_an_unasked_send_is_read_while_the_caller_drives(tmp_path):
    # Rank 1's caller drives its allreduce (negotiated: board off) the whole time rank 0's
    # bytes come, with a spin budget longer than HVD_TIMEOUT: its loop thread, in no poll of
    # the sockets meanwhile (parked, or waiting for progress_), reads nothing, and the send
    # completes only because the caller's passes read every TCP socket (Note [Caller drives]
    # D). Without that, rank 0's send failed after HVD_TIMEOUT.
    res = run_ranks(unasked_send_while_driving_suite, 2, args=(0.4,), timeout=120,
                    hosts=["A", "B"], env={"HVD_TIMEOUT": "3", "HVD_ONE_ROUND_BYTES": "0",
                                           "HVD_CALLER_SPIN_US": "10000000"})
    assert res[0].value["outcome"] == "sent", res[0].value
    assert res[1].value["outcome"] == BIG // 4, res[1].value
    assert all(r.value["driven"] >= 10 for r in res), [r.value for r in res]
