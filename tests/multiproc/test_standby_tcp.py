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
