"""Cells stuck in the core's collectives, against one real 3-rank local cluster.

The case ipyparallel cannot handle (its issue #435): one rank skips an allreduce, the others wait
forever. ``--timeout`` (and Ctrl-C, and a failing peer) must end the cell within the timeout + 20 s
(loaded; a few seconds here), name the collective and the missing rank, and leave the same engines
able to run the next allreduce.
"""

import re

import pytest
from cluster_harness import assert_allreduce_works, run_cell, traceback_text

from hvd_magic.errors import CellInterrupted, RankError

pytestmark = pytest.mark.timeout(150)

SKIP_ONE = ("%%hvd{opts}\nx = torch.ones(4)\nif hvd.rank() != 1:\n"
            "    hvd.allreduce(x, name='grad.fc1')\n'done'")
# For Ctrl-C: ranks 0 and 2 say so once their core lists 'grad.fc1' as pending (refreshed
# every 200 ms), which is what the report is built from: the readiness handshake. Rank 1 stays
# in the cell too (not in the collective), so the interrupt never races a rank's end of cell.
PENDING = "grad.fc1 is pending"
SKIP_ONE_SAYS_WHEN = f"""%%hvd
import time
import engine_native.basics as core
x = torch.ones(4)
if hvd.rank() != 1:
    h = hvd.allreduce_async(x, name='grad.fc1')
    deadline = time.monotonic() + 30
    while not any('grad.fc1' in p['name'] for p in core.metrics()['pending']):
        assert time.monotonic() < deadline, 'grad.fc1 never showed as pending'
        time.sleep(0.02)  # polling the core's state, with a deadline
    print({PENDING!r}, flush=True)
    hvd.synchronize(h)
else:
    time.sleep(60)
'done'
"""


def test_namespace_has_hvd_and_torch(local_cluster, run):
    """The shared cluster names ``--framework torch`` (conftest.py): every rank's ``hvd``."""
    res = run("%%hvd --out names\n(hvd.__name__, hvd.rank(), hvd.size(), hvd.is_initialized(), "
              "torch.__name__)")
    assert res.error is None, res.text
    assert run("names").value == {r: ("engine_native.torch", r, 3, True, "torch")
                                  for r in range(3)}
    assert len(re.findall(r"engine_native\.torch +idle", local_cluster.out)) == 3, \
        local_cluster.out


def test_timeout_on_skipped_allreduce_reports_and_recovers(local_cluster, run):
    res = run(SKIP_ONE.format(opts=" --timeout 2"))
    assert isinstance(res.error, CellInterrupted), res.text
    assert res.seconds < 2 + 20, res.seconds  # (recovery may take 8 s loaded)
    text = traceback_text(res)
    assert "interrupted after 2 s" in text
    assert "ranks 0,2: stuck in allreduce 'grad.fc1'" in text
    assert "waiting on rank 1 (finished the cell)" in text
    assert "re-initialised the core on all ranks" in text
    assert res.error.stuck == {0: ["allreduce 'grad.fc1'"], 2: ["allreduce 'grad.fc1'"]}
    assert_allreduce_works(run)


def test_ctrl_c_on_skipped_allreduce_reports_and_recovers(local_cluster, shell):
    res = run_cell(shell, SKIP_ONE_SAYS_WHEN, interrupt_on=PENDING)
    assert isinstance(res.error, CellInterrupted), res.text
    assert res.error.reason == "interrupt"
    assert "stuck in allreduce 'grad.fc1'" in traceback_text(res)
    assert_allreduce_works(lambda code: run_cell(shell, code))


def test_long_wait_in_a_collective_prints_a_hint(local_cluster, run, monkeypatch):
    """The hint comes before the stall end (Note [Stall hint before the stall end]): the cell
    ends only once ranks 0,2 have been blocked 2 s, by which time they waited the hint's 1 s."""
    from hvd_magic import stall

    monkeypatch.setattr(stall, "STALL_WARN_AFTER", 1.0)  # the stall policy reads it there
    res = run(SKIP_ONE.format(opts=" --stall-grace 2"))
    assert isinstance(res.error, CellInterrupted), res.text
    assert res.error.reason == "stalled", res.text
    assert "hvd: ranks 0,2 waiting 1+ s in allreduce 'grad.fc1'; rank(s) 1 already " \
           "finished the cell" in res.err
    assert_allreduce_works(run)


@pytest.mark.parametrize("wait, label", [
    ("hvd.allreduce(torch.ones(1), name='loss')", "allreduce 'loss'"),
    # a receive is listed with the collectives (op RECV): the same fail-fast
    ("if hvd.rank() == 0:\n    hvd.recv(2, tag=1)", "recv 'from rank 2, tag 1'"),
], ids=["collective", "receive"])
def test_failing_rank_does_not_leave_peers_hanging(local_cluster, run, wait, label):
    res = run("%%hvd\nif hvd.rank() == 2:\n    raise ValueError('bad batch')\n" + wait)
    assert isinstance(res.error, CellInterrupted), res.text
    assert res.error.reason == "failfast"
    assert res.seconds < 10
    text = traceback_text(res)
    assert "rank 2 failed while the others were still running" in text
    assert "waiting on rank 2 (raised ValueError)" in text
    assert "ValueError: bad batch" in text
    assert label in text, text
    assert_allreduce_works(run)


HANGING_STAGE = """%%hvd --timeout 6
import threading
from engine_native.torch.pipelining import PipelineStage, Schedule1F1B

class Stage(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.calls = torch.nn.Linear(2, 2), 0

    def forward(self, x):
        self.calls += 1
        if hvd.rank() == 1 and self.calls == 2:
            threading.Event().wait()  # micro-batch 1's forward never ends
        return self.lin(x)

schedule = Schedule1F1B(PipelineStage(Stage(), hvd.rank(), 3), 4,
                        loss_fn=torch.nn.functional.mse_loss)
x = torch.ones(8, 2)
schedule.step(*([x] if hvd.rank() == 0 else []), **({'target': x} if hvd.rank() == 2 else {}))
"""


def test_stuck_pipeline_is_reported_in_its_own_terms(local_cluster, run):
    """A stage that never finishes a forward: the report says where every stage was. (The
    other ranks reach their receives within milliseconds of the cell's start; the 6 s timeout
    leaves a loaded machine room for the cell's imports.)"""
    res = run(HANGING_STAGE)
    assert isinstance(res.error, CellInterrupted), res.text
    text = traceback_text(res)
    assert "rank 1: pipeline stage 1, in the forward of micro-batch 1" in text, text
    assert "rank 2: pipeline stage 2, receiving micro-batch 1's activations from stage 1 " \
           "(rank 1)" in text, text
    assert "rank 0: pipeline stage 0, receiving micro-batch 0's gradient from stage 1 " \
           "(rank 1)" in text, text
    assert_allreduce_works(run)
    # the re-initialised core forgot the step: a stuck report (it ends once ranks 0,2 are
    # blocked in grad.fc1) without it
    res = run(SKIP_ONE.format(opts=" --stall-grace 1"))
    assert "ranks 0,2: stuck in allreduce 'grad.fc1'" in traceback_text(res), res.text
    assert "pipeline stage" not in traceback_text(res), traceback_text(res)
    assert_allreduce_works(run)


def test_mismatch_error_from_core_is_grouped(local_cluster, run):
    res = run("%%hvd\nhvd.allreduce(torch.ones(hvd.rank() + 1), name='shape')")
    assert isinstance(res.error, RankError), res.text
    assert not isinstance(res.error, CellInterrupted)
    assert len(res.error.failures) == 3
    assert "all ranks" in traceback_text(res) or "ranks 0-2" in traceback_text(res)
    assert_allreduce_works(run)


def test_interrupted_training_step_leaves_optimizer_usable(local_cluster, run):
    res = run("%%hvd\nnet = torch.nn.Linear(8, 2)\n"
              "sgd = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),\n"
              "                               named_parameters=net.named_parameters())\n"
              "def steps(n, stop_at=None):\n    for i in range(n):\n"
              "        sgd.zero_grad()\n        net(torch.randn(4, 8)).sum().backward()\n"
              "        if hvd.rank() == 1 and i == stop_at:\n            return 'left'\n"
              "        sgd.step()\n    return 'ok'")
    assert res.error is None, res.text
    # rank 1 leaves after its backward pass (its step's gradients submitted, never waited
    # on): the others wait for its next step's; the cell ends once they are blocked there
    res = run("%%hvd --stall-grace 1\nsteps(100, stop_at=2)")
    assert isinstance(res.error, CellInterrupted), res.text
    text = traceback_text(res)
    assert "ranks 0,2: stuck in allreduce 'bias', 'weight'" in text, text
    assert "waiting on rank 1 (finished the cell)" in text, text
    res = run("%%hvd\nsteps(3)")
    assert res.error is None, res.text
    assert res.value == "ok"


def test_training_state_survives_between_cells(local_cluster, run):
    res = run("%%hvd\nmodel = torch.nn.Linear(4, 1)\n"
              "opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),\n"
              "                               named_parameters=model.named_parameters())\n"
              "hvd.broadcast_parameters(model.state_dict(), root_rank=0)")
    assert res.error is None, res.text
    res = run("%%hvd\nfor _ in range(3):\n    opt.zero_grad()\n"
              "    model(torch.randn(8, 4)).pow(2).mean().backward()\n    opt.step()\n"
              "w = hvd.allgather(model.weight.detach().reshape(1, -1))\n"
              "bool((w - w[0]).abs().max() < 1e-6)")
    assert res.error is None, res.text
    assert res.value is True
