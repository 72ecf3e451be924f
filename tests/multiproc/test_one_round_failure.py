"""A failure between rounds of the one-round board (Note [One round] I in
engine_native/csrc/runtime/one_round.cc; the board's other tests: test_one_round.py): a failure
that reaches a rank after every rank answered a round, but before that rank read it, first
finishes the round there, so its op returns on that rank the value it returned on the ranks
that read it; the next op fails on every rank still running, with the cause.

Rank 0 is held off reading the round of the op named ``answered`` (HVD_TEST_ONE_ROUND_HOLD): only
its failure reads it. Rank 1 fails only after its own ``answered`` returned, so every rank had
answered that round (rank 0's post included) before the failure exists: the board orders it."""
import os
import threading

import numpy as np
import pytest

from multiproc import checks, faults
from multiproc.harness import run_ranks

NP = 3
HELD = "answered"
EXPECTED = [float(sum(r + 1 for r in range(NP))), float(sum(10 * (r + 1) for r in range(NP)))]


def _outcome(op) -> str:
    try:
        return op()
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        return f"{type(e).__name__}: {e}"


def failure_suite(how: str, folder: str):
    """how: 'exit' (rank 1 exits: a lost peer), 'abort' (rank 1 aborts: the cause reaches
    rank 0 as a message), 'own_abort' (rank 0 aborts itself while it holds the round)."""
    hvd = checks.init("shm")
    me = hvd.rank()
    hvd.allreduce(np.ones(1, np.float32), name="before")
    if me == 0 and how == "own_abort":
        def abort_once_read():
            faults.await_event(folder, "read", timeout=30)
            hvd.abort("rank 0 gives up")
        threading.Thread(target=abort_once_read, daemon=True).start()
    x = np.array([me + 1, 10 * (me + 1)], np.float32)
    got = _outcome(lambda: hvd.allreduce(x, op=hvd.Sum, name=HELD).tolist())
    if me == 1:
        if how == "exit":
            os._exit(0)
        if how == "abort":
            hvd.abort("rank 1 gives up")
        faults.announce(folder, "read")
    after = _outcome(lambda: str(hvd.allreduce(np.ones(1, np.float32), name="next")))
    return {"got": got, "after": after, "board_ops": hvd.metrics()["one_round_ops"]}


@pytest.mark.parametrize("how,cause,failing", [
    ("exit", "connection to rank 1", 1),  # lost (control) or closed (point-to-point) first
    ("abort", "rank 1 gives up", 1),
    ("own_abort", "rank 0 gives up", 0),
])
def test_a_failure_after_every_rank_answered_a_round_finishes_it_first(tmp_path, how, cause,
                                                                      failing):
    results = run_ranks(failure_suite, NP, args=(how, str(tmp_path)), timeout=60,
                        env={"HVD_TIMEOUT": "10"}, check=False,
                        rank_env={0: {"HVD_TEST_ONE_ROUND_HOLD": "allreduce." + HELD}})
    survivors = [r for r in range(NP) if not (how == "exit" and r == failing)]
    for rank in survivors:
        value = results[rank].value
        assert isinstance(value, dict), (rank, results[rank])
        # every rank ran it on the board, rank 0 from inside its failure (I)
        assert value["got"] == EXPECTED and value["board_ops"] == 2, (rank, value)
        assert value["after"].startswith("HorovodInternalError") and cause in value["after"], \
            (rank, value)
