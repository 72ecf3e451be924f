"""This rank's last pipeline training step, action by action, for the dashboard's strip.

A training step (``engine_native.torch.pipelining``) records each forward and backward it ran
as ``(action, start, end)`` in ``time.perf_counter`` seconds (a tuple appended to a list per
action: the two clock reads were already taken for the measured bubble) and hands the list
here once the step is done. Nothing is converted then: the dashboard's publisher thread calls
:func:`latest` a few times a second, and only that call (once per step, cached) builds the
JSON-ready record, so a rank nobody watches pays the appends alone (benchmarks/RESULTS.md,
"Pipeline strip").

Standard library only, and no lock: a step replaces ``_last`` in one assignment and never
touches a list it handed over, so the publisher thread reads a complete step or the previous
one.
"""
from __future__ import annotations

MAX_ACTIONS = 256  # forwards and backwards sent per step; the dashboard refuses more

_last = None    # (spans, started, ended, bubble, ideal, schedule) of the last training step
_cooked = None  # (the _last it was built from, its record)


def record(spans: list, started: float, ended: float, bubble: float, ideal: float,
           schedule: str) -> None:
    """Keep a finished training step: ``spans`` its ``(action, start, end)`` (an action has
    ``kind`` "F" or "B", ``stage`` and ``microbatch``), ``started``/``ended`` the step's
    clock, ``bubble`` its measured idle fraction beside the schedule's ``ideal``."""
    global _last
    _last = (spans, started, ended, bubble, ideal, schedule)


def latest() -> dict | None:
    """The last training step as the dashboard's snapshot carries it (field ``pipeline``,
    schema in ``hvd_magic.widgets.pipeline_step``), or None before the first step::

        {"schedule": "1f1b", "step_s": 0.0123, "bubble": 0.156, "ideal": 0.111,
         "actions": [["F", stage, microbatch, start_s, end_s], ...], "more": 0}

    Times are seconds from the step's start on this rank, rounded to the microsecond;
    ``more`` counts the actions past :data:`MAX_ACTIONS` that were left out."""
    global _cooked
    last, cooked = _last, _cooked
    if last is None:
        return None
    if cooked is not None and cooked[0] is last:
        return cooked[1]
    spans, started, ended, bubble, ideal, schedule = last
    out = {"schedule": schedule, "step_s": round(ended - started, 6), "bubble": bubble,
           "ideal": ideal,
           "actions": [[a.kind, a.stage, a.microbatch, round(t0 - started, 6),
                        round(t1 - started, 6)] for a, t0, t1 in spans[:MAX_ACTIONS]],
           "more": max(0, len(spans) - MAX_ACTIONS)}
    _cooked = (last, out)
    return out


def clear() -> None:
    """Forget the last step (tests)."""
    global _last, _cooked
    _last = _cooked = None
