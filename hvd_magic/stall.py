"""When a ``%%hvd`` cell that can never finish ends by itself, and the hint printed before it:
the policy's constants, the default grace (``$HVD_STALL_GRACE``) and the checks over what the
ranks publish. :class:`hvd_magic.cellrun.CellRun` applies them at every step.

Note [A cell that can never finish]: some ranks finished the cell while the others wait in
collectives (a time-based loop that ran a different number of steps per rank). The interrupt
protocol of hvd_magic.cellrun runs with reason ``stalled`` once, for ``stall_grace`` seconds,
(a) every rank still running has its main thread blocked in a wait on the core, (b) with
collectives pending and none executing (seen in every publication over the grace: a long
collective between two fused batches for an instant does not count), and (c) the last rank
finished the cell at least that long ago. Then no rank can submit the op the waits need: the
ranks that finished are done and the others are blocked. A rank that is computing (even with
async ops pending, as gradient hooks leave them) is not blocked, so a slow rank is never cut
off; (c) keeps an op a finished rank submitted just before it ended (allreduce_async never
waited on) from being mistaken for a missing one. It assumes collectives come from the cell's
main thread (the one SIGINT reaches), as they do in training loops; a cell whose own threads
submit collectives can set ``--stall-grace 0``.

Note [Stall hint before the stall end]: while ranks wait in collectives that a finished peer
never joined, a hint is printed once ("rank 0 waiting 5+ s in allreduce 'grad' ...; the cell
ends by itself once they have been blocked 10 s (--stall-grace); interrupt the kernel to end
it now"). It is printed after ``STALL_WARN_AFTER`` s in a collective, or after
``STALL_WARN_SHARE`` of the grace when that is sooner, so it comes well before the cell ends
by itself. The hint is checked before the stall end in every step, so it is never skipped.
(Both used to be due after 10 s by default, and the hint was only checked in steps that did
not end the cell: about one such cell in ten ended without the hint, the others a few tenths
of a second after it; with a grace under 10 s the hint never came.)
"""

from __future__ import annotations

import os
from collections.abc import Iterable

STALL_WARN_AFTER = 10.0  # s in a collective, with a peer done, before a hint is printed
STALL_WARN_SHARE = 0.5  # ... or this share of --stall-grace if sooner: Note [Stall hint ...]
STALL_GRACE = 10.0      # default --stall-grace (s): Note [A cell that can never finish]
STALL_GRACE_ENV = "HVD_STALL_GRACE"


def default_stall_grace() -> float:
    """``$HVD_STALL_GRACE`` (seconds) or ``STALL_GRACE``; a bad value is a clear error."""
    text = os.environ.get(STALL_GRACE_ENV, "").strip()
    if not text:
        return STALL_GRACE
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ValueError(f"{STALL_GRACE_ENV}={text!r}: expected seconds >= 0 (0 turns ending "
                         f"stalled cells off); unset it for the default {STALL_GRACE:g} s")
    return value


def all_blocked(states: Iterable[dict]) -> bool:
    """(a) and (b) in the ranks' latest publications: the main thread blocked in a wait,
    collectives pending and none executing (a long op shows as executing)."""
    for state in states:
        if not state.get("pending") or state.get("current"):
            return False
        if not float(state.get("blocked_seconds") or 0.0) > 0.0:
            return False
    return True


def warn_after(grace: float) -> float:
    """Seconds in a collective before the hint: Note [Stall hint before the stall end]."""
    if not grace:
        return STALL_WARN_AFTER
    return min(STALL_WARN_AFTER, STALL_WARN_SHARE * grace)


def hint(grace: float) -> str:
    if not grace:
        return "Interrupt the kernel (or use --timeout) to abort and recover."
    return (f"The cell ends by itself once they have been blocked {grace:g} s "
            f"(--stall-grace); interrupt the kernel to end it now.")
