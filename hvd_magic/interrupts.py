"""Interrupting a running ``%%hvd`` cell and explaining where every rank was stuck.

Entry points that stop a cell, all ending in :meth:`CellRun.request_interrupt` (thread-safe):

- Ctrl-C / Jupyter's interrupt: :func:`sigint_to` installs a SIGINT handler for the cell's
  duration (main thread only; the previous handler comes back afterwards);
- the dashboard's Stop button or any thread: :func:`interrupt_running_cell`;
- ``--timeout`` and fail-fast decisions, inside the cell loop (hvd_magic.cellrun).

Then the cell loop signals the ranks through their nannies, and :func:`stuck_report` turns
the core's pending lists (``engine_native.basics.metrics()["pending"]``: name, op, age and, on
rank 0, the ranks that have not submitted it) into "ranks 0,2 waited 4.1 s in allreduce 'x'
for rank 1". Names held by some ranks and not by others also reveal who is missing when
rank 0's view is unavailable.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

from .ranks import format_ranks, rank_label

_current = None  # the CellRun in progress, if any
_current_lock = threading.Lock()


def set_current(run) -> None:
    global _current
    with _current_lock:
        _current = run


def clear_current(run) -> None:
    global _current
    with _current_lock:
        if _current is run:
            _current = None


def interrupt_running_cell(reason: str = "stop") -> bool:
    """Interrupt the ``%%hvd`` cell that is running now, from any thread.

    Every rank still running the cell gets SIGINT; collectives in flight are aborted and the
    core re-initialised on all ranks; the cell then ends with a report of where each rank was.
    This is what the dashboard's Stop button calls.

    Parameters
    ----------
    reason : str
        Shown in the report (``stop`` by default).

    Returns
    -------
    bool
        False when no cell was running.
    """
    with _current_lock:
        run = _current
    if run is None:
        return False
    run.request_interrupt(reason)
    return True


@contextmanager
def sigint_to(callback):
    """Route SIGINT to ``callback()`` while the block runs (only on the main thread; a
    second SIGINT while the first is handled escalates the same way)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: callback())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def pending_by_rank(states: dict[int, dict]) -> dict[int, list[dict]]:
    """``{rank: [pending op, ...]}`` from per-rank core states (see engine_side.core_state)."""
    return {r: list(s.get("pending") or []) for r, s in states.items() if s}


def stuck_groups(pending: dict[int, list[dict]], world: list[int]) -> list[dict]:
    """Group ranks by the collective they wait in.

    Returns ``[{"name", "op", "label", "ranks", "missing", "age"}]``: ``missing`` comes from
    rank 0's coordinator view when it has one, else from ranks that have no such op pending.
    """
    by_name: dict[tuple, dict] = {}
    coordinator: dict[str, list[int]] = {}
    for rank, ops in pending.items():
        for op in ops:
            key = (op.get("name", "?"), op.get("op", "?"))
            g = by_name.setdefault(key, {"name": key[0], "op": key[1], "ranks": [], "age": 0.0})
            g["ranks"].append(rank)
            g["age"] = max(g["age"], float(op.get("age_seconds") or 0.0))
            if op.get("missing_ranks"):
                coordinator[key[0]] = sorted(op["missing_ranks"])
    groups = []
    for g in by_name.values():
        known = set(pending)
        inferred = [r for r in world if r in known and r not in g["ranks"]]
        g["missing"] = coordinator.get(g["name"]) or inferred
        g["ranks"] = sorted(g["ranks"])
        g["label"] = op_label(g["op"], g["name"])
        groups.append(g)
    return sorted(groups, key=lambda g: (g["ranks"][0], g["name"]))


def op_label(op: str, name: str) -> str:
    """``allreduce 'grad.fc1'`` from the core's op kind and full tensor name."""
    op = op.lower()
    short = name[len(op) + 1:] if name.startswith(op + ".") else name
    return f"{op} {short!r}"


def stuck_lines(groups: list[dict], world: list[int], finished: dict[int, str],
                max_names: int = 3) -> list[str]:
    """Report lines: who waited in what, for whom, and what the missing ranks were doing.

    Collectives with the same waiting ranks, missing ranks and op share one line (a model's
    gradients: "allreduce 'fc1.weight', 'fc1.bias', 'fc2.weight' and 5 more").
    ``finished`` maps ranks that were no longer running the cell to a word on how it ended
    (``finished the cell``, ``raised ValueError``, ``died``)."""
    merged: dict[tuple, list[dict]] = {}
    for g in groups:
        merged.setdefault((tuple(g["ranks"]), tuple(g["missing"]), g["op"]), []).append(g)
    lines = []
    for (ranks, missing, op), same in merged.items():
        names = [g["label"].split(" ", 1)[1] for g in same]
        what = f"{op.lower()} {', '.join(names[:max_names])}"
        if len(names) > max_names:
            what += f" and {len(names) - max_names} more"
        age = max(g["age"] for g in same)
        line = f"  {rank_label(ranks, world)}: stuck in {what} for {age:.1f} s"
        if missing:
            why = sorted({finished[r] for r in missing if r in finished})
            line += f", waiting on rank{'s' if len(missing) > 1 else ''} " \
                    f"{format_ranks(missing)}" + (f" ({'; '.join(why)})" if why else "")
        lines.append(line)
    return lines


def activity_lines(states: dict[int, dict]) -> list[str]:
    """One line per rank that was inside a pipeline step: its stage and action, e.g. "rank 1:
    pipeline stage 1, in the forward of micro-batch 1" (engine_native/pipeline/activity.py)."""
    return [f"  rank {r}: {s['activity']}" for r, s in sorted(states.items())
            if s and s.get("activity")]
