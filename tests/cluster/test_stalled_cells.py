"""A ``%%hvd`` cell that can never finish is ended (issue #21; Note [A cell that can never
finish] in hvd_magic.cellrun), against the shared real 3-rank local cluster.

- A time-based loop that runs a different number of steps per rank: the rank whose deadline
  came first finishes the cell, the others block in the next step's allreduce. The cell ends
  within grace + a few seconds (20 allowed, loaded) with the stuck report, and the next cell's
  allreduce works on the same engines.
- A rank slower than the grace but still computing (its peer blocked meanwhile, a third rank
  finished) is never cut off: the cell completes with its value.
- ``--stall-grace 0`` keeps the old behaviour: the cell waits (here until ``--timeout``).
"""

import pytest
from cluster_harness import assert_allreduce_works, traceback_text
from IPython.core.error import UsageError

from hvd_magic.errors import CellInterrupted

pytestmark = pytest.mark.timeout(150)

GRACE = 2
# Rank r stops starting steps 1 + r seconds in (counted from an allreduce that lines the ranks
# up, not from each one's start of the cell): the steps run in lockstep (one allreduce each), so
# rank 0 leaves first and ranks 1 and 2 block in the step after its last one.
UNEVEN_LOOP = """%%hvd{opts}
import time
hvd.allreduce(torch.ones(1), name='start')
t_end = time.monotonic() + 1.0 + hvd.rank()
steps = 0
while time.monotonic() < t_end:
    hvd.allreduce(torch.ones(1), name='loss')
    steps += 1
steps
"""


def test_uneven_time_based_loop_is_ended_after_the_grace(local_cluster, run, monkeypatch):
    monkeypatch.setenv("HVD_STALL_GRACE", str(GRACE))  # the default, from the environment
    res = run(UNEVEN_LOOP.format(opts=""))
    assert isinstance(res.error, CellInterrupted), res.text
    assert res.error.reason == "stalled"
    # rank 0 finishes ~1 s in; then the grace; then interrupt + abort + re-init (a few s,
    # up to 8 loaded)
    assert res.seconds < 1 + GRACE + 20, res.seconds
    text = traceback_text(res)
    assert f"hvd: ended the cell: ranks 1,2 waited {GRACE}+ s in collectives" in text, text
    assert "ranks 1,2: stuck in allreduce 'loss'" in text, text
    assert "waiting on rank 0 (finished the cell)" in text, text
    assert "re-initialised the core on all ranks" in text, text
    assert res.error.stuck == {1: ["allreduce 'loss'"], 2: ["allreduce 'loss'"]}
    assert_allreduce_works(run)


def test_slow_rank_still_computing_is_not_cut_off(local_cluster, run):
    # Rank 2 finishes at once; rank 1 blocks in an allreduce over {0, 1} for ~3 grace periods
    # while rank 0 computes (sleeps) before it joins that allreduce, with an async op of its
    # own pending meanwhile (as gradient hooks leave them): pending is not blocked.
    res = run(f"""%%hvd --stall-grace {GRACE}
import time
pair = hvd.add_process_set([0, 1])
total = None
if hvd.rank() == 0:
    late = hvd.allreduce_async(torch.ones(1), name='late', op=hvd.Sum, process_set=pair)
    time.sleep({3 * GRACE})
if hvd.rank() != 2:
    total = hvd.allreduce(torch.ones(1), name='slow', op=hvd.Sum, process_set=pair).item()
if hvd.rank() == 1:
    late = hvd.allreduce_async(torch.ones(1), name='late', op=hvd.Sum, process_set=pair)
if hvd.rank() != 2:
    total += hvd.synchronize(late).item()
total
""")
    assert res.error is None, res.text
    assert res.value == 4.0
    assert res.seconds >= 3 * GRACE
    res = run("%%hvd\nhvd.remove_process_set(pair)")
    assert res.error is None, res.text
    assert_allreduce_works(run)


def test_stall_grace_zero_waits_as_before(local_cluster, run):
    res = run(UNEVEN_LOOP.format(opts=f" --stall-grace 0 --timeout {GRACE + 4}"))
    assert isinstance(res.error, CellInterrupted), res.text
    assert res.error.reason == "timeout"
    assert res.seconds >= GRACE + 4
    assert f"interrupted after {GRACE + 4} s" in traceback_text(res)
    assert_allreduce_works(run)


def test_bad_stall_grace_is_a_usage_error(local_cluster, run, monkeypatch):
    res = run("%%hvd --stall-grace -1\n1")
    assert isinstance(res.error, UsageError), res.text
    assert "--stall-grace must be >= 0 seconds" in str(res.error)
    monkeypatch.setenv("HVD_STALL_GRACE", "soon")
    res = run("%%hvd\n1")
    assert isinstance(res.error, UsageError), res.text
    assert "HVD_STALL_GRACE='soon'" in str(res.error)
