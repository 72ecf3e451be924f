"""benchmarks/bench_copy_floor.py: each op's copy floor and the verdicts (no launches)."""

import os
import sys
from types import SimpleNamespace

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import bench_copy_floor as floor
from benchlib import MIB

S = 64 * MIB


@pytest.mark.parametrize("op, n, read, written", [
    ("allgather", 4, 4 * S, 4 * S),          # the whole n*S output, own block included
    ("broadcast_", 4, S, S),                 # a non-root's copy of the root's buffer
    ("broadcast", 2, S, S),
    ("alltoall", 4, S, S),                   # S/n from each rank, own block included
    ("reducescatter", 4, S, S / 4),          # slice i of each input, S/n out
    ("allreduce", 2, 1.5 * S, S),            # reduce-scatter then allgather: (2n-1) S/n read
    ("allreduce", 4, 1.75 * S, S),
])
def test_traffic_per_op(op, n, read, written):
    assert floor.traffic(op, S, n) == (read, written)


def test_floor_is_copy_equivalent_bytes_at_the_copy_rate():
    # One copy of B bytes reads B and writes B: the floor of a broadcast is one copy of S.
    assert floor.floor_seconds("broadcast_", S, 2, 10.0) == pytest.approx(S / 10e9)
    assert floor.floor_bytes("allreduce", S, 2) == 1.25 * S     # (3n-1) S / 2n
    assert floor.floor_bytes("allreduce", S, 4) == 1.375 * S
    assert floor.floor_bytes("reducescatter", S, 2) == 0.75 * S  # (n+1) S / 2n


def test_unknown_op_and_single_rank_are_refused():
    with pytest.raises(ValueError, match="no floor"):
        floor.traffic("gather", S, 2)
    with pytest.raises(ValueError, match="2 or more"):
        floor.traffic("allgather", S, 1)


def _rows(figures, rate=10.0, rate_np=None):
    ctx = SimpleNamespace(figures={("memcpy", "copy"): rate,
                                   **({("memcpy", "copy", 2): rate_np} if rate_np else {}),
                                   **{k: {"time": v} for k, v in figures.items()}},
                          nps=[2], smoke=False)
    t = floor.table(ctx)
    return {} if t is None else {(r[0], r[2]): r for r in t.rows}


def test_verdicts_against_the_peers_and_the_floor():
    c, f = "collectives", S / 10e9  # broadcast's floor at 10 GB/s
    rows = _rows({(c, "ours", "broadcast_", 2, S): 1.2 * f,
                  (c, "mpi", "broadcast", 2, S): 1.3 * f,
                  (c, "gloo", "broadcast", 2, S): 5 * f,
                  (c, "ours", "alltoall", 2, S): 1.3 * f,
                  (c, "mpi", "alltoall", 2, S): 1.2 * f,
                  (c, "gloo", "alltoall", 2, S): 5 * f,
                  ("allreduce", "ours", "in-place", 2, S): f,
                  ("allreduce", "mpi", "in-place", 2, S): 2 * f})
    bcast = rows[("broadcast_ (in place)", "64 MiB")]
    assert bcast[-2:] == ["PASS", "PASS"] and bcast[7] == "1.20x"
    assert rows[("alltoall", "64 MiB")][-2:] == ["MISS", "MISS"]  # slower than MPICH, 1.3x
    assert rows[("allreduce in place", "64 MiB")][-2] == "not measured"  # no gloo figure
    assert ("allgather", "64 MiB") not in rows                           # ours not measured
    assert bcast[8] == "-"  # no R_np measured


def test_floor_at_the_concurrent_copy_rate_is_printed_beside_the_verdict():
    f = S / 10e9
    rows = _rows({("collectives", "ours", "alltoall", 2, S): 2 * f}, rate_np=5.0)
    row = rows[("alltoall", "64 MiB")]
    assert row[7] == "2.00x" and row[8] == "1.00x"  # half the rate: twice the floor
    assert row[-1] == "MISS"                         # the verdict stays on R


def test_concurrent_copy_rates_runs_every_process():
    rates = floor.concurrent_copy_rates(2, 1 << 20, 2)
    assert len(rates) == 4 and all(r > 0 for r in rates)


def test_no_table_without_a_copy_rate():
    ctx = SimpleNamespace(figures={("collectives", "ours", "alltoall", 2, S): {"time": 1.0}},
                          nps=[2], smoke=False)
    assert floor.table(ctx) is None
