"""Collapsing and prefixing of per-rank output (hvd_magic.output), without a cluster."""

import pytest

from hvd_magic.output import RankOutput, render_text
from hvd_magic.ranks import rank_label

pytestmark = pytest.mark.timeout(30)


def shown(out, now, final=False):
    text = render_text(out.drain(now, final=final), out.ranks, rank_label)
    return text.get("stdout", ""), text.get("stderr", "")


def test_identical_lines_collapse_once_all_ranks_printed():
    out = RankOutput([0, 1, 2], window=10)
    out.feed_text(0, "stdout", "epoch 1\n", 0.0)
    out.feed_text(1, "stdout", "epoch 1\n", 0.0)
    assert shown(out, 0.1) == ("", "")  # rank 2 may still print it
    out.feed_text(2, "stdout", "epoch 1\n", 0.2)
    assert shown(out, 0.2) == ("[all ranks] epoch 1\n", "")


def test_lines_that_differ_show_per_rank_without_waiting():
    out = RankOutput([0, 1], window=10)
    out.feed_text(0, "stdout", "loss 0.30\n", 0.0)
    out.feed_text(1, "stdout", "loss 0.31\n", 0.0)
    assert shown(out, 0.0)[0] == "[rank 0] loss 0.30\n[rank 1] loss 0.31\n"


def test_rank_only_line_waits_for_window_then_shows_alone():
    out = RankOutput([0, 1], window=0.5)
    out.feed_text(0, "stdout", "only rank 0\n", 0.0)
    assert shown(out, 0.4)[0] == ""
    assert shown(out, 0.5)[0] == "[rank 0] only rank 0\n"


def test_extra_line_on_one_rank_does_not_break_collapsing():
    out = RankOutput([0, 1], window=10)
    out.feed_text(0, "stdout", "rank 0 says hi\ndone\n", 0.0)
    out.feed_text(1, "stdout", "done\n", 0.0)
    assert shown(out, 0.0)[0] == "[rank 0] rank 0 says hi\n[all ranks] done\n"


def test_subset_of_ranks_with_same_line_is_grouped():
    out = RankOutput([0, 1, 2, 3], window=10)
    for r in range(3):
        out.feed_text(r, "stdout", "x\n", 0.0)
    out.feed_text(3, "stdout", "y\n", 0.0)
    assert shown(out, 0.0)[0] == "[ranks 0-2] x\n[rank 3] y\n"


def test_partial_lines_and_carriage_returns():
    out = RankOutput([0, 1], window=10)
    for r in (0, 1):
        out.feed_text(r, "stdout", "progress 10%", 0.0)
        out.feed_text(r, "stdout", "\rprogress 100%", 0.1)
    assert shown(out, 0.2)[0] == ""  # no newline yet
    for r in (0, 1):
        out.finish(r, 0.3)
    assert shown(out, 0.3)[0] == "[all ranks] progress 100%\n"


def test_finished_rank_releases_the_others_lines():
    out = RankOutput([0, 1], window=10)
    out.feed_text(0, "stdout", "tail\n", 0.0)
    out.finish(1, 0.0)
    assert shown(out, 0.0)[0] == "[rank 0] tail\n"


def test_streams_are_separate_and_order_per_rank_kept():
    out = RankOutput([0, 1], window=10)
    for r in (0, 1):
        out.feed_text(r, "stderr", "warning: w\n", 0.0)
        out.feed_text(r, "stdout", f"a{r}\nb\n", 0.0)
    stdout, stderr = shown(out, 0.0, final=True)
    assert stderr == "[all ranks] warning: w\n"
    assert stdout == "[rank 0] a0\n[rank 1] a1\n[all ranks] b\n"


def test_final_drain_breaks_cyclic_waits():
    out = RankOutput([0, 1], window=10)
    out.feed_text(0, "stdout", "A\nB\n", 0.0)
    out.feed_text(1, "stdout", "B\nA\n", 0.1)
    assert shown(out, 0.2)[0] == ""
    assert shown(out, 0.2, final=True)[0] == "[rank 0] A\n[all ranks] B\n[rank 1] A\n"
    assert out.pending_lines() == 0


def test_identical_displays_collapse():
    out = RankOutput([0, 1], window=10)
    for r in (0, 1):
        out.feed_display(r, {"data": {"text/plain": "<Figure>"}, "metadata": {}}, 0.0)
    emissions = out.drain(0.0)
    assert len(emissions) == 1 and emissions[0].ranks == (0, 1)
    assert emissions[0].item.display["data"]["text/plain"] == "<Figure>"
