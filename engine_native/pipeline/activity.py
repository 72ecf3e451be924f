"""What this process's pipeline step is doing, for the notebook's stuck report.

``hvd_magic``'s cell recovery reads ``current()`` on every rank (through
``engine_side.core_state``) after it interrupts a cell, so a stuck pipeline is reported in its
own terms ("rank 1: pipeline stage 1, in the forward of micro-batch 1") beside the receives
the core lists. A step sets it before each action and clears it when it ends, normally or with
its own error (which names the action); an interrupt (``KeyboardInterrupt``) leaves it for the
report, and the core's re-initialisation clears it (``init()``/``shutdown()``).
"""
from __future__ import annotations

import engine_native.basics as _basics

_doing = None  # (describe, args): formatted only when read, so setting it costs a tuple


def doing(describe, *args) -> None:
    """The step is now at ``describe(*args)`` (a function returning the text)."""
    global _doing
    _doing = (describe, args)


def clear() -> None:
    global _doing
    _doing = None


def current() -> str | None:
    """The text of what the step in progress (or the interrupted one) was doing, or None."""
    entry = _doing
    return None if entry is None else entry[0](*entry[1])


_basics._per_world_resets.append(clear)
