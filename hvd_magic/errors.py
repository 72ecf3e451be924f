"""Errors of ``%%hvd`` cells: one report for many ranks.

A cell that fails on several ranks raises one :class:`RankError` in the notebook. IPython
renders it through ``_render_traceback_`` (as it does ipyparallel's RemoteError), so the user
sees each distinct failure once, with the list of ranks that hit it, and never the magic's own
frames. Built on the notebook's main thread from the per-rank records that
:func:`hvd_magic.engine_side.run_cell` returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .ranks import rank_label

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


@dataclass
class Failure:
    """What went wrong on one rank.

    ``kind`` is ``error`` (the cell raised), ``died`` (the engine process exited),
    ``unresponsive`` (it ignored the interrupt) or ``busy`` (still running an older cell).
    """
    rank: int
    ename: str
    evalue: str = ""
    traceback: list[str] = field(default_factory=list)
    kind: str = "error"

    def signature(self) -> tuple:
        return (self.kind, self.ename, self.evalue,
                tuple(strip_ansi(t) for t in self.traceback))


def group_failures(failures: list[Failure]) -> list[tuple[list[int], Failure]]:
    """Group identical failures (same type, message and traceback); ordered by lowest rank.

    Ranks whose tracebacks differ only in the traceback text still group by type and message,
    the lowest rank's traceback standing for them all.
    """
    exact: dict[tuple, list[Failure]] = {}
    for f in sorted(failures, key=lambda f: f.rank):
        exact.setdefault(f.signature(), []).append(f)
    loose: dict[tuple, list[Failure]] = {}
    for group in exact.values():
        head = group[0]
        loose.setdefault((head.kind, head.ename, head.evalue), []).extend(group)
    return [([f.rank for f in group], group[0]) for group in loose.values()]


def cell_location(traceback: list[str]) -> str:
    """``Cell In[5], line 3: hvd.allreduce(x)`` — where in the cell a rank was, from an
    IPython traceback; "" when the traceback has no cell frame."""
    for frame in reversed(traceback):
        text = strip_ansi(frame)
        if not text.startswith("Cell In["):
            continue
        header = text.splitlines()[0]
        for line in text.splitlines():
            if line.lstrip().startswith("---->"):
                code = line.split("---->", 1)[1].strip()
                code = code.split(" ", 1)[1].strip() if " " in code else code
                return f"{header}: {code}"
        return header
    return ""


def died(cluster, rank: int, why: str) -> Failure:
    """The failure of a rank whose engine exited (``why``: exit code or signal)."""
    info = cluster.ranks[rank]
    return Failure(rank, "engine died", f"{why} (pid {info.pid} on {info.host})", kind="died")


class HvdError(Exception):
    """Base of the errors the hvd magics raise into the notebook."""


class NoClusterError(HvdError):
    """A magic that needs a cluster ran before ``%hvd_start``."""


class StartError(HvdError):
    """``%hvd_start`` could not bring the cluster up; the message says why and how to fix it."""


class RankError(HvdError):
    """A ``%%hvd`` cell failed on one or more ranks.

    Attributes
    ----------
    failures : list of Failure
        One per failed rank.
    ranks : list of int
        The ranks that ran the cell.
    header : str
        First line of the report (e.g. why the cell was interrupted).
    notes : list of str
        Lines shown after the failures (stuck report, what to do next).
    """

    def __init__(self, failures: list[Failure], ranks: list[int], header: str = "",
                 notes: list[str] | None = None):
        self.failures = sorted(failures, key=lambda f: f.rank)
        self.ranks = list(ranks)
        self.header = header
        self.notes = list(notes or [])
        super().__init__(self.summary())

    @property
    def failed_ranks(self) -> list[int]:
        return [f.rank for f in self.failures]

    def summary(self) -> str:
        parts = [f"{f.ename} on {rank_label(r, self.ranks)}"
                 for r, f in group_failures(self.failures)]
        return self.header or "; ".join(parts) or "cell failed"

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a Python traceback."""
        lines: list[str] = []
        if self.header:
            lines.append(self.header)
        # after a death, other ranks' errors are consequences: one line each
        compact = any(f.kind == "died" for f in self.failures)
        for ranks, f in group_failures(self.failures):
            who = rank_label(ranks, self.ranks)
            if f.kind == "error" and f.ename in ("KeyboardInterrupt",) and self.header:
                where = cell_location(f.traceback)
                lines.append(f"{who}: interrupted" + (f" at {where}" if where else ""))
                continue
            if f.kind != "error" or not f.traceback or compact:
                lines.append(f"{who}: {f.ename}" + (f": {f.evalue}" if f.evalue else ""))
                continue
            lines.append(f"{f.ename} on {who}" + ("" if len(ranks) == 1 else
                                                  f" ({len(ranks)} of {len(self.ranks)})") + ":")
            lines.extend(f.traceback)
        lines.extend(self.notes)
        return lines

    def __str__(self) -> str:
        return self.summary()


class CellInterrupted(RankError):
    """The cell was interrupted (Ctrl-C, the dashboard's Stop, ``--timeout`` or a failed peer).

    ``reason`` is ``interrupt``, ``stop``, ``timeout`` or ``failfast``; ``stuck`` maps each rank
    to the collectives it was waiting in when interrupted (see hvd_magic.interrupts).
    """

    def __init__(self, failures, ranks, reason: str, header: str = "", notes=None,
                 stuck: dict | None = None):
        self.reason = reason
        self.stuck = dict(stuck or {})
        super().__init__(failures, ranks, header=header, notes=notes)


class RanksDead(RankError):
    """Engines of the cluster exited; ``%hvd_restart`` starts them again."""
