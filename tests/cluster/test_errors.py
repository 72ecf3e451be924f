"""Error aggregation and stuck reports as plain data (hvd_magic.errors, hvd_magic.interrupts)."""

import pytest

from hvd_magic.errors import (
    CellInterrupted,
    Failure,
    RankError,
    cell_location,
    group_failures,
    strip_ansi,
)
from hvd_magic.interrupts import stuck_groups, stuck_lines

pytestmark = pytest.mark.timeout(30)

TB = ["\x1b[0;31mValueError\x1b[0m   Traceback (most recent call last)",
      "Cell \x1b[0;32mIn[7], line 3\x1b[0m\n      1 x = 1\n----> 3 hvd.allreduce(x, name='g')\n",
      "\x1b[0;31mValueError\x1b[0m: bad"]


def test_identical_failures_group_by_type_and_message():
    failures = [Failure(2, "ValueError", "bad", TB), Failure(0, "ValueError", "bad", TB),
                Failure(1, "KeyError", "'k'", ["other"])]
    groups = group_failures(failures)
    assert [(ranks, f.ename) for ranks, f in groups] == [([0, 2], "ValueError"), ([1], "KeyError")]


def test_cell_location_from_ipython_traceback():
    assert cell_location(TB) == "Cell In[7], line 3: hvd.allreduce(x, name='g')"
    assert cell_location(["no cell frame"]) == ""


def test_rank_error_renders_each_failure_once_with_its_ranks():
    err = RankError([Failure(r, "ValueError", "bad", TB) for r in (1, 2)], [0, 1, 2])
    text = strip_ansi("\n".join(err._render_traceback_()))
    assert text.count("ValueError: bad") == 1
    assert text.startswith("ValueError on ranks 1,2 (2 of 3):")
    assert str(err) == "ValueError on ranks 1,2"


def test_after_a_death_other_errors_are_one_line():
    failures = [Failure(0, "engine died", "killed by SIGKILL (pid 7 on vm)", kind="died"),
                Failure(1, "HorovodInternalError", "lost connection to rank 0", TB)]
    text = "\n".join(RankError(failures, [0, 1], "hvd: rank 0 died")._render_traceback_())
    assert "rank 0: engine died: killed by SIGKILL (pid 7 on vm)" in text
    assert "rank 1: HorovodInternalError: lost connection to rank 0" in text
    assert "Traceback" not in text


def test_interrupted_ranks_show_where_they_were():
    failures = [Failure(r, "KeyboardInterrupt", "", TB) for r in (0, 2)]
    err = CellInterrupted(failures, [0, 1, 2], "timeout", header="hvd: cell interrupted")
    assert "ranks 0,2: interrupted at Cell In[7], line 3" in "\n".join(err._render_traceback_())


def test_stuck_groups_use_rank0_view_else_infer_missing_ranks():
    pending = {0: [{"name": "allreduce.g", "op": "ALLREDUCE", "age_seconds": 2.5,
                    "missing_ranks": [1]}],
               1: [],
               2: [{"name": "allreduce.g", "op": "ALLREDUCE", "age_seconds": 2.4}]}
    (group,) = stuck_groups(pending, [0, 1, 2])
    assert group["ranks"] == [0, 2] and group["missing"] == [1] and group["label"] == \
        "allreduce 'g'"
    line = stuck_lines([group], [0, 1, 2], {1: "finished the cell"})[0]
    assert line == "  ranks 0,2: stuck in allreduce 'g' for 2.5 s, waiting on rank 1 " \
                   "(finished the cell)"
    del pending[0][0]["missing_ranks"]
    assert stuck_groups(pending, [0, 1, 2])[0]["missing"] == [1]  # inferred: 1 has none


def test_many_gradients_share_one_line():
    pending = {0: [{"name": f"allreduce.layer{i}.weight", "op": "ALLREDUCE", "age_seconds": 1.0,
                    "missing_ranks": [1]} for i in range(5)], 1: []}
    lines = stuck_lines(stuck_groups(pending, [0, 1]), [0, 1], {})
    assert lines == ["  rank 0: stuck in allreduce 'layer0.weight', 'layer1.weight', "
                     "'layer2.weight' and 2 more for 1.0 s, waiting on rank 1"]
