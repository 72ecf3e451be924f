"""Where rank output goes: prefixed lines on the console, optional per-rank files, a tail kept
for the failure report.

Every launcher (local processes, mpiexec, Spark tasks) ends up calling :meth:`RankOutput.line`
with one whole line of one rank's stream; this class is the only place that formats it. The
prefix is mpirun ``--tag-output``'s / horovodrun's ``[rank]<stdout>:``. Thread-safe: one lock
keeps lines whole when several reader threads write at once.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

__all__ = ["TAG", "LineSplitter", "RankOutput", "parse_tagged"]

STREAMS = ("stdout", "stderr")
# ASCII digits, at most 9: int() of thousands of digits raises (found by tests/fuzz).
TAG = re.compile(r"^\[([0-9]{1,9})\]<(stdout|stderr|exit)>:(.*)$", re.DOTALL)


def parse_tagged(line: str):
    """``"[3]<stderr>:text"`` → ``(3, "stderr", "text")``; None for an untagged line."""
    m = TAG.match(line)
    return (int(m.group(1)), m.group(2), m.group(3)) if m else None


class LineSplitter:
    """Bytes in, whole decoded lines out (without the newline); :meth:`flush` ends a partial one."""

    def __init__(self, emit: Callable[[str], None]):
        self._emit = emit
        self._buf = b""

    def feed(self, data: bytes) -> None:
        self._buf += data
        while True:
            cut = self._buf.find(b"\n")
            if cut < 0:
                break
            line, self._buf = self._buf[:cut], self._buf[cut + 1:]
            self._emit(line.rstrip(b"\r").decode("utf-8", errors="replace"))
        if len(self._buf) > 1 << 20:  # a megabyte without a newline: pass it on anyway
            self.flush()

    def flush(self) -> None:
        if self._buf:
            line, self._buf = self._buf, b""
            self._emit(line.decode("utf-8", errors="replace"))


class RankOutput:
    """Formats, shows and keeps the output lines of every rank of one job.

    Parameters
    ----------
    stdout, stderr : text streams for the prefixed lines (default: sys.stdout / sys.stderr,
        looked up at each write so a notebook's per-cell streams are honoured).
    output_dir : horovodrun's ``--output-filename``: each rank's raw lines also go to
        ``<dir>/rank.<r>/stdout`` and ``.../stderr``.
    timestamp : prefix each line with the time (``--prefix-output-with-timestamp``).
    prefix : False writes lines unprefixed (a single rank, or when asked).
    only_ranks : show only these ranks' lines (files and tails still get everything).
    tail : how many stderr lines per rank are kept for :meth:`tail`.
    """

    def __init__(self, stdout: TextIO | None = None, stderr: TextIO | None = None, *,
                 output_dir: str | None = None, timestamp: bool = False, prefix: bool = True,
                 only_ranks=None, tail: int = 60):
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._dir = output_dir
        self._timestamp = timestamp
        self._prefix = prefix
        self._only = None if only_ranks is None else set(only_ranks)
        self._tails: dict = {}
        self._tail_len = tail
        self._files: dict = {}
        self._lock = threading.Lock()

    def _stream(self, name: str) -> TextIO:
        return self._streams[name] or getattr(sys, name)

    def line(self, rank: int, stream: str, text: str) -> None:
        """Show one whole line (no trailing newline) that ``rank`` wrote on ``stream``."""
        with self._lock:
            if stream == "stderr":
                self._tails.setdefault(rank, deque(maxlen=self._tail_len)).append(text)
            if self._dir is not None:
                self._file(rank, stream).write(text + "\n")
            if self._only is not None and rank not in self._only:
                return
            head = ""
            if self._timestamp:
                head = time.strftime("%a %b %d %H:%M:%S %Y")
            if self._prefix:
                head += f"[{rank}]<{stream}>:"
            out = self._stream(stream)
            try:
                out.write(head + text + "\n")
                out.flush()
            except (OSError, ValueError):  # a closed console must not kill the launcher
                pass

    def note(self, text: str) -> None:
        """A line from the launcher itself (to stderr, unprefixed)."""
        with self._lock:
            try:
                err = self._stream("stderr")
                err.write(text.rstrip("\n") + "\n")
                err.flush()
            except (OSError, ValueError):
                pass

    def tail(self, rank: int) -> list:
        """The last stderr lines of ``rank`` (for the failure report)."""
        with self._lock:
            return list(self._tails.get(rank, ()))

    def _file(self, rank: int, stream: str):
        key = (rank, stream)
        fh = self._files.get(key)
        if fh is None:
            folder = os.path.join(self._dir, f"rank.{rank}")
            os.makedirs(folder, exist_ok=True)
            fh = self._files[key] = open(os.path.join(folder, stream), "a", buffering=1)
        return fh

    def close(self) -> None:
        with self._lock:
            for fh in self._files.values():
                fh.close()
            self._files.clear()


def traceback_tail(lines: list) -> list:
    """From a rank's last stderr lines, the last Python traceback (or the lines as they are),
    without the core's own log lines (``[hvd rank N] ...``) that follow it."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last)"):
            return [line for line in lines[i:] if not line.startswith("[hvd rank ")]
    return lines
