"""The snapshot's ``pipeline`` field: a rank's last pipeline training step, for its strip.

Sent by the publisher as ``engine_native.pipeline.last_step.latest()`` gives it, checked here
by :func:`clean` (from :func:`.snapshot.validate`) on the driver, carried by the model as
:class:`.rows.PipelineStep` and drawn by :func:`.sparkline.pipeline_strip`. Standard library
only, as :mod:`.snapshot`. Schema::

    schedule  str    "gpipe" | "1f1b" | "interleaved_1f1b" (clipped to 40 characters)
    step_s    float  the step's time on the rank, > 0
    bubble    float  its measured idle fraction, 0..1
    ideal     float  the schedule's (K - 1) / (V M + K - 1), 0..1
    actions   list   ≤ MAX_ACTIONS [kind "F" | "B", stage, micro-batch, start_s, end_s], in the
                     order the rank ran them, 0 ≤ start_s ≤ end_s ≤ step_s
    more      int    actions of the step left out past MAX_ACTIONS

A field that breaks any of this is dropped whole (a strip with holes would show idle time
that was not), and the rest of the snapshot is kept.
"""

import math

from .frames import is_int

MAX_ACTIONS = 256  # the publisher sends at most this many (engine_native.pipeline.last_step)
MAX_INDEX = 1 << 20  # stages and micro-batches
MAX_STEP_S = 86_400.0
_COUNT_LIMIT = 1 << 63


def clean(obj):
    """The checked copy of a ``pipeline`` field, or None when it breaks the schema."""
    if not isinstance(obj, dict):
        return None
    step_s, bubble, ideal = obj.get("step_s"), obj.get("bubble"), obj.get("ideal")
    actions, more, schedule = obj.get("actions"), obj.get("more", 0), obj.get("schedule", "")
    if not (_num(step_s) and 0 < step_s <= MAX_STEP_S and _fraction(bubble)
            and _fraction(ideal) and isinstance(schedule, str) and is_int(more)
            and 0 <= more < _COUNT_LIMIT and isinstance(actions, list)
            and len(actions) <= MAX_ACTIONS):
        return None
    out = []
    for action in actions:
        if not (isinstance(action, list) and len(action) == 5 and action[0] in ("F", "B")):
            return None
        kind, stage, mb, start, end = action
        if not (_index(stage) and _index(mb) and _num(start) and _num(end)
                and 0 <= start <= end <= step_s):
            return None
        out.append([kind, stage, mb, float(start), float(end)])
    return {"schedule": schedule[:40], "step_s": float(step_s), "bubble": float(bubble),
            "ideal": float(ideal), "actions": out, "more": more}


def _num(x):
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an integer past float's range
        return False


def _fraction(x):
    return _num(x) and 0 <= x <= 1


def _index(x):
    return is_int(x) and 0 <= x < MAX_INDEX
