"""The dashboard's engine side (hvd_magic.engine_dashboard): the timeline strip's event cursor
over the core's recent-events ring, and clear errors where a rank's core is not running."""

import time

import pytest

from hvd_magic import engine_dashboard as ED


def test_recent_events_returns_each_finished_op_once_with_its_age():
    now_us = time.time() * 1e6
    ring = [(now_us - 3e6, "grad", "op", "ALLREDUCE", 1e5, ""),
            (now_us - 3e6, "grad", "negotiate", "NEGOTIATE_ALLREDUCE", 5e4, ""),
            (now_us - 2e6, "w", "op", "BROADCAST", 2e5, "")]
    asked = []

    def timeline_events(since_us):
        asked.append(since_us)
        return [e for e in ring if e[0] >= since_us]

    events = ED.RecentEvents(timeline_events)
    first = events()
    assert [(op, name) for op, name, _, _ in first] == [("ALLREDUCE", "grad"), ("BROADCAST", "w")]
    assert first[0][2] == pytest.approx(3.0, abs=0.5) and first[0][3] == pytest.approx(0.1)
    assert events() == []  # nothing new: nothing twice
    ring.append((now_us - 1e6, "grad", "op", "ALLREDUCE", 3e5, ""))
    assert [name for _, name, _, _ in events()] == ["grad"]
    cursor = now_us - 2e6 + 2e5  # end of the newest op of the first call
    assert asked[0] == 0  # the first call reads the whole ring
    assert asked[1:] == [pytest.approx(cursor - ED.EVENT_SLACK_US, abs=1)] * 2


def test_a_rank_without_a_running_core_says_so(monkeypatch):
    monkeypatch.setattr(ED.engine_side, "_basics", lambda: None)
    with pytest.raises(RuntimeError, match="the core is not running on rank"):
        ED.timeline(False)
    with pytest.raises(RuntimeError, match="see %hvd_status"):
        ED.autotune(True)


def test_timeline_start_needs_a_path():
    with pytest.raises(ValueError, match="a file path is needed"):
        ED.timeline(True, path=None)
