"""DashboardModel: snapshots in → rows, states, rates, cluster, autotune and timeline out."""


import pytest

from hvd_magic.widgets import model as M

pytestmark = pytest.mark.timeout(30)


def snap(rank, t, *, pid=100, samples=0, ar_bytes=0, ar_ops=0, busy=False, cell="",
         collective=None, device=None, events=(), autotune=None, waits=(0.0, 0.0, 0.0),
         fused=(0, 0), timeline=None, last_error=""):
    """A schema-v1 snapshot with the given counters."""
    core = {"ops": {"allreduce": ar_ops, "broadcast": 1}, "bytes": {"allreduce": ar_bytes},
            "fused_batches": fused[0], "fused_tensors": fused[1], "negotiate_s": waits[0],
            "communicate_s": waits[1], "wait_s": waits[2], "queue_depth": 0,
            "collective": collective, "last_error": last_error}
    if autotune is not None:
        core["autotune"] = autotune
    if timeline is not None:
        core["timeline"] = timeline
    return {"v": 1, "rank": rank, "t": 1000.0 + t, "pid": pid + rank, "host": f"node{rank // 2}",
            "busy": busy, "cell": cell, "samples": samples,
            "device": device or {"kind": "cpu"}, "core": core, "events": list(events)}


def coll(age, name="grad.fc1.weight", missing=()):
    return {"op": "allreduce", "name": name, "age_s": age, "phase": "negotiate",
            "missing": list(missing)}


def row(model, rank, now):
    return {r.rank: r for r in model.rows(now)}[rank]


def test_expected_ranks_start_as_starting_then_show_identity_and_device():
    m = M.DashboardModel(size=2)
    assert [(r.rank, r.state) for r in m.rows(0.0)] == [(0, "starting"), (1, "starting")]
    dev = {"kind": "cuda", "index": 1, "name": "NVIDIA H100", "mem_used": 3 << 30,
           "mem_total": 80 << 30}
    m.ingest(1, snap(1, 0.0, device=dev), now=0.0)
    r = row(m, 1, 0.1)
    assert (r.host, r.pid, r.device, r.gpu_name) == ("node0", 101, "cuda:1", "NVIDIA H100")
    assert (r.gpu_mem_used, r.gpu_mem_total, r.state) == (3 << 30, 80 << 30, "idle")
    assert row(m, 0, 0.1).state == "starting"


def test_bytes_and_ops_rates_come_from_counters_over_engine_time():
    m = M.DashboardModel(rate_window_s=2.0)
    for i in range(8):  # engine clock steps 0.5 s; the driver receives with jitter
        m.ingest(0, snap(0, 0.5 * i, ar_bytes=4_000_000 * i, ar_ops=10 * i),
                 now=0.5 * i + (0.2 if i % 2 else 0.0))
    r = row(m, 0, 4.0)
    assert r.unit == M.BYTES
    assert r.rate == pytest.approx(8_000_000)
    assert r.ops_rate == pytest.approx(20)


def test_a_pipeline_stage_rate_counts_the_bytes_it_sends_point_to_point():
    m = M.DashboardModel(rate_window_s=2.0)
    for i in range(5):  # no allreduce at all: activations sent to the next stage
        s = snap(0, i)
        s["core"]["bytes"]["send"] = 3_000_000 * i
        s["core"]["bytes"]["recv"] = 1_000_000 * i  # (what it receives is the others' sending)
        m.ingest(0, s, now=float(i))
    r = row(m, 0, 5.0)
    assert (r.unit, r.rate) == (M.BYTES, pytest.approx(3_000_000))


def test_samples_are_preferred_once_reported():
    m = M.DashboardModel()
    for i in range(5):
        m.ingest(0, snap(0, i, samples=64 * i, ar_bytes=10**6 * i), now=float(i))
    r = row(m, 0, 5.0)
    assert (r.unit, r.rate) == (M.SAMPLES, pytest.approx(64))


def test_counter_reset_restarts_the_baseline_instead_of_a_negative_rate():
    m = M.DashboardModel()
    m.ingest(0, snap(0, 0, ar_bytes=10**9), now=0.0)
    m.ingest(0, snap(0, 1, ar_bytes=2 * 10**9), now=1.0)
    m.ingest(0, snap(0, 2, ar_bytes=1000), now=2.0)  # core re-initialised
    assert row(m, 0, 2.0).rate is None
    m.ingest(0, snap(0, 3, ar_bytes=1000 + 500), now=3.0)
    assert row(m, 0, 3.0).rate == pytest.approx(500)


def test_sparkline_keeps_one_point_per_second_for_a_minute():
    m = M.DashboardModel()
    for i in range(400):  # 0.3 s snapshots for 120 s
        m.ingest(0, snap(0, 0.3 * i, ar_bytes=1000 * i), now=0.3 * i)
    spark = row(m, 0, 120.0).spark
    assert 55 <= len(spark) <= 61
    assert all(v == pytest.approx(1000 / 0.3) for v in spark)


def test_idle_running_and_short_collectives():
    m = M.DashboardModel(collective_after_s=0.5)
    m.ingest(0, snap(0, 0), now=0.0)
    assert (row(m, 0, 0.0).state, row(m, 0, 0.0).detail) == ("idle", "idle")
    m.ingest(0, snap(0, 1, busy=True, cell="train(model)"), now=1.0)
    assert (row(m, 0, 1.0).state, row(m, 0, 1.0).detail) == ("running", "running cell train(model)")
    m.ingest(0, snap(0, 2, busy=True, collective=coll(0.1)), now=2.0)
    assert row(m, 0, 2.0).state == "running"  # too short to flicker into the state column
    m.ingest(0, snap(0, 3, busy=True, collective=coll(1.5, missing=[2, 3])), now=3.0)
    r = row(m, 0, 3.5)
    assert r.state == "collective"
    assert r.detail == "in allreduce 'grad.fc1.weight' for 2.0 s, waiting for ranks 2, 3"


def test_stalled_after_n_seconds_without_progress_in_a_collective():
    m = M.DashboardModel(stall_after_s=10.0)
    for i in range(5):  # progressing normally
        m.ingest(0, snap(0, i, ar_ops=i, busy=True), now=float(i))
    for i in range(5, 15):  # stuck: same counters, one collective getting older
        m.ingest(0, snap(0, i, ar_ops=4, busy=True, collective=coll(i - 4.5, missing=[1])),
                 now=float(i))
    assert row(m, 0, 14.0).state == "collective"  # 9.5 s in it, 10 s quiet: not yet
    m.ingest(0, snap(0, 15, ar_ops=4, busy=True, collective=coll(10.5, missing=[1])), now=15.0)
    r = row(m, 0, 15.0)
    assert r.state == "stalled"
    assert r.detail == "stalled in allreduce 'grad.fc1.weight' for 10 s, waiting for rank 1"
    # still stalled when snapshots stop arriving: the age keeps growing on the driver clock
    assert row(m, 0, 30.0).detail.startswith("stalled in allreduce 'grad.fc1.weight' for 25 s")


def test_long_collective_with_progress_is_not_stalled():
    m = M.DashboardModel(stall_after_s=5.0)
    for i in range(20):  # a slow but moving pipeline: counters grow, something always pending
        m.ingest(0, snap(0, i, ar_ops=i, collective=coll(6.0)), now=float(i))
    assert row(m, 0, 19.0).state == "collective"


def test_dead_rank_ignores_late_snapshots_and_revives_with_a_new_pid():
    m = M.DashboardModel()
    m.ingest(2, snap(2, 0), now=0.0)
    m.mark_dead(2, signal=9)
    assert (row(m, 2, 1.0).state, row(m, 2, 1.0).detail) == ("dead", "dead (signal 9, SIGKILL)")
    m.ingest(2, snap(2, 1), now=1.0)  # late message from the dead process
    assert row(m, 2, 1.0).state == "dead"
    m.ingest(2, snap(2, 0, pid=500), now=2.0)  # %hvd_restart: new engine, new pid
    assert row(m, 2, 2.0).state == "idle"
    m.mark_dead(2, exit_code=1)
    assert row(m, 2, 3.0).detail == "dead (exit code 1)"


def test_stale_rank_is_flagged():
    m = M.DashboardModel(stale_after_s=3.0)
    m.ingest(0, snap(0, 0), now=0.0)
    assert row(m, 0, 2.0).stale_s is None
    assert row(m, 0, 7.0).stale_s == pytest.approx(7.0)


def test_cluster_row_totals_spread_fusion_and_time_split():
    m = M.DashboardModel()
    for i in range(5):
        t = float(i)
        for rank, samples, wait in ((0, 100, 0.4), (1, 80, 0.1)):
            m.ingest(rank, snap(rank, t, samples=samples * i, fused=(2 * i, 20 * i),
                                waits=(0.05 * t, 0.2 * t, wait * t), busy=True), now=t)
    c = m.cluster(4.0)
    assert (c.ranks, c.counts, c.unit) == (2, {"running": 2}, M.SAMPLES)
    assert c.total_rate == pytest.approx(180)
    assert (c.slowest[0], c.fastest[0]) == (1, 0)
    assert c.spread == pytest.approx(0.2)
    assert c.fusion == pytest.approx(10.0)
    assert c.split == pytest.approx({"compute": 0.75, "negotiate": 0.05, "communicate": 0.2,
                                     "wait": 0.25})
    assert c.straggler == 1  # rank 1 waits least: the others wait for it
    assert len(c.spark) >= 4
    for rank in (0, 1):  # the cell ended: outside wait() is no longer "compute"
        m.ingest(rank, snap(rank, 5.0, samples=500, fused=(10, 100), waits=(0.25, 1.0, 2.0)),
                 now=5.0)
    assert "compute" not in m.cluster(5.0).split
    from hvd_magic.widgets.text import render
    assert "compute" not in render(m, 5.0) and "spread" in render(m, 5.0)


def test_time_split_without_framework_wait_shows_the_loop_only():
    m = M.DashboardModel()
    for i in range(3):
        s = snap(0, i)
        s["core"].pop("wait_s")
        s["core"].update(negotiate_s=0.1 * i, communicate_s=0.3 * i, idle_s=0.6 * i)
        m.ingest(0, s, now=float(i))
    c = m.cluster(2.0)
    assert c.split == pytest.approx({"negotiate": 0.1, "communicate": 0.3, "idle": 0.6})
    assert c.straggler is None


def test_cluster_excludes_dead_ranks_from_throughput():
    m = M.DashboardModel()
    for i in range(3):
        for r in (0, 1):
            m.ingest(r, snap(r, i, ar_bytes=1000 * i), now=float(i))
    m.mark_dead(1, exit_code=137)
    c = m.cluster(3.0)
    assert c.total_rate == pytest.approx(1000)
    assert c.counts == {"idle": 1, "dead": 1}


def test_autotune_panel_accumulates_scores_and_resets_for_a_new_run():
    m = M.DashboardModel()
    assert m.autotune() is None
    at = {"enabled": True, "phase": "bayes", "sample": 3, "samples": 20,
          "current": {"fusion_threshold": 64 << 20, "cycle_time_ms": 2.5},
          "best": {"fusion_threshold": 32 << 20, "cycle_time_ms": 5.0}, "best_score": 2e9,
          "scores": [[1, 1e9], [2, 2e9]]}
    m.ingest(0, snap(0, 0, autotune=at), now=0.0)
    m.ingest(0, snap(0, 1, autotune={**at, "sample": 4, "scores": [[3, 1.5e9]]}), now=1.0)
    p = m.autotune()
    assert (p.enabled, p.phase, p.sample, p.samples, p.best_score) == (True, "bayes", 4, 20, 2e9)
    assert p.current == {"fusion_threshold": 64 << 20, "cycle_time_ms": 2.5}
    assert p.best["fusion_threshold"] == 32 << 20
    assert p.scores == ((1, 1e9), (2, 2e9), (3, 1.5e9))
    m.ingest(1, snap(1, 1, autotune={**at, "sample": 2, "scores": [[1, 1e9]]}), now=1.5)
    assert len(m.autotune().scores) == 3  # a lagging rank does not look like a new run
    m.ingest(0, snap(0, 2, autotune={**at, "sample": 1, "scores": [[0, 5e8]]}), now=2.0)
    assert m.autotune().scores == ((0, 5e8),)


def test_timeline_places_events_relative_to_now_and_adds_open_collectives():
    m = M.DashboardModel(timeline_span_s=10.0)
    ev = [["allreduce", "grad.a", 0.5, 0.2], ["broadcast", "params", 8.0, 0.1]]
    m.ingest(0, snap(0, 0, events=ev), now=100.0)
    m.ingest(1, snap(1, 0, collective=coll(1.0)), now=100.0)
    lanes = m.timeline(now=101.0, span_s=5.0)
    assert [lane.rank for lane in lanes] == [0, 1]
    (op, name, start, dur, is_open), = lanes[0].bars  # the broadcast is older than 5 s
    assert (op, name, is_open) == ("allreduce", "grad.a", False)
    assert (start, dur) == (pytest.approx(-1.5), pytest.approx(0.2))
    (op, name, start, dur, is_open), = lanes[1].bars
    assert (op, is_open, start, dur) == ("allreduce", True, pytest.approx(-2.0), pytest.approx(2.0))
    m.ingest(0, snap(0, 20), now=120.0)  # events older than timeline_span_s are dropped
    assert m.timeline(now=120.0, span_s=60.0)[0].bars == ()


def test_timeline_flag_and_forget():
    m = M.DashboardModel()
    assert m.timeline_active() is None
    m.ingest(0, snap(0, 0, timeline=True), now=0.0)
    assert m.timeline_active() is True
    m.forget([0])
    assert m.ranks() == []


def test_back_to_back_events_are_kept_as_one_bar_with_their_count():
    """A training loop's allreduces (gaps far below a pixel) cost the strip one bar per
    ``max_bar_s``, not one per collective; merged entries from the engine add up."""
    m = M.DashboardModel(timeline_span_s=10.0)
    dense = [["allreduce", f"grad.{i}", 1.0 - i * 0.001, 0.0008] for i in range(400)]
    m.ingest(0, snap(0, 0, events=dense + [["broadcast", "w", 0.5, 0.01]]), now=100.0)
    m.ingest(0, snap(0, 1, events=[["allreduce", "grad.0", 0.2, 0.05, 50, 0.04]]), now=100.5)
    bars = m.timeline(now=100.5, span_s=5.0)[0].bars
    merged = [b for b in bars if b[0] == "allreduce"]
    assert [b[5] for b in merged] == [250, 150, 50] and merged[0][1] == "grad.0"
    assert all(b[3] <= m.max_bar_s + 1e-9 for b in merged)
    assert sum(b[6] for b in merged[:2]) == pytest.approx(400 * 0.0008) and merged[2][6] == 0.04
    assert [b[:2] for b in bars if len(b) == 5] == [("broadcast", "w")]
    m2 = M.DashboardModel(max_bar_s=0.0)  # merging off: every event its own bar
    m2.ingest(0, snap(0, 0, events=dense), now=100.0)
    assert len(m2.timeline(now=100.0, span_s=5.0)[0].bars) == 400


def test_world_changes_are_kept_across_forget_and_shown_as_text_and_html():
    from hvd_magic.widgets.text import render
    from hvd_magic.widgets.view import cluster_html

    m = M.DashboardModel(size=4)
    for gen in range(1, 5):
        m.record_world(M.WorldChange(gen, 3 + gen % 2, 4 - gen % 2))
    m.record_world(M.WorldChange(5, 4, 3, ((3, 4250, "killed by SIGKILL"),)))
    m.forget()  # the ranks are renumbered after a change; the record stays
    world = m.cluster(1.0).world
    assert [w.generation for w in world] == [3, 4, 5]  # the latest three
    line = "generation 5: 4 -> 3 ranks, rank 3 (pid 4250) left: killed by SIGKILL"
    assert line in render(m, 1.0)
    assert line.replace("->", "-&gt;") in cluster_html(m.cluster(1.0))
