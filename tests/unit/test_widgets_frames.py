"""Dashboard frames are bound to their direction, publisher and order (Note [Dashboard frames]
in widgets/frames.py), as someone on the path between engines and the driver would try them:
a command recorded before ``%hvd_restart`` replayed to the new engine's publisher, a snapshot
reflected back as a command (and a command as a snapshot), a replayed or reordered snapshot,
a frame whose sequence number or addressee was altered. Each is refused, changes nothing the
dashboard shows or runs, and is logged."""

import logging
import threading
import time

import pytest
import zmq

from hvd_magic.widgets import control as C
from hvd_magic.widgets import frames as F
from hvd_magic.widgets import hub as H
from hvd_magic.widgets import model as M
from hvd_magic.widgets import publisher as P
from hvd_magic.widgets import snapshot as S

pytestmark = pytest.mark.timeout(60)
KEY = b"job-key"
TIMELINE = {"start": True, "path": "/tmp/t.json"}


def snap(rank, seq, pub, t, **fields):
    return {"v": 1, "rank": rank, "t": 1000.0 + t, "seq": seq, "pub": pub, "pid": 100 + rank,
            "host": "node0", "busy": True, "cell": f"step {seq}", **fields}


def until(condition, what, timeout=10.0):
    """Wait for a counter another thread advances (polling a condition; no sleep orders
    anything here)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def resend_until(sender, frame, condition, what):
    """PUB/SUB drops what is sent before the subscription reached the publisher, and nothing
    says when it did: send again until ``condition`` holds. ``sender`` is a socket, or the
    hub (then ``frame`` is a command's name)."""
    deadline = time.monotonic() + 10.0
    while True:
        if isinstance(sender, H.MetricsHub):
            sender.command(frame, timeout_s=0.05)
        else:
            sender.send(frame)
        try:
            return until(condition, what, timeout=0.05)
        except AssertionError:
            assert time.monotonic() < deadline, what


class Handlers:
    def __init__(self):
        self.calls = []

    def timeline(self, **args):
        self.calls.append(args)
        return "recording"


def publisher(handlers, address="tcp://127.0.0.1:9", command_address=None):
    return P.Publisher(address, rank=0, key=KEY, command_address=command_address,
                       handlers={"timeline": handlers.timeline, "ready": lambda: "ready"})


@pytest.fixture
def hub():
    clock = [0.0]
    hub = H.MetricsHub(M.DashboardModel(size=2), key=KEY, refresh_s=60.0,
                       clock=lambda: clock[0])
    hub.start()
    hub.fake_clock = clock
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    push.connect(hub.address)
    hub.push = push  # one connection: the hub reads its frames in the order they were sent
    yield hub
    push.close()
    hub.stop()


def test_a_command_recorded_for_a_publisher_is_refused_by_the_one_after_restart(hub, caplog):
    """What the hub sends is tapped on the wire; after the engine's publisher is replaced
    (same rank, same key: ``%hvd_restart`` keeps the dashboard), the recording is replayed
    to the new one through a socket the attacker controls."""
    handlers = Handlers()
    first = publisher(handlers, hub.address, hub.command_address).start()
    wire = []
    real_pub = hub._pub
    hub._pub = type("Tap", (), {"send": lambda _, f: (wire.append(f), real_pub.send(f))})()
    try:
        until(lambda: hub.received >= 1, "the first publisher never reached the hub")
        resend_until(hub, "ready", lambda: first.commands_run,  # PUB/SUB's readiness
                     "the first publisher never received a command")
        ended = threading.Event()
        cmd_id = hub.command("timeline", on_done=lambda a, m: ended.set(), **TIMELINE)
        assert ended.wait(10) and handlers.calls == [TIMELINE]
        recorded = next(f for f in wire if C.unpack_command(f, KEY).id == cmd_id)
    finally:
        first.stop()
    attacker = zmq.Context.instance().socket(zmq.PUB)
    attacker.setsockopt(zmq.LINGER, 0)
    port = attacker.bind_to_random_port("tcp://127.0.0.1")
    second = publisher(handlers, hub.address, f"tcp://127.0.0.1:{port}").start()
    try:
        with caplog.at_level(logging.INFO, logger="hvd_magic.widgets"):
            resend_until(attacker, recorded, lambda: second.commands_refused + second.commands_run,
                         "the replayed command never reached the new publisher")
            assert second.commands_run == 0 and handlers.calls == [TIMELINE]
        assert "not addressed to this publisher" in caplog.text
        ran = first.commands_run
        first._command(recorded)  # and the publisher it was for does not run it twice
        assert first.commands_run == ran and handlers.calls == [TIMELINE]
    finally:
        second.stop()
        attacker.close()


def test_commands_run_once_in_order_and_only_for_the_publisher_named():
    handlers = Handlers()
    pub = publisher(handlers)
    frames = {i: C.pack_command(i, "timeline", {"start": True, "path": f"/tmp/{i}"}, KEY,
                                to=["someone-else", pub.pub_id]) for i in (4, 5, 6)}
    for i in (5, 5, 4, 6, 6):  # a replay, a reordered one, the next, its replay
        pub._command(frames[i])
    assert [c["path"] for c in handlers.calls] == ["/tmp/5", "/tmp/6"]
    assert pub.commands_refused == 3
    pub._command(C.pack_command(7, "timeline", TIMELINE, KEY, to=["someone-else"]))
    assert len(handlers.calls) == 2 and pub.commands_refused == 4


def test_a_snapshot_reflected_back_as_a_command_is_refused():
    """An engine signs snapshots; the same bytes sent to a publisher as a command must not
    run, even when the body reads as a command (it is the tag's direction that refuses it)."""
    handlers = Handlers()
    pub = publisher(handlers)
    body = {**snap(0, 1, "x", 0.0), "id": 9, "name": "timeline", "args": TIMELINE,
            "to": [pub.pub_id]}
    reflected = S.pack(body, KEY)
    assert S.unpack(reflected, KEY)["rank"] == 0  # a valid snapshot...
    pub._command(reflected)  # ...is no command
    assert handlers.calls == [] and pub.commands_refused == 1
    with pytest.raises(ValueError, match="bad signature"):
        C.unpack_command(reflected, KEY)


def test_a_command_reflected_to_the_hub_as_a_snapshot_is_not_rendered(hub):
    body = {**snap(0, 1, "x", 0.0), "id": 9, "name": "timeline", "args": {}, "to": []}
    hub.push.send(F.pack(body, KEY, F.COMMAND))  # a command's tag on a snapshot's body
    hub.push.send(S.pack(snap(1, 1, "b", 0.0), KEY))  # then an honest one
    until(lambda: hub.received == 1, "the honest snapshot never arrived")
    assert hub.rejected == 1
    assert [r.rank for r in hub.model.rows(0.0) if r.pid] == [1]


def test_a_replayed_or_reordered_snapshot_does_not_keep_a_silent_rank_alive(hub):
    """Rank 0 falls silent; replaying its last snapshots would make it look alive (and an old
    one would move its row backwards). The hub refuses both and shows "no data for 10 s"."""
    first, second = S.pack(snap(0, 1, "a", 0.0), KEY), S.pack(snap(0, 2, "a", 0.3), KEY)
    for frame in (first, second, S.pack(snap(1, 1, "b", 0.0), KEY)):
        hub.push.send(frame)
    until(lambda: hub.received == 3, "the snapshots never arrived")
    hub.fake_clock[0] = 10.0
    hub.push.send(second)  # replayed
    hub.push.send(first)  # replayed and out of order
    hub.push.send(S.pack(snap(1, 2, "b", 10.0), KEY))  # rank 1 is alive: read after those
    until(lambda: hub.received == 4, "rank 1's second snapshot never arrived")
    rank0 = hub.model.rows(10.0)[0]
    assert hub.stale == 2 and rank0.stale_s == pytest.approx(10.0)
    assert rank0.detail == "running cell step 2"


def test_after_a_restart_the_replaced_publishers_snapshots_are_refused(hub):
    hub.push.send(S.pack(snap(0, 7, "old", 0.0, pid=500), KEY))
    recorded = S.pack(snap(0, 8, "old", 0.1, pid=500), KEY)
    hub.push.send(recorded)
    hub.push.send(S.pack(snap(0, 0, "new", 1.0, pid=600), KEY))  # %hvd_restart: a new engine
    until(lambda: hub.received == 3, "the snapshots never arrived")
    hub.push.send(recorded)  # a later seq than any the new publisher sent, from the old one
    hub.push.send(S.pack(snap(0, 1, "new", 1.3, pid=600), KEY))
    until(lambda: hub.received == 4, "the new publisher's second snapshot never arrived")
    assert hub.stale == 1 and hub.model.rows(1.0)[0].pid == 600


def test_a_frame_with_its_sequence_number_or_addressee_altered_is_refused(hub):
    handlers = Handlers()
    pub = publisher(handlers)
    command = C.pack_command(3, "timeline", TIMELINE, KEY, to=["x" * 16])
    pub._command(command.replace(b"x" * 16, pub.pub_id.encode()))  # addressed to us instead
    assert handlers.calls == [] and pub.commands_refused == 1
    second = S.pack(snap(0, 2, "a", 0.3), KEY)
    hub.push.send(S.pack(snap(0, 1, "a", 0.0), KEY))
    hub.push.send(second)
    hub.push.send(second.replace(b'"seq":2', b'"seq":9'))  # a replay made to look newer
    hub.push.send(S.pack(snap(1, 1, "b", 0.0), KEY))
    until(lambda: hub.received == 3, "the snapshots never arrived")
    assert hub.rejected == 1 and hub.stale == 0


def test_refusals_are_logged_once_per_kind_and_interval(caplog):
    clock = [0.0]
    refusals = F.RefusalLog(logging.getLogger("hvd_magic.widgets"), "hub", lambda: clock[0])
    with caplog.at_level(logging.DEBUG, logger="hvd_magic.widgets"):
        for i in range(5):
            refusals.refused("order", f"snapshot {i} replayed")
        clock[0] = F.LOG_EVERY_S
        refusals.refused("order", "snapshot 9 replayed")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["hub: refused a frame: snapshot 0 replayed",
                        "hub: refused a frame: snapshot 9 replayed (4 more refused since the "
                        "last warning)"]
