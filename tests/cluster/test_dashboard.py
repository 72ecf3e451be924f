"""The dashboard wired to a real cluster (in-process IPython shell; no widget frontend, so the
hub collects quietly and ``%hvd_dashboard`` prints text): rows per rank from the engines'
publishers, ``hvd.report`` throughput, the timeline strip, a pipeline step's strip,
``%hvd_timeline`` / ``%hvd_autotune`` and the buttons' command path (also during a running
cell), Stop, a dead engine, ``%hvd_restart``, ``%hvd_stop``, ``--no-dashboard``.
"""

import os

import pytest
from cluster_harness import (dashboard_rows, kill_rank, magics, run_cell, start_cluster,
                             wait_for)

from hvd_magic.errors import CellInterrupted

pytestmark = pytest.mark.timeout(300)

# Steps of ~4 ms, as a small model's: the loop spans several snapshots (0.3 s apart), so the
# rate window holds points taken while samples were coming in (a loop of bare allreduces can
# finish between two snapshots, and a rate needs two points that both carry samples).
TRAIN = """%%hvd
import time
for step in range(300):
    hvd.allreduce(torch.ones(2048), name="grad")
    hvd.report(samples=16, loss=0.5)
    time.sleep(0.004)
"""
# Says when it runs (the buttons' test clicks then, a readiness handshake), then lasts 60 s.
RUNNING = "long cell running"
LONG = f"%%hvd\nimport time\nprint({RUNNING!r}, flush=True)\nfor i in range(1200):\n" \
       "    hvd.allreduce(torch.ones(4), name='t')\n    time.sleep(0.05)"


def test_rows_show_every_rank_with_its_identity(local_cluster):
    dash = magics().dashboard
    assert dash is not None and dash.running and dash.hub.view is None  # no widget frontend
    assert "hvd: 3 ranks (3 idle)" in local_cluster.out  # the text status, printed once
    cluster = magics().cluster
    wait_for(lambda: all(r.pid for r in dashboard_rows()), what="a snapshot from every rank")
    assert [(r.rank, r.pid, r.host, r.device) for r in dashboard_rows()] == \
        [(i.rank, i.pid, i.host, "cpu") for i in cluster.ranks]
    # A first snapshot may still show the engine busy with the request that started its
    # publisher; the next one (0.3 s later) must say idle.
    wait_for(lambda: all(r.state == "idle" for r in dashboard_rows()), timeout=5,
             what="every rank idle")


def _seen_until_last_report(model, monkeypatch, ranks, samples):
    """What the model showed as snapshots came in, filled on the hub's thread: for each rank,
    its row right after each snapshot it sent, up to the first with ``samples`` reported; and
    under "lanes" the timeline once every rank's was in. Rates are taken over the model's
    window (2 s of engine time: widgets/rates.py) and the timeline keeps 10 s; idle snapshots
    (0.3 s apart) slide both past a loop that ended, so what a later read sees depends on how
    late it comes. Read as each snapshot came in: the rate window keeps at least two points,
    so at the last report's snapshot it reaches back to one with fewer samples, and at the
    first snapshot after the loop's first allreduce to one without it."""
    seen, ingest = {rank: [] for rank in ranks}, model.ingest

    def ingest_and_keep(rank, snapshot, now):
        ingest(rank, snapshot, now)
        kept = seen.get(rank)
        if kept is None or (kept and kept[-1].samples == samples):
            return
        kept.append(next(r for r in model.rows(now) if r.rank == rank))
        if all(seen[r] and seen[r][-1].samples == samples for r in ranks):
            seen["lanes"] = model.timeline(now, span_s=30)

    monkeypatch.setattr(model, "ingest", ingest_and_keep)
    return seen


def test_reported_samples_become_throughput_and_the_timeline_fills(local_cluster, run,
                                                                    monkeypatch):
    model = magics().dashboard.hub.model
    seen = _seen_until_last_report(model, monkeypatch, [0, 1, 2], 300 * 16)
    res = run(TRAIN)
    assert res.error is None, res.text
    wait_for(lambda: "lanes" in seen, what="every rank's last report")
    for rank in (0, 1, 2):
        last = seen[rank][-1]
        assert last.unit == "samples/s" and last.rate and last.rate > 0, last
        assert last.extra == {"loss": 0.5}, last
        assert any(r.ops_rate and r.ops_rate > 0 for r in seen[rank]), seen[rank]
    lanes = seen["lanes"]
    assert [lane.rank for lane in lanes] == [0, 1, 2]
    assert all(any(op == "allreduce" and name.endswith("grad") for op, name, *_ in lane.bars)
               for lane in lanes), lanes
    text = run("%hvd_dashboard").out
    assert "hvd: 3 ranks" in text and "samples/s" in text and "r2 " in text


PIPELINE_STEP = """%%hvd
from engine_native.torch.pipelining import PipelineStage, Schedule1F1B
schedule = Schedule1F1B(PipelineStage(torch.nn.Linear(2, 2), hvd.rank(), 3), 4,
                        loss_fn=torch.nn.functional.mse_loss)
x = torch.ones(8, 2)
schedule.step(*([x] if hvd.rank() == 0 else []), **({'target': x} if hvd.rank() == 2 else {}))
"""


def test_a_pipeline_step_reaches_every_ranks_row_as_its_strip(local_cluster, run):
    res = run(PIPELINE_STEP)
    assert res.error is None, res.text
    wait_for(lambda: all(r.pipeline for r in dashboard_rows()), timeout=5,
             what="every rank's pipeline step")
    for r in dashboard_rows():  # 4 forwards and 4 backwards of the rank's stage, in 1F1B order
        assert r.pipeline.schedule == "1f1b" and len(r.pipeline.actions) == 8
        assert {(kind, stage) for kind, stage, *_ in r.pipeline.actions} == \
            {("F", r.rank), ("B", r.rank)}
        assert 0 <= r.pipeline.bubble <= 1 and r.pipeline.ideal == pytest.approx(2 / 6)
    assert "pipeline bubble" in run("%hvd_dashboard").out


def test_timeline_and_autotune_magics_run_on_every_rank(local_cluster, run, tmp_path):
    path = tmp_path / "tl.json"
    res = run(f"%hvd_timeline start {path}")
    assert res.error is None and f"timeline: recording to {path}" in res.out, res.text
    model = magics().dashboard.hub.model
    wait_for(lambda: model.timeline_active(), what="the core reporting its timeline")
    assert run("%%hvd\nhvd.allreduce(torch.ones(3), name='traced')").error is None
    assert "timeline: stopped" in run("%hvd_timeline stop").out
    assert path.exists() and "traced" in path.read_text()
    res = run("%hvd_autotune on")
    assert res.error is None and "autotune:" in res.out, res.text
    wait_for(lambda: model.autotune() is not None and model.autotune().enabled,
             what="the autotune panel")
    assert run("%hvd_autotune off").error is None


def test_a_command_failing_on_every_rank_reports_one_grouped_line(local_cluster, run):
    run("%%hvd\nimport engine_native.basics as _b\n_saved = _b.set_autotune\n"
        "def _refuse(enabled):\n    raise RuntimeError('autotune refused here')\n"
        "_b.set_autotune = _refuse")
    try:
        res = run("%hvd_autotune on")
        assert res.error is not None
        assert "ranks 0-2: RuntimeError: autotune refused here" in str(res.error)
    finally:
        run("%%hvd\n_b.set_autotune = _saved")


def test_buttons_act_while_a_cell_runs_and_stop_interrupts_it(local_cluster, run, shell,
                                                               tmp_path):
    dash = magics().dashboard
    assert dash.stop_clicked() == "no %%hvd cell is running"
    answers = []
    path = str(tmp_path / "during.json")

    said = []

    def timeline_then_stop():
        try:
            dash.hub.command("timeline", on_done=lambda a, m: answers.append((a, m)),
                             start=True, path=path)
            wait_for(lambda: answers, what="the ranks' answers")
        finally:  # the cell ends whatever happened (run_cell re-raises what did)
            said.append(dash.stop_clicked())

    res = run_cell(shell, LONG, interrupt_on=RUNNING, interrupt=timeline_then_stop)
    assert isinstance(res.error, CellInterrupted), res.text
    assert "stop button" in res.text and res.seconds < 45  # not the 60 s cell
    assert said == ["stopping every rank..."]
    (got, missing), = answers
    assert missing == [] and got[0] == (True, f"recording to {path}") and len(got) == 3
    assert os.path.exists(path)
    res = run("%%hvd\nhvd.allreduce(torch.ones(1), op=hvd.Sum).item()")
    assert res.error is None and res.value == 3.0, res.text


def test_a_dead_engine_shows_dead_and_restart_brings_fresh_rows(local_cluster, run):
    victim = kill_rank(2)
    wait_for(lambda: dashboard_rows()[2].state == "dead", what="rank 2 shown dead")
    assert dashboard_rows()[0].state != "dead"
    res = run("%hvd_restart")
    assert res.error is None, res.text
    pids = {i.pid for i in magics().cluster.ranks}
    wait_for(lambda: {r.pid for r in dashboard_rows()} == pids
             and all(r.state == "idle" for r in dashboard_rows()), what="rows of the new engines")
    assert victim not in pids
    res = run("%%hvd\nhvd.report(samples=1)\nhvd.rank()")
    assert res.error is None, res.text


def test_no_dashboard_then_on_demand_then_off_then_stop(no_cluster, run):
    start_cluster(magics().shell, "-n 2 --launcher local --gpus none --no-dashboard")
    assert magics().dashboard is None
    res = run("%hvd_dashboard")
    assert res.error is None and magics().dashboard.running, res.text
    wait_for(lambda: len([r for r in dashboard_rows() if r.pid]) == 2, what="both ranks")
    assert "hvd: 2 ranks" in run("%hvd_dashboard").out
    assert "dashboard off" in run("%hvd_dashboard --off").out and magics().dashboard is None
    run("%hvd_dashboard")
    hub = magics().dashboard.hub
    assert "cluster stopped" in run("%hvd_stop").out
    assert magics().dashboard is None and not hub.running


def test_every_new_magic_has_help_with_an_example(shell):
    for name in ("hvd_dashboard", "hvd_timeline", "hvd_autotune"):
        doc = shell.find_line_magic(name).__doc__
        assert "Examples" in doc and f"%{name}" in doc, name
    assert "--no-dashboard" in shell.find_line_magic("hvd_start").__doc__
