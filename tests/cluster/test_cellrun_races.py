"""Races inside one ``%%hvd`` cell's state machine (hvd_magic.cellrun), decided without a cluster:

- the stall hint comes well before a cell that can never finish ends by itself (Note [Stall
  hint before the stall end]);
- a Ctrl-C whose handler runs while step() decides whether the cell interrupts itself is never
  lost (Note [Interrupt requests]).

No cluster: a :class:`CellRun` is stepped on a fake clock against fake rank futures that
publish what engine_side._Watch publishes (every 0.25 s: the pending allreduce, its age and
how long the main thread has been blocked). Rank 1 finished the cell at once; rank 0 waits in
``allreduce 'grad'`` for it forever, as in test_kernel's stuck-collective cell. Each step runs
at the fake time, so which comes first is decided by the code alone, never by the machine's
load.
"""

from __future__ import annotations

import types

import pytest

from hvd_magic import cellrun, stall

PUBLISH_EVERY = 0.25  # engine_side._Watch.INTERVAL
ENTERED = 0.02        # s after the cell's start at which rank 0 submits and waits


class FakeOutput:
    def __init__(self):
        self.metadata = {"data": {}, "stdout": "", "stderr": ""}

    def done(self):
        return False  # rank 0 never finishes; rank 1's output is not looked at once done


class FakeFuture:
    def __init__(self, result=None):
        self.output = FakeOutput()
        self._result = result

    def done(self):
        return self._result is not None

    def exception(self):
        return None

    def result(self):
        return self._result


class FakeCluster:
    elastic = None

    def __init__(self):
        self.signalled = []

    def signal_ranks(self, ranks):
        self.signalled.append(list(ranks))


def _publish(fut, token, t):
    """What rank 0's watch thread publishes at time ``t``: blocked since it submitted."""
    age = t - ENTERED
    fut.output.metadata["data"] = {"hvd_core": {
        "cell": token, "current": None, "blocked_seconds": age,
        "pending": [{"op": "ALLREDUCE", "name": "allreduce.grad", "age_seconds": age}]}}


def _cell(monkeypatch, grace):
    """A submitted cell: rank 1 finished, rank 0 still running; time stands at 0 on ``clock``."""
    clock = types.SimpleNamespace(t=0.0)
    monkeypatch.setattr(cellrun, "time", types.SimpleNamespace(monotonic=lambda: clock.t))
    run = cellrun.CellRun(FakeCluster(), "...", [0, 1], stall_grace=grace)
    run.token, run.t0, run.state = "cell-token", 0.0, "running"
    run._futures = {0: FakeFuture(), 1: FakeFuture({"status": "ok", "value": None})}
    return run, clock


def _run_until_ended(monkeypatch, capsys, grace, limit=30.0):
    """Step the cell every 0.1 s of fake time; returns (hint time, hint, end time, run)."""
    run, clock = _cell(monkeypatch, grace)
    hint_at = hint = ended_at = None
    next_publication = PUBLISH_EVERY
    while clock.t < limit and ended_at is None:
        clock.t = round(clock.t + cellrun.TICK, 6)
        if clock.t >= next_publication:
            _publish(run._futures[0], run.token, next_publication)
            next_publication += PUBLISH_EVERY
        run.step()
        err = capsys.readouterr().err
        if "waiting" in err and hint_at is None:
            hint_at, hint = clock.t, err
        if run.state != "running":
            ended_at = clock.t
    return hint_at, hint, ended_at, run


@pytest.mark.parametrize("grace", [cellrun.STALL_GRACE, 4.0])
def test_the_stall_hint_comes_well_before_the_cell_ends_by_itself(monkeypatch, capsys, grace):
    hint_at, hint, ended_at, run = _run_until_ended(monkeypatch, capsys, grace)
    assert ended_at is not None and run.reason == "stalled"
    assert run.cluster.signalled == [[0]]
    assert hint_at is not None, "the cell ended by itself without the stall hint"
    # the hint tells the user to interrupt now: they must have the time to
    assert ended_at - hint_at >= grace / 2 - 0.5, (hint_at, ended_at)
    assert f"rank 0 waiting {grace / 2:g}+ s in allreduce 'grad'; rank(s) 1 already " \
           f"finished the cell" in hint
    assert f"once they have been blocked {grace:g} s (--stall-grace)" in hint


def test_a_grace_too_short_for_any_lead_still_prints_the_hint_first(monkeypatch, capsys):
    hint_at, hint, ended_at, run = _run_until_ended(monkeypatch, capsys, 0.1)
    assert run.reason == "stalled"
    assert hint_at is not None and hint_at <= ended_at


def test_without_a_stall_grace_the_hint_comes_after_stall_warn_after(monkeypatch, capsys):
    hint_at, hint, ended_at, run = _run_until_ended(monkeypatch, capsys, 0, limit=12.0)
    assert ended_at is None and run.reason is None  # nothing ends the cell by itself
    assert stall.STALL_WARN_AFTER <= hint_at <= stall.STALL_WARN_AFTER + 0.5
    assert "Interrupt the kernel (or use --timeout) to abort and recover." in hint


@pytest.mark.parametrize("hit", ["_failfast_reason", "_maybe_warn_stall", "_never_finishes"])
@pytest.mark.parametrize("grace", [0, cellrun.STALL_GRACE])
def test_a_ctrl_c_that_lands_while_the_cell_decides_is_not_lost(monkeypatch, grace, hit):
    run, clock = _cell(monkeypatch, grace)
    decide = getattr(run, hit)

    def hit_by_sigint(now):  # the SIGINT handler runs between two bytecodes of step()
        run.request_interrupt("interrupt")
        return decide(now)

    monkeypatch.setattr(run, hit, hit_by_sigint)
    clock.t = 1.0
    _publish(run._futures[0], run.token, clock.t)
    run.step()
    assert (run.state, run.reason) == ("interrupting", "interrupt")
    assert run.cluster.signalled == [[0]]


def test_the_first_reason_wins(monkeypatch):
    run, clock = _cell(monkeypatch, 0)
    run.timeout = 1.0
    clock.t = 2.0
    run.step()  # --timeout
    run.request_interrupt("stop")  # the dashboard's Stop, too late to matter
    run.step()
    assert (run.state, run.reason) == ("interrupting", "timeout")
