"""Widget view state, controls, the text status, and the hub's throttled single updater."""

import io
import threading
import time

import pytest

import zmq
from comm import DummyComm  # the comm ipywidgets uses without a kernel

from hvd_magic.widgets import hub as H, model as M, snapshot as S, text as T, view as V
from hvd_magic.widgets import startup as St

pytestmark = pytest.mark.timeout(60)
KEY = b"test-key"


def snap(rank, t, seq=0, **core):
    base = {"ops": {"allreduce": int(10 * t)}, "bytes": {"allreduce": int(1e6 * t)}}
    return {"v": 1, "rank": rank, "t": 1000.0 + t, "seq": seq, "pub": f"publisher-{rank}",
            "pid": 10 + rank, "host": "node0",
            "busy": True, "cell": "train()", "samples": 0, "device": {"kind": "cpu"},
            "core": {**base, **core}}


@pytest.fixture
def sent(monkeypatch):
    """Every widget state update that would reach the frontend, as (comm_id, state) pairs."""
    out = []

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        if msg_type == "comm_msg" and data and data.get("method") == "update":
            out.append((self.comm_id, data["state"]))

    monkeypatch.setattr(DummyComm, "publish_msg", publish_msg)
    return out


def fed_model(n=2, t_end=3):
    m = M.DashboardModel()
    for t in range(t_end + 1):
        for r in range(n):
            m.ingest(r, snap(r, t), now=float(t))
    return m


def test_rows_show_rank_state_throughput_and_escape_engine_text():
    m = fed_model()
    m.ingest(1, snap(1, 4, collective={"op": "allreduce", "name": "<script>x</script>",
                                       "age_s": 2.0, "missing": [0]}), now=4.0)
    v = V.DashboardView()
    v.update(m, 4.0)
    rows = v.rows_box.children[1:]
    assert len(rows) == 2
    r0, r1 = rows[0].value, rows[1].value
    assert "r0" in r0 and "node0" in r0 and "running cell train()" in r0 and "1.00 MB/s" in r0
    assert "<polyline" in r0  # sparkline
    assert "<script>" not in r1 and "&lt;script&gt;" in r1
    assert "waiting for rank 0" in r1
    assert "cluster" in v.cluster.value and "total 2.00 MB/s" in v.cluster.value
    assert v.autotune.layout.display == "none"
    assert "<svg" in v.timeline.value and "r1" in v.timeline.value


def test_unchanged_values_are_not_resent(sent):
    m = fed_model()
    v = V.DashboardView()
    v.update(m, 3.0)
    first, assigned = len(sent), v.assignments
    assert first >= 3  # rows container, two rows, cluster, ...
    v.update(m, 3.0)
    v.update(m, 3.1)
    assert len(sent) == first and v.assignments == assigned
    m.ingest(0, snap(0, 3.5, ops_extra=1, last_error="peer 1 closed"), now=3.5)
    v.update(m, 3.5)
    changed = {cid for cid, _ in sent[first:]}
    assert v._rows[0].comm.comm_id in changed
    assert v._rows[1].comm.comm_id not in changed


def test_traits_changed_together_go_in_one_message(sent):
    v = V.DashboardView(on_timeline=lambda start: None)
    before = len(sent)
    v.timeline_button.click()
    msgs = [state for cid, state in sent[before:] if cid == v.timeline_button.comm.comm_id]
    assert len(msgs) == 1
    assert msgs[0]["description"] == "Stop timeline" and msgs[0]["button_style"] == "warning"


def test_controls_call_the_callables_and_report_failures():
    calls = []
    v = V.DashboardView(on_stop=lambda: calls.append("stop"),
                        on_timeline=lambda start: calls.append(("timeline", start)),
                        on_autotune=lambda enable: 1 / 0)
    v.stop_button.click()
    v.timeline_button.click()
    v.timeline_button.click()
    assert calls == ["stop", ("timeline", True), ("timeline", False)]
    assert v.timeline_button.description == "Start timeline"
    v.autotune_button.click()
    assert "ZeroDivisionError" in v.message.value
    assert v.autotune_button.description == "Autotune on"  # state not toggled on failure
    assert V.DashboardView().stop_button.disabled  # no callable, no button


def test_an_answer_that_beats_the_clicks_own_line_stays_shown():
    """The hub thread may show the engines' answer before the clicking thread shows its
    "starting..." line (it waits for the view's lock while the hub renders): the answer stays."""
    def timeline(start):
        v.show_message("timeline: recording to /tmp/t.json")  # the hub thread, first
        return "starting the timeline..."

    v = V.DashboardView(on_timeline=timeline)
    v.timeline_button.click()
    assert "recording to /tmp/t.json" in v.message.value
    assert v.timeline_button.description == "Stop timeline"


def test_a_click_is_not_undone_by_a_snapshot_that_predates_it():
    m = M.DashboardModel()
    m.ingest(0, snap(0, 0, timeline=False), now=0.0)
    v = V.DashboardView(on_timeline=lambda start: None)
    v.timeline_button.click()
    v.update(m, 0.1)  # the engines have not seen the start yet
    assert v.timeline_button.description == "Stop timeline"


def test_view_exports_as_static_widget_state(tmp_path):
    from ipywidgets.embed import embed_minimal_html
    v = V.DashboardView()
    v.update(fed_model(), 3.0)
    embed_minimal_html(tmp_path / "dash.html", views=[v.widget], title="hvd")
    html = (tmp_path / "dash.html").read_text()
    assert "application/vnd.jupyter.widget-state+json" in html and "polyline" in html


def test_autotune_panel_and_timeline_flag_follow_the_model():
    m = M.DashboardModel()
    at = {"enabled": True, "phase": "bayes", "sample": 3, "samples": 20,
          "current": {"fusion_threshold": 64 << 20}, "best": {"fusion_threshold": 32 << 20},
          "best_score": 2.5e9, "scores": [[1, 1e9], [2, 2.5e9]]}
    m.ingest(0, snap(0, 0, autotune=at, timeline=True), now=0.0)
    v = V.DashboardView()
    v.update(m, 0.0)
    assert v.autotune.layout.display == ""
    assert "bayes sample 3/20" in v.autotune.value and "64.0 MiB" in v.autotune.value
    assert "2.50 GB/s" in v.autotune.value and "<circle" in v.autotune.value
    assert v.timeline_button.description == "Stop timeline"
    assert v.autotune_button.description == "Autotune off"


def test_text_render_and_status_prints_only_on_state_changes():
    m = fed_model()
    out = io.StringIO()
    status = T.TextStatus(stream=out, heartbeat_s=30.0)
    status.update(m, 3.0)
    status.update(m, 3.2)
    assert status.printed == 1
    text = out.getvalue()
    assert text.startswith("hvd: 2 ranks (2 running) · 2.00 MB/s")
    assert "r1 node0 pid 11 cpu running cell train()" in text
    m.mark_dead(1, exit_code=1)
    status.update(m, 3.4)
    assert status.printed == 2 and "dead (exit code 1)" in out.getvalue()
    status.update(m, 40.0)  # heartbeat while rank 0 is still running
    assert status.printed == 3


def test_dashboard_mode_falls_back_to_text(monkeypatch):
    monkeypatch.delenv("HVD_DASHBOARD", raising=False)
    monkeypatch.delenv("IPP_NONINTERACTIVE", raising=False)
    assert St.dashboard_mode() == "text"  # no IPython kernel in pytest
    monkeypatch.setenv("HVD_DASHBOARD", "widgets")
    assert St.dashboard_mode() == "widgets"
    monkeypatch.setenv("HVD_DASHBOARD", "")
    monkeypatch.setenv("IPP_NONINTERACTIVE", "1")
    assert St.dashboard_mode("auto") == "text"


class Recorder:
    """A sink recording render times; signals when ``done(model)`` becomes true."""

    def __init__(self, done):
        self.times, self.done, self.event = [], done, threading.Event()

    def update(self, model, now):
        self.times.append(now)
        if self.done(model):
            self.event.set()


def push_socket(address):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(address)
    return sock


def test_hub_rejects_foreign_frames_and_renders_promptly_on_mark_dead():
    rec = Recorder(lambda m: hub.rejected == 2 and hub.received == 1)
    hub = H.MetricsHub(M.DashboardModel(size=1), [rec], key=KEY, refresh_s=60.0)
    sock = push_socket(hub.start())
    try:
        sock.send(S.pack(snap(0, 0), b"wrong key"))
        sock.send(b"garbage")
        sock.send(S.pack(snap(0, 0), KEY))
        assert rec.event.wait(10)
        assert hub.model.rows(time.monotonic())[0].state == "running"
        rec.event.clear()
        rec.done = lambda m: m.rows(time.monotonic())[0].state == "dead"
        hub.mark_dead(0, signal=9)  # no new data and no refresh due: only the wake-up renders
        assert rec.event.wait(10)
        assert hub.model.rows(time.monotonic())[0].detail == "dead (signal 9, SIGKILL)"
    finally:
        sock.close()
        hub.stop()


def test_hub_stops_cleanly_and_survives_a_broken_sink():
    class Broken:
        def update(self, model, now):
            raise RuntimeError("boom")

    rec = Recorder(lambda m: True)
    hub = H.MetricsHub(M.DashboardModel(), [Broken(), rec])
    hub.start()
    hub.notify()
    assert rec.event.wait(10)
    assert hub.running
    thread = hub._thread
    hub.stop()
    hub.stop()
    assert not hub.running
    assert not thread.is_alive()  # (other hubs, e.g. a cluster's dashboard, may be running)


def test_start_dashboard_in_text_mode(monkeypatch):
    monkeypatch.setenv("HVD_DASHBOARD", "text")
    hub = St.start_dashboard(size=2, key=KEY)
    try:
        assert hub.running and hub.view is None
        assert hub.address.startswith("tcp://127.0.0.1:")
        assert [r.state for r in hub.model.rows(time.monotonic())] == ["starting", "starting"]
    finally:
        hub.stop()


def test_a_callback_may_answer_with_a_line_and_rows_carry_test_hooks():
    v = V.DashboardView(on_stop=lambda: "no %%hvd cell is running")
    v.stop_button.click()
    assert "no %%hvd cell is running" in v.message.value
    v.update(fed_model(), 3.0)
    html = v.rows_box.children[1].value
    assert 'class="hvd-row" data-rank="0"' in html and 'class="hvd-rate"' in html
    assert "hvd-dashboard" in v.widget._dom_classes


def test_the_autotune_button_follows_a_core_that_stopped_tuning():
    """After the core is re-initialised (a Stop) it reports no autotuner: the button says off."""
    m = M.DashboardModel()
    at = {"enabled": True, "phase": "bayes", "sample": 1, "samples": 20, "scores": []}
    m.ingest(0, snap(0, 0, autotune=at), now=0.0)
    v = V.DashboardView(on_autotune=lambda enable: None)
    v.update(m, 0.0)
    assert v.autotune_button.description == "Autotune off"
    m.ingest(0, {**snap(0, 1), "core": {"ops": {}, "bytes": {}}}, now=1.0)  # re-initialised
    v.update(m, 1.0)
    assert v.autotune_button.description == "Autotune on" and v.autotune.layout.display == "none"


def test_timeline_strip_stays_small_with_hundreds_of_collectives_a_second():
    from hvd_magic.widgets.sparkline import timeline_strip

    dense = tuple(("allreduce", f"grad.{i % 6}", -5 + i * 0.0015, 0.0008, False)
                  for i in range(3300))  # 660 a second for 5 s, no gap wider than a pixel
    sparse = tuple(("broadcast", "w", -4.0 + i, 0.001, False) for i in range(4))
    running = (("allreduce", "stuck", -0.04, 0.04, True),)
    svg = timeline_strip([M.Lane(0, dense + running), M.Lane(1, sparse)])
    assert svg.count("<rect") == 2 + 1 + 1 + 4  # backgrounds, merged run, running op, sparse
    assert len(svg) < 3000 and "3300 x allreduce" in svg and "(running)" in svg
    merged = (("allreduce", "grad.0", -3.0, 0.25, False, 300, 0.2),
              ("allreduce", "grad.0", -2.75, 0.25, False, 200, 0.1))
    svg = timeline_strip([M.Lane(0, merged)])
    assert svg.count("<rect") == 2 and "500 x allreduce (grad.0, ...) 300.0 ms" in svg


def paced(pacer, arrivals, until, model=None, sinks=()):
    """Drive ``pacer`` as the hub's thread does (widgets/hub.py ``_loop``): sleep until its
    due time or the next snapshot, ingest what arrived, render when it says so. ``arrivals``
    are ``(time, rank)``, or ``(time, rank, snapshot)`` to ingest into ``model``, and a render
    calls each sink's ``update(model, now)``; returns ``[(time, ranks with news in that
    render)]``."""
    arrivals, renders, news, now = sorted(arrivals, key=lambda a: a[:2]), [], set(), 0.0
    while now < until:
        now = min(arrivals[0][0] if arrivals else until, pacer.due(now), until)
        while arrivals and arrivals[0][0] <= now:
            _, rank, *snapshot = arrivals.pop(0)
            if snapshot:
                model.ingest(rank, snapshot[0], now)
            news.add(rank)
            pacer.arrived(rank, now)
        if pacer.render_due(now):
            for sink in sinks:
                sink.update(model, now)
            renders.append((round(now, 6), sorted(news)))
            news = set()
        else:  # its own promise; broken, this loop would stand still (the hub's would spin)
            assert pacer.due(now) > now, f"due({now!r}) = {pacer.due(now)!r}, render_due refused"
    return renders


def test_hub_renders_once_per_round_of_snapshots_from_unsynchronised_ranks():
    """Two ranks each publishing every 0.3 s, half a period apart: one render per round, each
    with both ranks' news, not one per snapshot (up to the 5 Hz cap). Driven on the pacer's
    own clock: exact counts."""
    rounds = 20
    arrivals = [(round(0.3 * i, 6), 0) for i in range(rounds)] + \
               [(round(0.3 * i + 0.15, 6), 1) for i in range(rounds)]
    renders = paced(H.MetricsHub(max_hz=5.0, gather_s=0.25).pacer, arrivals, until=10.0)
    # the start (rank 0 alone), a round each time rank 0's snapshot completes one, the last
    # snapshot (rank 1's) after gather_s, then a refresh a second while nothing is new
    assert renders[0] == (0.0, [0])
    assert renders[1:rounds] == [(round(0.3 * i, 6), [0, 1]) for i in range(1, rounds)]
    assert renders[rounds:] == [(6.1, [1]), (7.1, []), (8.1, []), (9.1, [])]  # 5.85 + 0.25
    # without the gathering, the same stream renders at the 5 Hz cap, mostly one rank's news
    eager = paced(H.MetricsHub(max_hz=5.0, gather_s=0.0).pacer, arrivals, until=6.0)
    assert [t for t, _ in eager] == [round(0.2 * k, 6) for k in range(30)]


def test_a_render_asked_for_at_once_passes_the_throttle_which_counts_from_it():
    """A cell's end (``MetricsHub.sync_view``) renders at once, 10 ms after a render; the
    throttle then counts from it. Driven on the pacer's own clock."""
    pacer = H.MetricsHub(max_hz=5.0, gather_s=0.0).pacer
    assert pacer.render_due(1.0)  # the start
    pacer.arrived(0, 1.005)
    assert not pacer.render_due(1.005) and pacer.due(1.005) == 1.2
    pacer.wake(at_once=True)
    assert pacer.due(1.01) <= 1.01 and pacer.render_due(1.01)
    pacer.arrived(0, 1.02)
    assert not pacer.render_due(1.2) and pacer.due(1.02) == 1.21 and pacer.render_due(1.21)
    pacer.wake()  # (a plain wake-up: as soon as the throttle allows)
    assert not pacer.render_due(1.3) and pacer.render_due(1.41)


def test_hub_coalesces_a_stream_of_snapshots_into_at_most_5_renders_per_second(sent):
    """Two ranks' snapshots 10 ms apart (100 a second for 1.5 s, twenty per 5 Hz interval):
    a render every 0.2 s, each showing both ranks' newest snapshot, and the last snapshots'
    news rendered once the throttle allows, coalesced rather than dropped. Driven on the
    pacer's own clock: exact counts."""
    n = 150
    arrivals = [(round(0.005 + 0.01 * i, 6), i % 2,  # off the 0.2 s grid: no ties
                 {**snap(i % 2, 0.005 + 0.01 * i, seq=i), "samples": i + 1}) for i in range(n)]

    class Shown:
        """What each render showed: each rank's samples, from its newest snapshot."""
        def __init__(self):
            self.samples = []

        def update(self, model, now):
            self.samples.append([r.samples for r in model.rows(now)])

    shown, view = Shown(), V.DashboardView()
    renders = paced(H.MetricsHub(max_hz=5.0).pacer, arrivals, until=2.0,
                    model=M.DashboardModel(), sinks=[shown, view])
    # the start (no rank yet), then one render per 0.2 s while the stream lasts, not one per
    # snapshot: the last snapshots (to 1.495 s) at 1.6 s, and nothing new after them
    assert renders == [(0.0, [])] + [(round(0.2 * k, 6), [0, 1]) for k in range(1, 9)]
    # each render shows the newest snapshot of each rank (samples = its index + 1), the last
    # one rank 1's 150th: every snapshot's news rendered, at most 0.2 s late
    assert shown.samples == [[]] + [[20 * k - 1, 20 * k] for k in range(1, 8)] + [[n - 1, n]]
    row_ids = {w.comm.comm_id for w in view._rows.values()}
    row_msgs = [cid for cid, _ in sent if cid in row_ids]
    # one message per row per render after the one that built the rows (0.2 s): never more
    assert len(row_msgs) == 2 * (len(renders) - 2)


def test_the_refresh_is_due_exactly_when_the_pacer_says():
    """due() and render_due() agree to the last bit: after a render at 1.6 s (a sum of 0.2 s
    steps: 1.5999999999999999), due() named 2.5999999999999996 while render_due() there
    computed 0.9999999999999998 < 1.0 and refused, so a hub polling until due() spun."""
    pacer = H.MetricsHub(max_hz=5.0).pacer
    now = 0.0
    assert pacer.render_due(now)
    for _ in range(8):
        now += 0.2
        pacer.wake()
        assert pacer.render_due(now)
    assert now != 1.6  # the inexact time the bug needed
    assert pacer.render_due(pacer.due(now))
