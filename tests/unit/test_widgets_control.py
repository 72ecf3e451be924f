"""Dashboard commands (widgets/control.py): framing and signatures, the driver's bookkeeping of
answers, and a real round trip hub -> publisher thread -> handler -> ack -> on_done."""

import threading
import time

import pytest

from hvd_magic.widgets import control as C
from hvd_magic.widgets import hub as H
from hvd_magic.widgets import model as M
from hvd_magic.widgets import publisher as P
from hvd_magic.widgets import snapshot as S

pytestmark = pytest.mark.timeout(60)
KEY = b"job-key"


def test_command_frames_round_trip_and_reject_tampering():
    frame = C.pack_command(7, "timeline", {"start": True, "path": "/tmp/t.json"}, KEY,
                           to=["a1b2", "c3d4"])
    assert C.unpack_command(frame, KEY) == (7, "timeline", {"start": True, "path": "/tmp/t.json"},
                                            ["a1b2", "c3d4"])
    with pytest.raises(ValueError, match="bad signature"):
        C.unpack_command(frame, b"other-key")
    with pytest.raises(ValueError, match="bad signature"):
        C.unpack_command(frame[:-2] + b"0}", KEY)
    with pytest.raises(ValueError, match=r"expected \{id: int"):
        C.unpack_command(C.pack_command(1, "x", {}).replace(b'"id":1', b'"id":"1"'), None)
    with pytest.raises(ValueError, match=r"to: \[publisher id\]"):
        C.unpack_command(C.pack_command(1, "x", {}, to=[""]), None)


def test_acks_travel_in_snapshots_and_bad_ones_are_dropped():
    snap = {"v": 1, "rank": 0, "t": 1.0,
            "acks": [[3, True, "ok"], [4, False, "ValueError: x"], ["5", True, ""], [6, 1, ""]]}
    assert S.unpack(S.pack(snap, KEY), KEY)["acks"] == [[3, True, "ok"],
                                                        [4, False, "ValueError: x"]]


def test_pending_ends_when_every_rank_answered_or_at_the_deadline():
    now = [0.0]
    done = []
    pending = C.Pending(lambda: now[0])
    pending.sent(1, [0, 1, 2], 5.0, lambda a, m: done.append((1, a, m)))
    pending.sent(2, [0, 1], 5.0, lambda a, m: done.append((2, a, m)))
    pending.ack(0, [[1, True, "a"], [2, True, "b"]])
    pending.ack(1, [[1, False, "boom"], [2, True, "c"], [2, False, "late duplicate"]])
    assert done == [(2, {0: (True, "b"), 1: (True, "c")}, [])] and len(pending) == 1
    now[0] = 5.0
    pending.expire()
    assert done[-1] == (1, {0: (True, "a"), 1: (False, "boom")}, [2]) and len(pending) == 0
    pending.sent(3, [], 5.0, lambda a, m: done.append((3, a, m)))  # nobody to wait for
    assert done[-1] == (3, {}, [])


def test_a_failing_on_done_does_not_escape():
    pending = C.Pending(time.monotonic)
    pending.sent(1, [0], 5.0, lambda a, m: 1 / 0)
    pending.ack(0, [[1, True, ""]])
    assert len(pending) == 0


def _until_every_rank_answers(hub, ranks, deadline_s=10.0):
    """The readiness handshake of PUB/SUB: a frame published before a subscriber's
    subscription reached the hub is dropped, and nothing tells the hub when it arrived. So
    send "ready" probes (0.5 s each) until one is answered by every rank in ``ranks``."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        done, answers = threading.Event(), {}
        hub.command("ready", on_done=lambda a, m: (answers.update(a), done.set()), timeout_s=0.5)
        assert done.wait(5), "the hub never ended a ready probe"
        if set(answers) >= set(ranks):
            return
    raise AssertionError(f"publishers {sorted(ranks)} did not all answer within {deadline_s} s")


def test_hub_command_reaches_publisher_handlers_and_answers_come_back():
    model = M.DashboardModel(size=2)
    hub = H.MetricsHub(model, key=KEY)
    hub.start()
    calls, answers, probes = [], [], []
    got = threading.Event()

    def handler(start, path=None):
        calls.append((threading.current_thread().name, start, path))
        if path is None:
            raise ValueError("no path")
        return f"recording to {path}"

    def ready():
        probes.append(threading.current_thread().name)
        return "ready"

    pubs = [P.Publisher(hub.address, rank=r, key=KEY, interval_s=0.05,
                        command_address=hub.command_address,
                        handlers={"timeline": handler, "ready": ready}).start() for r in range(2)]
    try:
        assert hub.wait_for_ranks([0, 1], 10), "publishers never reached the hub"
        _until_every_rank_answers(hub, [0, 1])

        def on_done(a, m):
            answers.append((a, m))
            got.set()

        hub.command("timeline", on_done=on_done, start=True, path="/tmp/x.json")
        assert got.wait(10)
        got.clear()
        hub.command("timeline", on_done=on_done, start=False)
        assert got.wait(10)
        got.clear()
        hub.command("nope", on_done=on_done, timeout_s=3)
        assert got.wait(10)
    finally:
        for p in pubs:
            p.stop()
        hub.stop()
    assert answers[0] == ({0: (True, "recording to /tmp/x.json"),
                           1: (True, "recording to /tmp/x.json")}, [])
    assert answers[1] == ({0: (False, "ValueError: no path"), 1: (False, "ValueError: no path")},
                          [])
    assert answers[2][0][0] == (False, "NotImplementedError: this engine has no handler for 'nope'")
    assert {name for name, *_ in calls} == {"hvd-metrics-r0", "hvd-metrics-r1"}  # their threads
    for p in pubs:  # the three commands, plus the probes that reached this publisher
        assert p.commands_run == 3 + probes.count(f"hvd-metrics-r{p.rank}"), p.commands_run


def test_hub_stop_reports_unanswered_commands_as_missing():
    hub = H.MetricsHub(M.DashboardModel(), key=KEY)
    hub.start()
    answers = []
    hub.model.ingest(0, {"v": 1, "rank": 0, "t": 1.0, "pid": 1}, time.monotonic())
    hub.command("timeline", on_done=lambda a, m: answers.append((a, m)), timeout_s=60, start=True)
    deadline = time.monotonic() + 5
    while not hub._pending and time.monotonic() < deadline:
        time.sleep(0.01)
    hub.stop()
    assert answers == [({}, [0])]


def _until(condition, deadline_s=10.0):
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met within its deadline"
        time.sleep(0.01)


def test_stop_ends_the_publisher_s_wait_at_once():
    """stop() wakes the thread where it waits for commands between snapshots (60 s apart here):
    an engine's exit does not wait out the interval."""
    hub = H.MetricsHub(M.DashboardModel(size=1), key=KEY)
    hub.start()
    pub = P.Publisher(hub.address, rank=0, key=KEY, interval_s=0.05,
                      command_address=hub.command_address).start()
    thread = pub._thread
    try:
        assert hub.wait_for_ranks([0], 10), "the publisher never reached the hub"
        pub.interval_s, sent = 60.0, pub.sent
        _until(lambda: pub.sent > sent)  # the wait after that snapshot reads the 60 s
        t0 = time.monotonic()
        pub.stop(timeout=30.0)
        assert not thread.is_alive() and time.monotonic() - t0 < 10.0
    finally:
        pub.stop()
        hub.stop()


def test_sync_view_renders_every_rank_as_it_is_now(monkeypatch):
    """``MetricsHub.sync_view`` (what a cell's end calls): every publisher sends its snapshot
    at once and one render shows them all, though periodic snapshots are 1 s apart and the
    throttle allows the next render only 10 s after the last. A rank whose publisher stopped
    makes it return False after its timeout, the other shown as it is now; the next call does
    not wait for that publisher, but for a new one of the same rank."""
    samples = [0]
    monkeypatch.setattr(P, "_reported", lambda: (samples[0], {}, None))
    hub = H.MetricsHub(M.DashboardModel(size=2), key=KEY, max_hz=0.1)
    shown = []

    class Rows:
        def update(self, model, now):
            shown.append({r.rank: r.samples for r in model.rows(now)})

    def publisher(rank):
        return P.Publisher(hub.address, rank=rank, key=KEY, interval_s=0.05,
                           command_address=hub.command_address,
                           handlers={"ready": lambda: "ready", "snapshot": lambda: ""}).start()

    hub.add_sink(Rows())
    hub.start()
    pubs = [publisher(r) for r in range(2)]
    try:
        assert hub.wait_for_ranks([0, 1], 10), "publishers never reached the hub"
        for p in pubs:
            p.interval_s = 1.0
        _until_every_rank_answers(hub, [0, 1])  # each answered, then waits 1 s from there
        samples[0] = 64
        assert hub.sync_view(5.0) is True
        assert shown[-1] == {0: 64, 1: 64} and hub.view_syncs == 1, (shown, hub.view_syncs)

        pubs[1].stop()
        samples[0] = 96
        assert hub.sync_view(0.5) is False
        _until(lambda: shown[-1][0] == 96)  # the render after the timeout
        assert shown[-1] == {0: 96, 1: 64} and hub.view_syncs == 2, (shown, hub.view_syncs)
        assert hub.sync_skipped == {pubs[1].pub_id}
        samples[0] = 128
        t0 = time.monotonic()
        assert hub.sync_view(5.0) is True  # rank 1 not waited for
        assert time.monotonic() - t0 < 4.0
        assert shown[-1] == {0: 128, 1: 64} and hub.view_syncs == 3, (shown, hub.view_syncs)

        pubs[1] = publisher(1)  # a restarted engine's: waited for (the old one stays skipped)
        _until_every_rank_answers(hub, [0, 1])
        pubs[1].interval_s = 1.0
        samples[0] = 160
        assert hub.sync_view(5.0) is True
        assert shown[-1] == {0: 160, 1: 160}, shown[-1]
    finally:
        for p in pubs:
            p.stop()
        hub.stop()
    t0 = time.monotonic()
    assert hub.sync_view(5.0) is False  # a stopped hub: at once, not after the timeout
    assert time.monotonic() - t0 < 2.0
