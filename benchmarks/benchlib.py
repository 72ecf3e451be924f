"""Shared helpers for the benchmarks: sizes, statistics, formatting, tables, and what the rank
processes need (agreed iteration counts, result files, the watchdog).

Used on both sides: the launcher (``run_all.py`` and the ``bench_*`` modules' table builders)
and the rank processes (``rank_entry.py``). Imports nothing beyond the standard library so that
the Horovod venv, which has no engine_native, can load it too. Launching lives in launcher.py.
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RANK_ENTRY = os.path.join(HERE, "rank_entry.py")
HOROVOD_VENV = os.environ.get("HVD_BENCH_HOROVOD_VENV", os.path.join(HERE, ".venv-horovod"))

KIB, MIB = 1 << 10, 1 << 20


# ---------------------------------------------------------------------------------------------
# Statistics and formatting

def median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def per_iteration_max(rank_lists) -> list:
    """Per-iteration time of a collective = the slowest rank's time for that iteration."""
    rank_lists = [r for r in rank_lists if r]
    if not rank_lists:
        return []
    return [max(column) for column in zip(*rank_lists)]


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factors: busbw = algbw * factor."""
    if collective == "allreduce":
        return 2.0 * (n - 1) / n
    if collective in ("allgather", "alltoall", "reducescatter"):
        return (n - 1) / n
    return 1.0


def fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def fmt_time(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_bw(gbps: float | None) -> str:
    if gbps is None or math.isnan(gbps):
        return "-"
    return f"{gbps:.2f}" if gbps >= 0.1 else f"{gbps:.3f}"


def fmt_ratio(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "-"
    return f"{x:.2f}x" if x < 100 else f"{x:.0f}x"


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


@dataclass
class Table:
    """A markdown table; ``render()`` gives the text run_all prints and RESULTS.md keeps."""
    title: str
    columns: list
    rows: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def add(self, *cells) -> None:
        self.rows.append([str(c) for c in cells])

    def render(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        if self.notes:
            lines += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Rank side

def iterations(nbytes: int, target_bytes: float, lo: int, hi: int) -> int:
    """Deterministic iteration count (the same on every rank, so no rank waits forever)."""
    return int(max(lo, min(hi, target_bytes // max(nbytes, 1))))


_LATE = -1.0e6


def agreed_iterations(adapter, spec: dict, seconds_per_iter: float, budget_s: float, lo: int,
                      hi: int, name: str) -> int:
    """How many timed iterations fit in ``budget_s`` (clamped to [lo, hi]), agreed by all ranks;
    0 when any rank is past the launch's deadline (``spec["deadline"]``, a time.time() value):
    then every rank stops the case together and the launch keeps what it measured so far.

    Each rank proposes a count from its own warm-up timing (or a large negative number when
    late); one allreduce (sum) of the proposals gives every rank the same result. A
    busy-polling peer on an oversubscribed machine can be 1000x slower than on a quiet one;
    this keeps every size within its budget and every launch within its timeout.
    """
    want = max(lo, min(hi, int(budget_s / max(seconds_per_iter, 1e-9))))
    if time.time() > spec.get("deadline", float("inf")):
        want = _LATE
    buf = adapter.array(4, float(want))
    total = float(adapter.values(adapter.allreduce(buf, name, adapter.allreduce_variants[0]))[0])
    if total < 0:
        return 0
    return max(lo, min(hi, round(total / adapter.size)))


def warmed_iterations(adapter, spec: dict, call, lo: int, hi: int, name: str) -> int:
    """Run ``call()`` spec["warmup"] times, then agreed_iterations from that warm-up's pace
    within spec["budget_s"]."""
    t0 = time.perf_counter()
    for _ in range(spec["warmup"]):
        call()
    per_iter = (time.perf_counter() - t0) / max(1, spec["warmup"])
    return agreed_iterations(adapter, spec, per_iter, spec["budget_s"], lo, hi, name)


def timed_calls(adapter, call, iters: int) -> list:
    """Seconds of each of ``iters`` calls, the ranks starting together (a barrier first)."""
    adapter.barrier()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def save_partial(spec: dict, rank: int, result: dict) -> None:
    """Write what this rank has measured so far (rank_entry overwrites it at the end), so a
    launch that hits its timeout still reports the sizes it finished."""
    write_result(spec, dict(result, rank=rank, partial=True))


def write_result(spec: dict, result: dict) -> None:
    path = os.path.join(spec["out"], f"rank{result['rank']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


def arm_watchdog(seconds: float) -> None:
    """Rank processes die on their own (SIGALRM) if they outlive the launcher's deadline."""
    signal.alarm(max(1, int(seconds)))


def alternate(systems: list, round_index: int) -> list:
    """Launch order for one round: as given, then reversed on the next round (np), so no
    system always runs first or last while the machine's load drifts."""
    return list(systems) if round_index % 2 == 0 else list(systems)[::-1]


def __getattr__(name: str):
    """Launch, launch(), Context, ... moved to launcher.py; other benchmarks (bench_autotune,
    bench_timeline) still reach them as ``benchlib.Launch`` etc., so forward those names."""
    import launcher

    try:
        return getattr(launcher, name)
    except AttributeError:
        raise AttributeError(f"module 'benchlib' has no attribute {name!r}") from None
