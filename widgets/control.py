"""Commands from the dashboard to the engines: framing and the driver's bookkeeping of answers.

Why a channel of its own: a dashboard button must act while a ``%%hvd`` cell is running (start
a timeline during training), but every request sent through ipyparallel waits in the engine's
queue behind the running cell. The metrics publisher is a thread that keeps running during
cells, so commands travel the metrics channel the other way:

A. The hub (driver) publishes a signed frame ``{"id", "name", "args", "to"}`` on a ZMQ PUB
   socket; ``to`` lists the ids of the publishers it heard from (their snapshots' ``pub``).
B. Each engine's publisher thread (SUB socket) verifies it, checks that it is addressed to this
   publisher and newer than the last command run, runs the handler registered for ``name``
   (:func:`hvd_magic.widgets.publisher.start_publisher`'s ``handlers``) and puts
   ``[id, ok, text]`` into its next snapshots' ``acks`` (repeated a few times, so one dropped
   snapshot does not lose it).
C. The hub matches acks to the command (:class:`Pending`) and, once every rank that was alive
   when it was sent answered or ``timeout_s`` passed, calls ``on_done(answers, missing)`` on
   its own thread.

Frames are signed JSON frames like snapshots, in the other direction (:mod:`.frames`); ids
only grow, and a publisher runs each id at most once and only the ids sent after the hub heard
from it, so a recorded command is never run again (Note [Dashboard frames] in :mod:`.frames`).
"""

import logging
from typing import NamedTuple

from . import frames
from .frames import MAX_TEXT, is_id, is_int

MAX_COMMAND_BYTES = 64 * 1024  # `to` names every rank's publisher: ~3,000 ranks
MAX_ACKS = 16
log = logging.getLogger("hvd_magic.widgets")


class Command(NamedTuple):
    """A decoded command frame."""

    id: int
    name: str
    args: dict
    to: list  # ids of the publishers it is addressed to


def pack_command(cmd_id, name, args, key=None, to=()):
    """One signed command frame for the publishers whose ids are in ``to``."""
    obj = {"id": int(cmd_id), "name": str(name), "args": dict(args or {}), "to": list(to)}
    return frames.pack(obj, key, frames.COMMAND)


def unpack_command(frame, key=None):
    """Verify and decode a command frame into a :class:`Command`; ValueError when bad."""
    obj = frames.unpack(frame, key, MAX_COMMAND_BYTES, "command frame", frames.COMMAND)
    if not (isinstance(obj, dict) and is_int(obj.get("id")) and isinstance(obj.get("name"), str)
            and isinstance(obj.get("args"), dict) and isinstance(obj.get("to"), list)
            and all(is_id(p) for p in obj["to"])):
        raise ValueError("command frame: expected {id: int, name: str, args: object, "
                         "to: [publisher id]}")
    return Command(obj["id"], obj["name"], obj["args"], obj["to"])


def clean_acks(acks):
    """The ``acks`` field of a snapshot: ``[[id, ok, text], ...]`` with bad entries dropped."""
    out = []
    for a in acks[-MAX_ACKS:]:
        if (isinstance(a, list) and len(a) == 3 and is_int(a[0]) and isinstance(a[1], bool)
                and isinstance(a[2], str)):
            out.append([a[0], a[1], a[2][:MAX_TEXT * 2]])
    return out


class Pending:
    """Commands sent and not yet fully answered (driver side; used by the hub thread only).

    Parameters
    ----------
    clock : callable
        The hub's clock.
    """

    def __init__(self, clock):
        self.clock = clock
        self._open = {}  # id -> [expected ranks, answers {rank: (ok, text)}, deadline, on_done]

    def __len__(self):
        return len(self._open)

    def sent(self, cmd_id, ranks, timeout_s, on_done):
        """Track ``cmd_id`` sent to ``ranks``; with no rank to wait for it ends at once."""
        self._open[cmd_id] = [set(ranks), {}, self.clock() + timeout_s, on_done]
        self._finish_ready()

    def ack(self, rank, acks):
        """Record the answers carried by one snapshot of ``rank``."""
        for cmd_id, ok, text in acks:
            entry = self._open.get(cmd_id)
            if entry is not None and rank not in entry[1]:
                entry[1][rank] = (ok, text)
        self._finish_ready()

    def expire(self, now=None):
        """End commands whose deadline passed (the ranks that did not answer are missing)."""
        now = self.clock() if now is None else now
        for cmd_id in [c for c, e in self._open.items() if now >= e[2]]:
            self._finish(cmd_id)

    def next_deadline(self):
        return min((e[2] for e in self._open.values()), default=None)

    def _finish_ready(self):
        for cmd_id in [c for c, e in self._open.items() if e[0] <= set(e[1])]:
            self._finish(cmd_id)

    def _finish(self, cmd_id):
        expected, answers, _, on_done = self._open.pop(cmd_id)
        if on_done is None:
            return
        try:
            on_done(dict(sorted(answers.items())), sorted(expected - set(answers)))
        except Exception as exc:  # a failing callback must not stop the hub's thread
            log.warning("dashboard command %d: on_done failed: %r", cmd_id, exc)
