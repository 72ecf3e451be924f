"""The timeline in the running core: Horovod's Chrome-trace layout written by rank 0, valid JSON
while open and after stop, start/stop/start in one job, mismatches recorded, HOROVOD_TIMELINE at
init, and the in-memory strip (timeline_events, metrics) on every rank.
"""
import json
import os
import time

import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import Failures
from multiproc.harness import run_ranks

OPS = ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER")
ACTIVITY = {"ALLREDUCE": "ALLREDUCE", "ALLGATHER": "ALLGATHER", "BROADCAST": "BCAST",
            "ALLTOALL": "ALLTOALL", "REDUCESCATTER": "REDUCESCATTER", "BARRIER": "BARRIER"}


def _load(path):
    with open(path) as fh:
        return json.load(fh)


def _load_when(path, predicate, timeout=10.0):
    """The file's events once ``predicate(events)`` holds: the writer thread flushes every
    20-80 ms, so a reader polls (every read must parse: the file is always valid JSON)."""
    deadline = time.monotonic() + timeout
    while True:
        events = _load(path)
        if predicate(events) or time.monotonic() > deadline:
            return events
        time.sleep(0.02)


def _live_when(hvd, predicate, timeout=10.0):
    """timeline_events() once ``predicate(events)`` holds (the strip is fed every 20-80 ms)."""
    deadline = time.monotonic() + timeout
    while True:
        events = hvd.timeline_events()
        if predicate(events) or time.monotonic() > deadline:
            return events
        time.sleep(0.02)


def _tracks(events):
    """{tensor name: [events of its pid]} plus the pid-0 events (markers)."""
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name" and e["pid"] > 0}
    tracks = {name: [] for name in names.values()}
    markers = []
    for e in events:
        if e.get("ph") == "M":
            continue
        if e["pid"] in names:
            tracks[names[e["pid"]]].append(e)
        else:
            markers.append(e)
    return tracks, markers


def _spans(track):
    """Span names of one tensor's track (B events), in order; asserts B/E balance."""
    depth, names = 0, []
    for e in track:
        if e["ph"] == "B":
            depth += 1
            names.append(e["name"])
        elif e["ph"] == "E":
            depth -= 1
            assert depth >= 0, f"E without B in {track}"
    assert depth == 0, f"unbalanced spans in {track}"
    return names


def _run_collectives(hvd, tag):
    n, me = hvd.size(), hvd.rank()
    hvd.allreduce(np.ones((3, 4), np.float32), op=hvd.Sum, name=f"{tag}.single")
    hvd.grouped_allreduce([np.full(5 + i, me, np.float64) for i in range(4)], op=hvd.Sum,
                          name=f"{tag}.fused")
    hvd.allgather(np.full((me + 1, 2), me, np.int32), name=f"{tag}.gather")
    hvd.broadcast(np.arange(6, dtype=np.int64), root_rank=n - 1, name=f"{tag}.bcast")
    hvd.alltoall(np.arange(2 * n, dtype=np.float32), name=f"{tag}.a2a")
    hvd.reducescatter(np.ones((2 * n, 3), np.float32), op=hvd.Sum, name=f"{tag}.rs")
    hvd.barrier()


def layout_suite(transport, path):
    """Every collective type and a fused batch land in rank 0's file with Horovod's names."""
    hvd = checks.init(transport)
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    prefix = "TCP" if transport == "tcp" else "SHM"
    hvd.start_timeline(path, mark_cycles=True)
    hvd.barrier()  # rank 0's file is open before any rank submits what the test checks
    _run_collectives(hvd, "tl")
    board_ops = hvd.metrics()["one_round_ops"]
    fails.expect("the small ops took the board, on shm and over tcp (5)", board_ops == 5,
                 f"{board_ops}")
    if me == 0:
        # Valid JSON while the file is open, and the data arrives without stop_timeline().
        events = _load_when(path, lambda ev: any(e.get("name") == "BARRIER" for e in ev))
        fails.expect("open file has the barrier", any(e.get("name") == "BARRIER" for e in events))
        fails.expect("header", events[0]["args"].get("start_time_since_epoch_in_micros", 0) > 0)
        fails.expect("metrics: recording", hvd.metrics()["timeline"] is True)
    live = _live_when(hvd, lambda ev: any(e[2] == "op" and e[3] == "ALLREDUCE" for e in ev))
    hvd.barrier()
    hvd.stop_timeline()
    fails.expect("live strip on every rank",
                 any(e[2] == "op" and e[3] == "ALLREDUCE" for e in live), f"{live[:5]}")
    if me != 0:
        fails.expect("only rank 0 writes", hvd.metrics()["timeline"] is False)
        hvd.shutdown()
        return fails.raise_if_any()
    fails.expect("metrics: stopped", hvd.metrics()["timeline"] is False)
    events = _load(path)
    tracks, markers = _tracks(events)
    fails.expect("CYCLE_START markers", any(e.get("name") == "CYCLE_START" for e in markers))
    by_op = {"ALLREDUCE": "allreduce.tl.single", "ALLGATHER": "allgather.tl.gather",
             "BROADCAST": "broadcast.tl.bcast", "ALLTOALL": "alltoall.tl.a2a",
             "REDUCESCATTER": "reducescatter.tl.rs"}
    barrier = sorted((t for t in tracks if t.startswith("barrier.")),
                     key=lambda t: int(t.split(".")[1]))
    fails.expect("barrier tracks", len(barrier) >= 2, f"{sorted(tracks)}")
    if len(barrier) >= 2:
        by_op["BARRIER"] = barrier[1]  # the one of _run_collectives
    for op, name in by_op.items():
        track = tracks.get(name)
        if not fails.expect(f"{op} track", track is not None, f"{sorted(tracks)}"):
            continue
        spans = _spans(track)
        # A small blocking op of the global set is agreed and run in one round among the ranks
        # (Note [One round]; over TCP by frames, K): its activity is ONE_ROUND; a barrier's not.
        on_board = op != "BARRIER"
        expected = [f"NEGOTIATE_{op}", op, "ONE_ROUND" if on_board else f"{prefix}_{ACTIVITY[op]}"]
        fails.expect(f"{op} spans", spans == expected, f"{spans}")
        ticks = sorted(e["name"] for e in track if e["ph"] == "X")
        fails.expect(f"{op} one tick per rank", ticks == [str(r) for r in range(n)], f"{ticks}")
    single = tracks.get("allreduce.tl.single", [])
    ends = [e for e in single if e["ph"] == "E" and "args" in e]
    fails.expect("dtype/shape on the op's end",
                 ends and ends[-1]["args"] == {"dtype": "float32", "shape": "[3, 4]"}, f"{ends}")
    for i in range(4):
        name = f"grouped_allreduce.tl.fused_{i}of4"
        spans = _spans(tracks.get(name, []))
        fails.expect(f"fused member {i}", spans == [
            "NEGOTIATE_ALLREDUCE", "ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER",
            f"{prefix}_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"], f"{spans}")
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_, transport", [(2, "shm"), (3, "tcp")], ids=["np2-shm", "np3-tcp"])
def test_timeline_layout(np_, transport, tmp_path):
    path = str(tmp_path / "timeline.json")
    run_ranks(layout_suite, np_, args=(transport, path), timeout=120,
              **checks.world_kwargs(np_, transport))


def restart_suite(directory):
    """start/stop/start in one job: each file holds its own session, both stay valid."""
    hvd = checks.init("shm")
    fails = Failures()
    first, second = os.path.join(directory, "a.json"), os.path.join(directory, "b.json")
    # Barriers order each rank-0 start/stop before the other ranks' next submissions.
    hvd.start_timeline(first)
    hvd.barrier()
    hvd.allreduce(np.ones(8), name="one")
    hvd.stop_timeline()
    hvd.stop_timeline()  # a second stop is a no-op
    hvd.barrier()
    hvd.allreduce(np.ones(8), name="between")
    hvd.start_timeline(second)
    hvd.barrier()
    hvd.allreduce(np.ones(8), name="two")
    hvd.stop_timeline()
    if hvd.rank() == 0:
        a, _ = _tracks(_load(first))
        b, _ = _tracks(_load(second))
        fails.expect("first session", "allreduce.one" in a and "allreduce.two" not in a, f"{a}")
        fails.expect("second session", "allreduce.two" in b and "allreduce.one" not in b, f"{b}")
        fails.expect("nothing while stopped",
                     "allreduce.between" not in a and "allreduce.between" not in b)
        fails.expect("complete spans", _spans(b["allreduce.two"])[:2] ==
                     ["NEGOTIATE_ALLREDUCE", "ALLREDUCE"], f"{b['allreduce.two']}")
    hvd.shutdown()
    return fails.raise_if_any()


def test_timeline_start_stop_start(tmp_path):
    run_ranks(restart_suite, 2, args=(str(tmp_path),), timeout=120)


def mismatch_suite(path):
    """A mismatched allreduce fails on every rank and rank 0's timeline records the error."""
    hvd = checks.init("shm")
    fails = Failures()
    hvd.start_timeline(path)
    hvd.barrier()
    try:
        hvd.allreduce(np.ones(3 + hvd.rank(), np.float32), name="bad")
        fails.expect("mismatch raises", False)
    except hvd.HorovodInternalError as exc:
        fails.expect("mismatch message", "Mismatched" in str(exc) or "shape" in str(exc), str(exc))
    hvd.allreduce(np.ones(3, np.float32), name="good")  # the core stays usable
    live = _live_when(hvd, lambda ev: any(e[1] == "allreduce.bad" and e[5] for e in ev))
    fails.expect("live error event", any(e[1] == "allreduce.bad" and e[5] for e in live),
                 f"{[e for e in live if e[1] == 'allreduce.bad']}")
    hvd.barrier()
    hvd.stop_timeline()
    if hvd.rank() == 0:
        tracks, _ = _tracks(_load(path))
        bad = tracks.get("allreduce.bad", [])
        errors = [e for e in bad if e.get("args", {}).get("error")]
        fails.expect("error recorded", errors and "shape" in errors[0]["args"]["error"], f"{bad}")
        fails.expect("negotiation recorded", _spans(bad)[:1] == ["NEGOTIATE_ALLREDUCE"], f"{bad}")
    hvd.shutdown()
    return fails.raise_if_any()


def test_timeline_records_mismatch(tmp_path):
    run_ranks(mismatch_suite, 2, args=(str(tmp_path / "t.json"),), timeout=120)


def env_suite(directory, dynamic):
    """HOROVOD_TIMELINE at init: a path starts rank 0's file at init; DYNAMIC starts nothing."""
    import engine_native as hvd
    fails = Failures()
    try:
        hvd.start_timeline(os.path.join(directory, "early.json"))
        fails.expect("start before init raises", False)
    except ValueError as exc:
        fails.expect("not-initialised message", "hvd.init()" in str(exc), str(exc))
    hvd.init()
    hvd.allreduce(np.ones(4), name="x")
    if dynamic:
        fails.expect("DYNAMIC: no file at init", hvd.metrics()["timeline"] is False)
        hvd.start_timeline(os.path.join(directory, "dynamic.json"))
        hvd.barrier()
        hvd.allreduce(np.ones(4), name="y")
    hvd.barrier()
    hvd.shutdown()  # closes the file; it stays valid
    return fails.raise_if_any()


@pytest.mark.parametrize("dynamic", [False, True], ids=["path", "dynamic"])
def test_timeline_from_environment(tmp_path, dynamic):
    rank_env = {r: {"HOROVOD_TIMELINE": "DYNAMIC" if dynamic else str(tmp_path / f"tl.{r}.json"),
                    "HOROVOD_TIMELINE_MARK_CYCLES": "1"} for r in range(3)}
    run_ranks(env_suite, 3, args=(str(tmp_path), dynamic), timeout=120, rank_env=rank_env)
    files = sorted(os.listdir(tmp_path))
    if dynamic:
        assert files == ["dynamic.json"], files
        tracks, _ = _tracks(_load(tmp_path / "dynamic.json"))
        assert "allreduce.y" in tracks and "allreduce.x" not in tracks, sorted(tracks)
        return
    assert files == ["tl.0.json"], f"only rank 0 writes: {files}"
    events = _load(tmp_path / "tl.0.json")
    tracks, markers = _tracks(events)
    assert _spans(tracks["allreduce.x"])[:2] == ["NEGOTIATE_ALLREDUCE", "ALLREDUCE"]
    assert any(e.get("name") == "CYCLE_START" for e in markers)


def metrics_suite():
    """metrics(): the dashboard's fields (events since the previous call, handle wait)."""
    hvd = checks.init("shm")
    fails = Failures()
    hvd.metrics()  # moves the events cursor past init
    for i in range(3):
        hvd.allreduce(np.ones(1000), name=f"m.{i}")
    events = []
    deadline = time.monotonic() + 10
    while len(events) < 3 and time.monotonic() < deadline:  # the writer drains every 20-80 ms
        events += [e for e in hvd.metrics()["events"] if e["name"].startswith("allreduce.m.")]
        time.sleep(0.02)
    fails.expect("three op events", sorted(e["name"] for e in events) ==
                 [f"allreduce.m.{i}" for i in range(3)], f"{events}")
    fails.expect("event fields", all(e["op"] == "ALLREDUCE" and e["dur_s"] >= 0 and
                                     e["start_ago_s"] >= 0 for e in events), f"{events}")
    m = hvd.metrics()
    fails.expect("no repeats", not [e for e in m["events"] if e["name"].startswith("allreduce.m.")])
    fails.expect("handle wait measured", m["handle_wait_seconds"] > 0, f"{m['handle_wait_seconds']}")
    fails.expect("idle is the loop's wait", m["idle_seconds"] == m["wait_seconds"])
    fails.expect("no autotune panel", m["autotune"] is None, f"{m['autotune']}")
    hvd.shutdown()
    return fails.raise_if_any()


def test_metrics_events_and_waits():
    run_ranks(metrics_suite, 2, timeout=120)


def p2p_suite(path):
    """Point-to-point ops get SEND and RECV spans named like the pending list's entries: in
    rank 0's file (with the sent dtype and shape; a receive's are unknown when it is posted)
    and in every rank's live strip."""
    hvd = checks.init("shm")
    fails = Failures()
    hvd.start_timeline(path)
    me, other = hvd.rank(), 1 - hvd.rank()
    if me == 0:
        hvd.send(np.ones((2, 3), np.float32), 1, tag=5)
        hvd.recv(1, tag=6)
    else:
        hvd.recv(0, tag=5)
        hvd.send(np.arange(4, dtype=np.int64), 0, tag=6)
    names = {f"send to rank {other} (tag {5 + me})", f"recv from rank {other} (tag {6 - me})"}
    live = _live_when(hvd, lambda ev: names <= {e[1] for e in ev})
    fails.expect("live spans", names <= {e[1] for e in live}, f"{live}")
    fails.expect("live ops", {e[3] for e in live if e[1] in names} == {"SEND", "RECV"},
                 f"{[e for e in live if e[1] in names]}")
    hvd.barrier()
    hvd.stop_timeline()
    if me == 0:
        tracks, _ = _tracks(_load(path))
        send, recv = tracks.get("send to rank 1 (tag 5)", []), tracks.get(
            "recv from rank 1 (tag 6)", [])
        fails.expect("send span", _spans(send) == ["SEND"], f"{send}")
        fails.expect("recv span", _spans(recv) == ["RECV"], f"{recv}")
        ends = [e["args"] for e in send + recv if e["ph"] == "E"]
        fails.expect("dtype and shape", ends == [{"dtype": "float32", "shape": "[2, 3]"},
                                                 {"dtype": "unknown", "shape": "[]"}], f"{ends}")
    hvd.shutdown()
    return fails.raise_if_any()


def test_point_to_point_spans(tmp_path):
    run_ranks(p2p_suite, 2, args=(str(tmp_path / "t.json"),), timeout=120)
