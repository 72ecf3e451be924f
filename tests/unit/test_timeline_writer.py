"""The timeline writer through ``engine_native._hooks.TimelineWriterForTest``: a real Timeline
(recorder, SPSC ring, writer thread) fed synthetic events. Checks Horovod's Chrome-trace layout,
that the file parses while open and after stop, start/stop/start, errors, drops and the
dashboard's recent-events strip."""
import json
import threading
import time

import pytest

from native.build_testhooks import load

_hooks = load()  # the test-only extension (tests/native): built here if needed

OPS = ["ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER"]


def load(path):
    with open(path) as fh:
        return json.load(fh)


def poll(path, predicate, timeout=2.0):
    """Parse the file until predicate(events) holds; the last parse is returned either way."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            events = load(path)
        except json.JSONDecodeError:  # a read racing a flush; the next read sees it whole
            events = None
        if events is not None and predicate(events):
            return events
        if time.monotonic() > deadline:
            return events
        time.sleep(0.005)


def pids_by_name(events):
    return {e["args"]["name"]: e["pid"] for e in events
            if e.get("ph") == "M" and e["name"] == "process_name" and e["pid"] != 0}


def of(events, pid):
    return [e for e in events if e.get("pid") == pid and e["ph"] != "M"]


def check_nesting(events):
    """Every pid's B/E events pair up like brackets; returns {pid: [names opened]}."""
    stacks, opened = {}, {}
    for e in events:
        if e["ph"] == "B":
            stacks.setdefault(e["pid"], []).append(e["name"])
            opened.setdefault(e["pid"], []).append(e["name"])
        elif e["ph"] == "E":
            assert stacks.get(e["pid"]), f"E without B for pid {e['pid']}"
            stacks[e["pid"]].pop()
    assert all(not s for s in stacks.values()), f"unclosed spans: {stacks}"
    return opened


def record_op(tl, name, op="ALLREDUCE", ranks=(0, 1), activities=("MEMCPY_IN_FUSION_BUFFER",
                                                                  "SHM_ALLREDUCE"), error=None,
              dtype="float32", shape=(3, 4)):
    tl.negotiate_start(name, op)
    for r in ranks:
        tl.negotiate_rank_ready(name, r)
    tl.negotiate_end(name)
    tl.op_start(name, op, dtype, list(shape))
    for a in activities:
        tl.activity_start(name, a)
        tl.activity_end(name)
    tl.op_end(name, error)


@pytest.fixture
def tl():
    t = _hooks.TimelineWriterForTest(flush_interval_ms=20)
    yield t
    t.stop()


def test_header_is_valid_json_before_any_event(tl, tmp_path):
    path = tmp_path / "t.json"
    tl.start(str(path))
    events = load(path)  # start() returns once the header is on disk
    head = [e for e in events if e["pid"] == 0 and e["ph"] == "M"]
    names = {e["name"] for e in head}
    assert names == {"process_name", "process_sort_index"}
    start = next(e for e in head if e["name"] == "process_name")
    assert start["args"]["start_time_since_epoch_in_micros"] > 1_500_000_000 * 10**6
    tl.stop()
    assert load(path) == events


def test_readable_while_open_soon_after_an_event(tl, tmp_path):
    path = tmp_path / "t.json"
    tl.start(str(path))
    record_op(tl, "allreduce.test_allreduce")
    # Horovod's own test reads once, ~0.1 s after the op; the writer flushes every 20 ms, so
    # the event must show within a second (waited for, not slept for).
    def op_started(ev):  # the name's metadata and its ALLREDUCE begin may land in two flushes
        pid = pids_by_name(ev).get("allreduce.test_allreduce")
        return pid is not None and any(e["ph"] == "B" and e["name"] == "ALLREDUCE"
                                       for e in of(ev, pid))

    events = poll(path, op_started, timeout=1.0)
    assert events is not None, "the open file did not parse"
    pid = pids_by_name(events)["allreduce.test_allreduce"]
    mine = of(events, pid)
    assert [e["ph"] for e in mine][:2] == ["B", "X"]
    assert mine[0]["name"] == "NEGOTIATE_ALLREDUCE"
    assert any(e["ph"] == "B" and e["name"] == "ALLREDUCE" for e in mine)
    assert "tid" not in mine[0] and isinstance(mine[0]["ts"], int)
    sort = [e for e in events if e["ph"] == "M" and e["name"] == "process_sort_index"
            and e["pid"] == pid]
    assert sort[0]["args"]["sort_index"] == pid


def test_tensor_is_a_process_with_negotiate_and_op_spans(tl, tmp_path):
    path = tmp_path / "t.json"
    tl.start(str(path))
    record_op(tl, "grad.fc1", ranks=(2, 0, 1))
    tl.stop()
    events = load(path)
    pid = pids_by_name(events)["grad.fc1"]
    mine = of(events, pid)
    assert check_nesting(mine)[pid] == ["NEGOTIATE_ALLREDUCE", "ALLREDUCE",
                                        "MEMCPY_IN_FUSION_BUFFER", "SHM_ALLREDUCE"]
    ticks = [e for e in mine if e["ph"] == "X"]
    assert [t["name"] for t in ticks] == ["2", "0", "1"]
    assert [t["args"]["rank"] for t in ticks] == [2, 0, 1]
    assert all(t["dur"] == 0 for t in ticks)
    op_end = mine[-1]
    assert op_end["ph"] == "E" and op_end["args"] == {"dtype": "float32", "shape": "[3, 4]"}
    ts = [e["ts"] for e in mine]
    assert ts == sorted(ts)


@pytest.mark.parametrize("op", OPS)
def test_names_per_collective_type(tl, tmp_path, op):
    path = tmp_path / "t.json"
    tl.start(str(path))
    record_op(tl, f"{op.lower()}.x", op=op, activities=(f"TCP_{op}",), dtype="int64",
              shape=(5,))
    tl.stop()
    events = load(path)
    mine = of(events, pids_by_name(events)[f"{op.lower()}.x"])
    names = [e["name"] for e in mine if e["ph"] == "B"]
    assert names == [f"NEGOTIATE_{op}", op, f"TCP_{op}"]
    assert mine[-1]["args"] == {"dtype": "int64", "shape": "[5]"}


def test_fused_batch_gives_each_tensor_its_spans(tl, tmp_path):
    path = tmp_path / "t.json"
    names = [f"allreduce.layer{i}.weight" for i in range(4)]
    tl.start(str(path))
    for n in names:
        tl.negotiate_start(n, "ALLREDUCE")
    for n in names:
        tl.negotiate_end(n)
    for n in names:  # one fused response: every tensor shares the same activities
        tl.op_start(n, "ALLREDUCE", "float16", [128])
    for act in ["MEMCPY_IN_FUSION_BUFFER", "NCCL_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"]:
        for n in names:
            tl.activity_start(n, act)
        for n in names:
            tl.activity_end(n)
    for n in names:
        tl.op_end(n)
    tl.stop()
    events = load(path)
    pids = pids_by_name(events)
    assert sorted(pids) == sorted(names) and sorted(pids.values()) == [1, 2, 3, 4]
    opened = check_nesting([e for e in events if e["ph"] in "BE"])
    for n in names:
        assert opened[pids[n]] == ["NEGOTIATE_ALLREDUCE", "ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER",
                                   "NCCL_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"]


def test_response_group_gives_every_member_the_same_spans(tl, tmp_path):
    """The executor's form of a fused batch (one record per activity, not one per tensor)
    writes what the per-tensor calls write, and the strip gets one span for the batch."""
    path = tmp_path / "t.json"
    names = [f"allreduce.layer{i}.bias" for i in range(4)]
    tl.set_live_capture(True)
    tl.start(str(path))
    for n in names:
        tl.negotiate_start(n, "ALLREDUCE")
        tl.negotiate_rank_ready(n, 0)
        tl.negotiate_end(n)
    tl.begin_group("ALLREDUCE")
    for i, n in enumerate(names):
        tl.op_start(n, "ALLREDUCE", "float32", [i + 1])
    for act in ["MEMCPY_IN_FUSION_BUFFER", "SHM_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"]:
        tl.activity_start_group(act)
        tl.activity_end_group()
    tl.end_group()
    tl.begin_group("ALLREDUCE")  # a lone tensor is a group of one
    tl.op_start("allreduce.lone", "ALLREDUCE", "float32", [2, 2])
    tl.activity_start_group("SHM_ALLREDUCE")
    tl.activity_end_group()
    tl.end_group("peer lost")
    tl.stop()
    events = load(path)
    pids = pids_by_name(events)
    opened = check_nesting([e for e in events if e["ph"] in "BE"])
    for i, n in enumerate(names):
        assert opened[pids[n]] == ["NEGOTIATE_ALLREDUCE", "ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER",
                                   "SHM_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"]
        assert of(events, pids[n])[-1]["args"] == {"dtype": "float32", "shape": f"[{i + 1}]"}
    lone = of(events, pids["allreduce.lone"])
    assert [e["ph"] for e in lone] == ["B", "B", "E", "E"]
    assert lone[-1]["args"] == {"dtype": "float32", "shape": "[2, 2]", "error": "peer lost"}
    strip = []
    deadline = time.monotonic() + 2.0
    while len(strip) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
        strip = tl.recent_events()
    assert [(e[1], e[2], e[3], e[5]) for e in strip] == [
        ("allreduce.layer0.bias (+3 fused)", "op", "ALLREDUCE", ""),
        ("allreduce.lone", "op", "ALLREDUCE", "peer lost")]


def test_error_events(tl, tmp_path):
    path = tmp_path / "t.json"
    tl.start(str(path))
    record_op(tl, "allreduce.bad", activities=("QUEUE",), error='peer 3 lost: "tcp"\ntimeout')
    tl.negotiate_start("broadcast.mismatch", "BROADCAST")
    tl.op_end("broadcast.mismatch", "ranks 0 and 1 disagree on root")
    tl.stop()
    events = load(path)
    pids = pids_by_name(events)
    bad = of(events, pids["allreduce.bad"])
    check_nesting(bad)
    assert bad[-1]["args"]["error"] == 'peer 3 lost: "tcp"\ntimeout'
    mismatch = of(events, pids["broadcast.mismatch"])
    check_nesting(mismatch)
    tick = mismatch[-1]
    assert (tick["ph"], tick["name"]) == ("X", "ERROR")
    assert tick["args"]["error"] == "ranks 0 and 1 disagree on root"


def test_out_of_order_calls_keep_the_trace_well_formed(tl, tmp_path):
    path = tmp_path / "t.json"
    tl.start(str(path))
    tl.activity_start("t", "QUEUE")     # no op open: ignored
    tl.negotiate_end("t")               # nothing open: ignored
    tl.op_start("t", "ALLREDUCE", "float32", [1])
    tl.activity_start("t", "MEMCPY_IN_FUSION_BUFFER")
    tl.op_end("t")                      # closes the open activity first
    tl.op_end("t")                      # already ended: ignored
    tl.stop()
    events = load(path)
    mine = of(events, pids_by_name(events)["t"])
    check_nesting(mine)
    assert [e["ph"] for e in mine] == ["B", "B", "E", "E"]


def test_start_stop_start(tl, tmp_path):
    paths = [tmp_path / f"t{i}.json" for i in range(3)]
    for i, path in enumerate(paths):
        tl.start(str(path))
        record_op(tl, f"session{i}")
        tl.stop()
        record_op(tl, f"between{i}")  # nobody listening: recorded nowhere
    for i, path in enumerate(paths):
        events = load(path)
        assert list(pids_by_name(events)) == [f"session{i}"]
        check_nesting(events)
    assert tl.stats()["file_open"] is False


def test_start_while_running_switches_files(tl, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    tl.start(str(a))
    record_op(tl, "first")
    tl.start(str(b))
    record_op(tl, "second")
    tl.stop()
    assert list(pids_by_name(load(a))) == ["first"]
    assert list(pids_by_name(load(b))) == ["second"]


def test_cycle_markers_only_when_asked(tl, tmp_path):
    marked, plain = tmp_path / "m.json", tmp_path / "p.json"
    tl.start(str(marked), mark_cycles=True)
    for _ in range(3):
        tl.mark_cycle()
        record_op(tl, "x")
    tl.stop()
    tl.start(str(plain))
    tl.mark_cycle()
    tl.stop()
    cycles = [e for e in load(marked) if e.get("name") == "CYCLE_START"]
    assert len(cycles) == 3 and all(c["ph"] == "i" and c["s"] == "g" for c in cycles)
    assert not [e for e in load(plain) if e.get("name") == "CYCLE_START"]


def test_names_are_escaped(tl, tmp_path):
    path = tmp_path / "t.json"
    odd = 'grad."quoted"\\back\tslash.ünï'
    long = "n" * 5000
    tl.start(str(path))
    record_op(tl, odd)
    record_op(tl, long)
    tl.stop()
    names = pids_by_name(load(path))
    assert odd in names
    assert long[:4096] in names  # names are capped at 4 KiB


def test_full_ring_drops_and_counts_without_blocking(tmp_path):
    t = _hooks.TimelineWriterForTest(ring_slots=64, flush_interval_ms=1000)
    path = tmp_path / "t.json"
    t.start(str(path))
    for i in range(2000):
        t.negotiate_rank_ready("allreduce.x", i)
    stats = t.stats()
    t.stop()
    assert stats["dropped"] > 0
    assert stats["recorded"] + stats["dropped"] == 2000
    events = load(path)
    ticks = [e for e in events if e["ph"] == "X"]
    assert len(ticks) == stats["recorded"]


def test_bad_path_raises_value_error(tl, tmp_path):
    with pytest.raises(ValueError, match="cannot open"):
        tl.start(str(tmp_path / "missing-dir" / "t.json"))
    assert tl.stats()["file_open"] is False


def test_recent_events_strip(tmp_path):
    t = _hooks.TimelineWriterForTest(live_window_seconds=10.0, live_max_events=1000)
    t.set_live_capture(True)
    before = int(time.time() * 1e6) - 1_000_000
    record_op(t, "allreduce.a", ranks=(0,), activities=("SHM_ALLREDUCE",))
    t.negotiate_start("allreduce.b", "ALLREDUCE")
    t.op_end("allreduce.b", "boom")
    events = []
    deadline = time.monotonic() + 2.0
    while len(events) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
        events = t.recent_events()
    phases = [(name, phase, op) for _, name, phase, op, _, _ in events]
    # Finished collectives only: negotiation and activity detail is the file's.
    assert phases == [("allreduce.a", "op", "ALLREDUCE"), ("allreduce.b", "op", "ERROR")]
    assert all(ts >= before and dur >= 0 for ts, _, _, _, dur, _ in events)
    assert [e[0] for e in events] == sorted(e[0] for e in events)
    assert [e[5] for e in events if e[3] == "ERROR"] == ["boom"]
    assert t.recent_events(events[-1][0] + 1) == []
    t.set_live_capture(False)
    assert t.recent_events() == []


def test_recent_events_are_capped():
    t = _hooks.TimelineWriterForTest(live_max_events=5)
    t.set_live_capture(True)
    for i in range(50):
        record_op(t, f"t{i}", activities=())
    sizes = [len(t.recent_events())]
    deadline = time.monotonic() + 2.0
    while sizes[-1] < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
        sizes.append(len(t.recent_events()))
    assert sizes[-1] == 5 and max(sizes) <= 5
    t.set_live_capture(False)


def test_readers_on_other_threads_while_recording(tmp_path):
    t = _hooks.TimelineWriterForTest(flush_interval_ms=5)
    t.set_live_capture(True)
    path = tmp_path / "t.json"
    t.start(str(path))
    stop = threading.Event()
    seen = []

    def read():
        while not stop.is_set():
            seen.append(len(t.recent_events()))
            t.stats()

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(300):
        record_op(t, f"allreduce.{i % 7}")
    stop.set()
    reader.join()
    t.stop()
    events = load(path)
    check_nesting(events)
    assert len(pids_by_name(events)) == 7
    assert seen
