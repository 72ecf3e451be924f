"""Driver-side dashboard helpers (hvd_magic.dashboard): one line from every rank's answer to a
button or magic, and where a timeline is written."""

import os

from hvd_magic.dashboard import summarize, timeline_path


def test_all_ranks_agree_rank_0_speaks():
    assert summarize("timeline", {0: (True, "recording to /t.json"), 1: (True, "recording")},
                     []) == ("timeline: recording to /t.json", False)
    assert summarize("autotune", {0: (True, ""), 1: (True, "")}, []) == \
        ("autotune: done on 2 ranks", False)


def test_failures_are_grouped_by_text_and_silent_ranks_named():
    answers = {0: (False, "NotImplementedError: x"), 1: (False, "NotImplementedError: x"),
               2: (True, "ok"), 3: (False, "ValueError: y")}
    line, error = summarize("timeline", answers, [4, 5])
    assert error and line == ("timeline: ranks 0,1: NotImplementedError: x; rank 3: ValueError: "
                              "y; no answer from ranks 4,5")
    assert summarize("autotune", {}, []) == ("autotune: no rank is running", True)


def test_timeline_path_is_absolute_and_dated_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = timeline_path()
    assert os.path.dirname(path) == str(tmp_path)
    assert os.path.basename(path).startswith("hvd-timeline-") and path.endswith(".json")
    assert timeline_path("rel.json") == str(tmp_path / "rel.json")
