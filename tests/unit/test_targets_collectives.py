"""benchmarks/targets_collectives.py: issue #20's verdicts from a run's figures (no launches)."""

import os
import sys
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import targets_collectives
from benchlib import MIB


def _ctx(figures, nps=(2,)):
    return SimpleNamespace(figures={k: {"time": v} for k, v in figures.items()}, nps=list(nps))


def _rows(ctx):
    t = targets_collectives.table(ctx)
    return {} if t is None else {(r[0], r[1], r[2]): r for r in t.rows}


def test_large_size_needs_both_peers_beaten_by_half_again():
    c = "collectives"
    rows = _rows(_ctx({(c, "ours", "alltoall", 2, 16 * MIB): 1.0,
                       (c, "mpi", "alltoall", 2, 16 * MIB): 1.6,
                       (c, "gloo", "alltoall", 2, 16 * MIB): 9.0,
                       (c, "ours", "allgather", 2, 16 * MIB): 1.0,
                       (c, "mpi", "allgather", 2, 16 * MIB): 1.4,
                       (c, "gloo", "allgather", 2, 16 * MIB): 9.0}))
    assert rows[("alltoall", "2", "16 MiB")][-1] == "PASS"
    assert rows[("allgather", "2", "16 MiB")][-1] == "MISS"  # 1.4x MPICH


def test_small_size_is_within_three_times_mpich_and_gloo_is_not_asked():
    c = "collectives"
    rows = _rows(_ctx({(c, "ours", "reducescatter", 2, 4): 8.9e-6,
                       (c, "mpi", "reducescatter", 2, 4): 3e-6,
                       (c, "ours", "alltoall", 2, 4096): 10e-6,
                       (c, "mpi", "alltoall", 2, 4096): 3e-6}))
    assert rows[("reducescatter", "2", "4 B")][-1] == "PASS"  # just within 3x
    assert rows[("alltoall", "2", "4 KiB")][-1] == "MISS"
    assert rows[("alltoall", "2", "4 KiB")][7] == "-"


def test_broadcast_takes_ours_at_the_better_variant_and_names_it():
    c = "collectives"
    rows = _rows(_ctx({(c, "ours", "broadcast", 2, 64 * MIB): 6.0,
                       (c, "ours", "broadcast_", 2, 64 * MIB): 2.0,
                       (c, "mpi", "broadcast", 2, 64 * MIB): 3.0,
                       (c, "gloo", "broadcast", 2, 64 * MIB): 12.0}))
    row = rows[("broadcast", "2", "64 MiB")]
    assert "(broadcast_)" in row[3] and row[6] == "1.50x" and row[-1] == "PASS"


def test_missing_peer_is_not_measured_not_a_pass():
    rows = _rows(_ctx({("collectives", "ours", "allgather", 2, MIB): 1.0}))
    assert rows[("allgather", "2", "1 MiB")][-1] == "not measured"


def test_embedding_step_against_the_better_horovod():
    rows = _rows(_ctx({("embedding", "ours-torch", 2): 5.0, ("embedding", "horovod-mpi", 2): 6.0,
                       ("embedding", "horovod-gloo", 2): 4.0}))
    row = rows[("embedding step", "2", "sparse embedding")]
    assert "horovod-gloo" in row[4] and row[-1] == "MISS"
    assert targets_collectives.table(_ctx({})) is None


def test_repeated_runs_take_each_figures_median_and_list_every_runs_ratio():
    import launcher

    c = "collectives"
    key_ours, key_mpi = (c, "ours", "alltoall", 2, MIB), (c, "mpi", "alltoall", 2, MIB)
    runs = [{key_ours: {"time": t, "run": i}, key_mpi: {"time": 3.0, "run": i}}
            for i, t in enumerate([1.0, 3.0, 2.0])]
    merged = launcher.median_figures(runs)
    assert merged[key_ours] == {"time": 2.0, "run": 2}  # one run's figure, not a blend
    ctx = SimpleNamespace(figures=merged, nps=[2], runs=runs)
    t = targets_collectives.table(ctx)
    row = {(r[0], r[1], r[2]): r for r in t.rows}[("alltoall", "2", "1 MiB")]
    assert row[6] == "1.50x" and row[8] == "3.00 / 1.00 / 1.50"
    assert any("median of 3 runs" in note for note in t.notes)
    # an even count takes the lower middle
    assert launcher.median_figures(runs[:2])[key_ours]["time"] == 1.0
