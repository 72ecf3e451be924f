"""The dashboard's engine side: the metrics publisher and the commands the buttons send.

Shipped by reference through ``view.apply`` like :mod:`hvd_magic.engine_side` (whose
``RANK`` and core module this reuses), after the core is initialised:

- :func:`start` starts this rank's publisher (``hvd_magic.widgets.publisher``): a daemon
  thread sending a snapshot to the driver's hub every 0.3 s, during and between cells, and
  running the dashboard's commands as they arrive, so a button works while a cell is running
  (:func:`timeline`, :func:`autotune`); :func:`snapshot` is what a cell's end sends.
  Throughput comes from ``hvd.report(samples=...)`` (``engine_native.progress``) when the
  training code calls it, else from the core's counters.
- :func:`timeline` and :func:`autotune` are also what ``%hvd_timeline`` / ``%hvd_autotune``
  run on every rank; on a rank whose core is not running both raise a clear error.

Timeline strip: the publisher reads the core's recent-events ring
(``engine_native.basics.timeline_events``) with a cursor of its own; ``metrics()["events"]``
is not used because every ``metrics()`` call in the process (``engine_side.core_state``, the
cell watch) consumes it.
"""

from __future__ import annotations

import time

from . import engine_side

# Read events starting up to this long before the cursor (the end of the newest op returned):
# an op that started before that one ended but ended after it is still unseen. The core runs
# ops one after another, so only overlapping ops need it; every call converts all events of
# [cursor - slack, now] (1 s made that ~4x the new ones at a few hundred ops a second).
EVENT_SLACK_US = 250_000


def _basics():
    basics = engine_side._basics()
    if basics is None:
        raise RuntimeError(f"the core is not running on rank {engine_side.RANK} "
                           f"(hvd.init() failed or engine_native is not built); see %hvd_status")
    return basics


class RecentEvents:
    """``events`` source for the publisher: collectives that ended since the previous call, as
    ``[op, name, start_ago_s, dur_s]``, from ``timeline_events(since_us)``."""

    def __init__(self, timeline_events):
        self.timeline_events = timeline_events
        self.cursor_us = 0  # end of the newest event returned

    def __call__(self) -> list:
        now_us = time.time() * 1e6
        since = max(0, int(self.cursor_us - EVENT_SLACK_US)) if self.cursor_us else 0
        out, newest = [], self.cursor_us
        for ts, name, phase, op, dur, _error in self.timeline_events(since):
            end = ts + dur
            if phase != "op" or end <= self.cursor_us:
                continue
            newest = max(newest, end)
            out.append([op, name, (now_us - ts) / 1e6, dur / 1e6])
        self.cursor_us = newest
        return out


def start(address: str, command_address: str, key: bytes, device: dict) -> dict:
    """Start (or restart) this rank's publisher.

    Parameters
    ----------
    address, command_address : str
        The hub's metrics and command sockets.
    key : bytes
        The job's dashboard key (frames are HMAC-signed both ways).
    device : dict
        ``{"device": "cpu" | "cuda:k", "name": ..., "mem_total": ...}`` from GPU pinning.
    """
    from hvd_magic.widgets import publisher
    from hvd_magic.widgets.gpu_stats import GpuStats

    basics = engine_side._basics()  # None where the core did not start (the rows say so)
    pub = publisher.start_publisher(
        address, rank=engine_side.RANK, key=key, device=device,
        gpu=GpuStats.for_this_process(),  # the pinned GPU's live numbers (#16)
        metrics=basics.metrics if basics is not None else None,
        events=RecentEvents(basics.timeline_events) if basics is not None else None,
        command_address=command_address,
        handlers={"timeline": timeline, "autotune": autotune, "snapshot": snapshot})
    return {"rank": engine_side.RANK, "publishing": pub.running, "core": basics is not None}


def stop() -> None:
    """Stop this rank's publisher (``%hvd_stop``, ``%hvd_dashboard --off``)."""
    from hvd_magic.widgets import publisher

    publisher.stop_publisher()


def snapshot() -> str:
    """A cell's end (``MetricsHub.sync_view``): nothing to run, the answer is the snapshot
    the publisher sends at once."""
    return ""


def timeline(start: bool, path: str | None = None, mark_cycles: bool = False) -> str:
    """Start (writing ``path``; only rank 0 writes) or stop the core's timeline; returns a
    line for the dashboard."""
    if start:
        if not path:
            raise ValueError("timeline(start=True): a file path is needed")
        # Rank 0's core opens the file before it returns (ValueError when it cannot).
        _basics().start_timeline(path, mark_cycles=mark_cycles)
        return f"recording to {path}" if engine_side.RANK == 0 else "recording (rank 0 writes)"
    _basics().stop_timeline()
    return "stopped"


def autotune(enabled: bool) -> str:
    """Switch the core's autotuner on or off (rank 0 decides, the others follow); returns
    its phase afterwards."""
    _basics().set_autotune(bool(enabled))
    return str(_basics().autotune_state().get("phase", ""))
