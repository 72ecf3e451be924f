"""After a failed or interrupted cell: find where ranks were stuck, reset the core, report.

Called once per cell by :meth:`hvd_magic.cellrun.CellRun.finish` on the main thread, after
every rank answered or was given up on (steps C of the protocol in hvd_magic.cellrun):

A. Read the core's state on every rank that can answer (not dead, not still busy); for ranks
   that cannot, use what they last published while running, or what their error carried.
B. Group pending collectives into the stuck report (hvd_magic.interrupts.stuck_groups), and
   add where each rank inside a pipeline step was (its stage and action).
C. When anything is pending, the cell was interrupted or the core itself failed
   (HorovodInternalError): abort + shutdown + init on all ranks at once. Dead or unresponsive
   ranks make that impossible; the report then says to run ``%hvd_restart``.
"""

from __future__ import annotations

import time

from . import engine_side
from .interrupts import activity_lines, pending_by_rank, stuck_groups, stuck_lines
from .ranks import format_ranks, rank_label

QUERY_TIMEOUT = 2.0   # s to read the core state of idle ranks
RESET_TIMEOUT = 4.0   # s for abort + shutdown + init on all ranks


def _header(run, dead) -> str:
    reason = run.reason
    if dead:
        return f"hvd: {rank_label(sorted(dead), run.ranks)} died while running the cell"
    if reason is None:
        return ""
    if reason == "timeout":
        return f"hvd: cell interrupted after {run.timeout:g} s (--timeout {run.timeout:g})"
    if reason == "interrupt":
        return "hvd: cell interrupted (keyboard interrupt)"
    if reason == "stalled":
        cut = getattr(run, "_interrupt_at", float("inf"))
        waiting = [r for r in run.ranks if r not in run._done_at or run._done_at[r] > cut]
        return (f"hvd: ended the cell: {rank_label(waiting, run.ranks)} waited "
                f"{run.stall_grace:g}+ s in collectives that can never complete (every rank "
                f"still running was blocked; --stall-grace {run.stall_grace:g})")
    if reason == "failfast":
        cut = getattr(run, "_interrupt_at", float("inf"))
        failed = [r for r, t in run._done_at.items() if t <= cut and run._failed(r)]
        return (f"hvd: {rank_label(failed, run.ranks)} failed while the others were still "
                f"running; interrupted them so the cell does not hang")
    return f"hvd: cell interrupted ({reason})"


def _finished(run, world) -> dict[int, str]:
    """What each rank that was no longer running the cell had done."""
    out = {}
    cut = getattr(run, "_interrupt_at", float("inf"))
    for r in world:
        if r not in run.ranks:
            out[r] = "not running this cell (--ranks)"
        elif r in run._done_at and run._done_at[r] <= cut:
            rec = run._record(r)
            if rec.get("status") == "ok":
                out[r] = "finished the cell"
            elif rec.get("ename") == "EngineError":
                out[r] = "died"
            else:
                out[r] = f"raised {rec.get('ename')}"
    return out


def _core_states(run, world, skip) -> dict[int, dict]:
    c = run.cluster
    states: dict[int, dict] = {}
    askable = [r for r in world if r not in skip]
    if askable and any(info.core for info in c.ranks):
        ar = c.view(askable).apply_async(engine_side.core_state)
        try:
            states.update(zip(askable, ar.get(QUERY_TIMEOUT)))
        except Exception:
            pass
    for r in run.ranks:  # fall back on what the error carried, or the last live publication
        if r in states:
            continue
        rec = run._record(r)
        if rec is not None and rec.get("core"):
            states[r] = rec["core"]
        elif r in run._futures and run._live_pending(r):
            states[r] = {"pending": run._live_pending(r)}
    return states


def recover(run, failures) -> tuple[str, list[str], dict]:
    """Steps A-C; returns (header, notes, stuck) for the cell's exception."""
    c = run.cluster
    world = list(range(c.size))
    dead = c.dead_ranks()
    stuck_now = {f.rank for f in failures if f.kind == "unresponsive"} | set(c.busy_ranks())
    states = _core_states(run, world, set(dead) | stuck_now)
    groups = stuck_groups(pending_by_rank(states), world)
    # a dead peer makes every pending op moot; its death is the story
    lines = [] if dead else stuck_lines(groups, world, _finished(run, world)) + \
        activity_lines(states)
    notes = []
    has_core = any(info.core for info in c.ranks)
    if dead:
        notes.append(incomplete_note(c))
    elif stuck_now:
        notes.append(f"{rank_label(sorted(stuck_now), world)} did not respond to SIGINT "
                     f"(stuck in code that ignores signals?). Run %hvd_restart to start fresh "
                     f"engines.")
    elif has_core and (groups or run.reason is not None or
                       any(f.ename == "HorovodInternalError" for f in failures)):
        notes.append(_reset(run, world))
    elif run.reason is not None:
        notes.append("All ranks stopped; the engines are ready for the next cell.")
    stuck = {}
    for g in groups:
        for r in g["ranks"]:
            stuck.setdefault(r, []).append(g["label"])
    return "\n".join(line for line in [_header(run, dead), *lines] if line), notes, stuck


def incomplete_note(cluster) -> str:
    """What to do about dead ranks: an elastic cluster can replace just them."""
    if cluster.elastic is not None:
        return (f"The cluster is incomplete: %hvd_scale -n {cluster.size} starts replacements "
                f"(the other ranks keep their variables), or %hvd_restart starts all ranks "
                f"again.")
    return "The cluster is incomplete: run %hvd_restart to start all ranks again."


def _reset(run, world) -> str:
    why = run.reason or "cell failed"
    t0 = time.perf_counter()
    states = run.cluster.setup.reset_cores(f"%%hvd: {why}", RESET_TIMEOUT)
    bad = [r for r in world if not (states.get(r) or {}).get("initialized")]
    if bad:
        err = next((states[r].get("error") for r in bad if states.get(r, {}).get("error")),
                   "no answer in time")
        return (f"Re-initialising the core failed on ranks {format_ranks(bad)} ({err}). "
                f"Run %hvd_restart.")
    return (f"Aborted the collectives in flight and re-initialised the core on all ranks in "
            f"{time.perf_counter() - t0:.1f} s; the next cell runs on the same engines.")

