"""Per-rank cell output: split into lines, collapse what all ranks printed alike, prefix the rest.

Fed from the ipyparallel client's IO thread (one chunk of text or one display message at a
time, through :meth:`RankOutput.feed_text` / :meth:`RankOutput.feed_display`) and drained on
the notebook's main thread by :meth:`RankOutput.drain`, which returns what to show. Nothing
here prints or imports IPython, so the rules are tested as plain data.

Note [Collapsing]
    Every rank has one queue per stream (stdout, stderr). A line leaves the queues when:

    A. every rank's head is the same line: it is shown once, marked as from all ranks;
    B. otherwise, a group of ranks with the same head line is shown (prefixed with those
       ranks) as soon as no other rank can still produce that line in order: each other rank
       has finished, or has queued lines that do not contain it;
    C. or the group's oldest line has waited ``window`` seconds (a slow rank never holds
       output back for long), or the cell is over (``final``).

    Per-rank order is always kept. A rank-0-only ``print`` therefore shows after at most
    ``window`` seconds; lines that differ per rank (losses) show as soon as every rank
    printed its own; identical lines collapse even when one rank printed extra lines before.
"""

from __future__ import annotations

import json
import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

STREAMS = ("stdout", "stderr")


@dataclass
class Item:
    """One line of text (``text`` ends without the newline) or one rich display."""
    key: str
    arrived: float
    text: str | None = None
    display: dict | None = None


@dataclass
class Emission:
    """Something to show: ``ranks`` produced ``item`` on ``stream`` (collapsed if several)."""
    stream: str
    ranks: tuple[int, ...]
    item: Item


@dataclass
class _RankState:
    queues: dict[str, deque] = field(default_factory=lambda: {s: deque() for s in STREAMS})
    # how often each key is queued, so rule B's "not in that rank's queue" costs O(1)
    counts: dict[str, Counter] = field(default_factory=lambda: {s: Counter() for s in STREAMS})
    partial: dict[str, str] = field(default_factory=lambda: {s: "" for s in STREAMS})
    partial_since: dict[str, float] = field(default_factory=dict)
    finished: bool = False

    def push(self, stream: str, item: Item) -> None:
        self.queues[stream].append(item)
        self.counts[stream][item.key] += 1

    def pop(self, stream: str) -> Item:
        item = self.queues[stream].popleft()
        self.counts[stream][item.key] -= 1
        return item


class RankOutput:
    """Collects the output of one cell on ``ranks`` and decides what to show when.

    Parameters
    ----------
    ranks : sequence of int
        The ranks running the cell.
    window : float
        Seconds a line may wait for the other ranks before it is shown on its own
        (Note [Collapsing], rule C).
    """

    def __init__(self, ranks, window: float = 0.5):
        self.ranks = tuple(ranks)
        self.window = window
        self._state = {r: _RankState() for r in self.ranks}
        self._lock = threading.Lock()

    # -- feeding (any thread) -------------------------------------------------------------

    def feed_text(self, rank: int, stream: str, text: str, now: float) -> None:
        """Add a chunk of a rank's stream. Carriage returns keep only the text after the last
        ``\\r`` of a line, as a terminal would show it (progress bars)."""
        stream = stream if stream in STREAMS else "stdout"
        with self._lock:
            st = self._state[rank]
            buf = st.partial[stream] + text
            *lines, rest = buf.split("\n")
            for line in lines:
                line = line.rsplit("\r", 1)[-1]
                st.push(stream, Item(key="t:" + line, arrived=now, text=line))
            if rest and not st.partial[stream]:
                st.partial_since[stream] = now
            st.partial[stream] = rest.rsplit("\r", 1)[-1] if "\r" in rest else rest

    def feed_display(self, rank: int, content: dict, now: float) -> None:
        """Add a rich display (``display_data`` content) from a rank, ordered with stdout."""
        data = content.get("data", {})
        try:
            key = "d:" + json.dumps(data, sort_keys=True, default=str)
        except (TypeError, ValueError):
            key = f"d:{id(content)}"
        with self._lock:
            self._flush_partial(self._state[rank], "stdout", now)
            self._state[rank].push("stdout", Item(key=key, arrived=now, display=content))

    def finish(self, rank: int, now: float) -> None:
        """The rank will produce nothing more (its result arrived); flush its partial line."""
        with self._lock:
            st = self._state[rank]
            for stream in STREAMS:
                self._flush_partial(st, stream, now)
            st.finished = True

    @staticmethod
    def _flush_partial(st: _RankState, stream: str, now: float) -> None:
        if st.partial[stream]:
            text = st.partial[stream]
            arrived = st.partial_since.get(stream, now)
            st.push(stream, Item(key="t:" + text, arrived=arrived, text=text))
            st.partial[stream] = ""

    # -- draining (main thread) -----------------------------------------------------------

    def drain(self, now: float, final: bool = False) -> list[Emission]:
        """What can be shown now, in order. With ``final`` everything queued is returned."""
        out: list[Emission] = []
        with self._lock:
            if final:
                for st in self._state.values():
                    for stream in STREAMS:
                        self._flush_partial(st, stream, now)
            for stream in STREAMS:
                self._drain_stream(stream, now, final, out)
        return out

    def pending_lines(self) -> int:
        """Lines held back right now (tests and diagnostics)."""
        with self._lock:
            return sum(len(st.queues[s]) for st in self._state.values() for s in STREAMS)

    def _drain_stream(self, stream: str, now: float, final: bool, out: list) -> None:
        queues = {r: self._state[r].queues[stream] for r in self.ranks}
        while True:
            heads = {r: q[0] for r, q in queues.items() if q}
            if not heads:
                return
            groups: dict[str, list[int]] = {}
            for r, item in heads.items():
                groups.setdefault(item.key, []).append(r)
            if len(heads) == len(self.ranks) and len(groups) == 1:  # rule A
                self._emit(stream, self.ranks, out)
                continue
            def arrival(g):
                return min(queues[r][0].arrived for r in g)

            ready = [g for g in groups.values() if self._ready(g, queues, stream, now)]
            if not ready:
                if not final:
                    return
                ready = [min(groups.values(), key=arrival)]  # only cyclic waits remain
            for group in sorted(ready, key=min):  # rank order: deterministic, readable
                self._emit(stream, tuple(sorted(group)), out)

    def _ready(self, group: list[int], queues: dict, stream: str, now: float) -> bool:
        key = queues[group[0]][0].key
        if now - min(queues[r][0].arrived for r in group) >= self.window:  # rule C
            return True
        for r in self.ranks:  # rule B
            if r in group:
                continue
            if queues[r]:
                if self._state[r].counts[stream][key]:
                    return False
            elif not self._state[r].finished:
                return False
        return True

    def _emit(self, stream: str, ranks: tuple, out: list) -> None:
        item = None
        for r in ranks:
            item = self._state[r].pop(stream)
        out.append(Emission(stream=stream, ranks=tuple(ranks), item=item))


def render_text(emissions: list[Emission], everyone, label) -> dict[str, str]:
    """Join text emissions into one string per stream, each line prefixed ``[label] ``.

    ``label(ranks, everyone)`` names the ranks (see :func:`hvd_magic.ranks.rank_label`).
    Displays are skipped here; the caller shows them in order with :func:`split_runs`.
    """
    text: dict[str, list[str]] = {}
    for e in emissions:
        if e.item.text is not None:
            text.setdefault(e.stream, []).append(f"[{label(e.ranks, everyone)}] {e.item.text}\n")
    return {stream: "".join(lines) for stream, lines in text.items()}


def split_runs(emissions: list[Emission]) -> list[tuple[str, Any]]:
    """Group consecutive emissions into ``("text", [emissions])`` and ``("display", e)`` runs,
    so text is written in few stream messages while displays keep their place."""
    runs: list[tuple[str, Any]] = []
    for e in emissions:
        if e.item.display is not None:
            runs.append(("display", e))
        elif runs and runs[-1][0] == "text":
            runs[-1][1].append(e)
        else:
            runs.append(("text", [e]))
    return runs
