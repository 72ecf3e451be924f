"""The dashboard of a running cluster, on the driver: hub, view, engine publishers, controls.

:class:`Dashboard` is created by ``%hvd_start`` (unless ``--no-dashboard``) or
``%hvd_dashboard``, on the notebook's main thread. It starts a
:class:`hvd_magic.widgets.hub.MetricsHub` (one updater thread, ≤ 5 renders a second and one at
each cell's end) with the widget view when the notebook has a widget frontend, starts a
publisher on every engine (:mod:`hvd_magic.engine_dashboard`) and follows the cluster through
:func:`hvd_magic.status.add_listener`:

- ``restarted``: the old ranks are forgotten and the new engines publish to the same hub;
- ``cell_end``: ranks whose engine died are shown dead with the reason, and the view shows
  every rank's state at the cell's end before the cell returns (``MetricsHub.sync_view``);
- ``scaled``: the world re-formed (hvd_magic.elastic): rows follow the new ranks and the
  change, with the ranks that left and why, shows with the cluster row;
- ``stopped``: "cluster stopped" is shown and the hub stops.

Between those, a hub sink (:class:`_DeathWatch`) marks ranks whose engine left the
controller as dead within a second, also while a cell runs.

Controls (button callbacks run on the main thread; while an awaiting ``%%hvd`` cell runs,
ipykernel ≥ 7.4 delivers them): Stop calls :func:`hvd_magic.interrupt_running_cell`, exactly
what Ctrl-C does; the timeline and autotune buttons are sent to every engine's publisher
thread (:mod:`hvd_magic.widgets.control`), so they act during training; the answer of every
rank is shown next to the buttons.

Without a widget frontend (terminal IPython, ``IPP_NONINTERACTIVE``) the hub still collects
metrics; ``%hvd_start`` prints the status as text once and ``%hvd_dashboard`` prints it
again; ``HVD_DASHBOARD=text`` prints a line on every change of rank states instead (``off``
starts nothing).
"""

from __future__ import annotations

import os
import secrets
import time

from . import engine_dashboard, status
from .interrupts import interrupt_running_cell
from .launch import hosts as hostlib
from .ranks import format_ranks

ATTACH_TIMEOUT = 10.0   # s for every engine to start its publisher
COMMAND_TIMEOUT = 5.0   # s for every rank to answer a button
DEATH_CHECK_S = 1.0     # s between checks for engines that left
FIRST_SNAPSHOT_TIMEOUT = 3.0  # s to wait for every rank's first snapshot before printing
CELL_END_SYNC_S = 2.0  # s a cell's end waits at most for every rank's last snapshot


def timeline_path(path: str | None = None) -> str:
    """Where rank 0 writes a timeline: ``path``, else ``hvd-timeline-<date>-<time>.json`` in
    the notebook's working directory (absolute, so the engines' own directory does not
    matter)."""
    return os.path.abspath(path or time.strftime("hvd-timeline-%Y%m%d-%H%M%S.json"))


def device_info(info) -> dict:
    """What the publisher shows for a rank's device (a RankInfo from the cluster)."""
    out = {"device": info.device}
    if info.device_name:
        out["name"] = info.device_name
    if info.device_memory:
        out["mem_total"] = info.device_memory
    return out


class _DeathWatch:
    """Hub sink: ranks whose engine is no longer registered are shown dead (hub thread).

    Reads only ``client.ids`` (a copy of a list the client's IO thread keeps) and
    ``cluster.ranks`` (replaced, never mutated), at most once per ``DEATH_CHECK_S``."""

    def __init__(self, dashboard):
        self.dashboard = dashboard
        self.marked: set[int] = set()
        self.last = float("-inf")

    def update(self, model, now):
        cluster = self.dashboard.cluster
        if now - self.last < DEATH_CHECK_S or cluster.client is None:
            return
        self.last = now
        alive = set(cluster.client.ids)
        for info in list(cluster.ranks):
            if info.engine_id not in alive and info.rank not in self.marked:
                self.marked.add(info.rank)
                self.dashboard.hub.mark_dead(info.rank, reason="engine exited")


class Dashboard:
    """The dashboard of ``cluster`` (an :class:`hvd_magic.cluster.HvdCluster`)."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.key = secrets.token_bytes(32)
        self.hub = None
        self._watch = _DeathWatch(self)
        self._size = cluster.size  # the world's size last shown (elastic changes)

    # -- lifecycle (main thread) ------------------------------------------------------------

    def start(self, show: bool = True) -> list[str]:
        """Start the hub (and view), then the engines' publishers; returns notes to print."""
        from .widgets import dashboard_mode, start_dashboard

        mode = dashboard_mode()
        quiet_text = mode == "text" and \
            os.environ.get("HVD_DASHBOARD", "").strip().lower() != "text"
        if quiet_text:  # no widget frontend: collect quietly, print the status once below
            mode = "off"  # (a line per state change would interleave with cells' output)
        self.hub = start_dashboard(
            size=self.cluster.size, key=self.key, bind=f"tcp://{self._listen_address()}",
            mode=mode, display=show,
            on_stop=self.stop_clicked, on_timeline=self.timeline_clicked,
            on_autotune=self.autotune_clicked)
        self.hub.add_sink(self._watch)
        status.add_listener(self._on_event)
        notes = self.attach_engines()
        if show and quiet_text:
            self.hub.wait_for_ranks(range(self.cluster.size), FIRST_SNAPSHOT_TIMEOUT)
            self.show()
        return notes

    def _listen_address(self) -> str:
        """Loopback for ranks on this machine; else the one interface the ranks reach this
        machine through (never every interface: the hub takes frames from whoever connects)."""
        if self.cluster.launcher in ("local", "mpi"):
            return "127.0.0.1"
        return hostlib.address_toward([r.host for r in self.cluster.ranks])

    def attach_engines(self) -> list[str]:
        """Start a publisher on every rank (after %hvd_start and %hvd_restart)."""
        c = self.cluster
        answers, missing = ask_ranks(
            c, lambda info: (engine_dashboard.start, self.hub.address, self.hub.command_address,
                             self.key, device_info(info)), ATTACH_TIMEOUT)
        failed = {rank: text for rank, (ok, text) in answers.items() if not ok}
        failed.update({rank: f"no answer within {ATTACH_TIMEOUT:.0f} s" for rank in missing})
        if not failed:
            return []
        first = failed[min(failed)]
        return [f"dashboard: ranks {format_ranks(failed)} of {c.size} publish no metrics "
                f"({first})"]

    def show(self) -> None:
        """Display the view again (``%hvd_dashboard``), or print the text form."""
        if self.hub.view is not None:
            from IPython.display import display
            display(self.hub.view)
            return
        from .widgets.text import render
        print(render(self.hub.model, time.monotonic()))

    def close(self, engines_alive: bool = True, message: str = "cluster stopped") -> None:
        """Stop the publishers (when the engines can still answer) and the hub."""
        status.remove_listener(self._on_event)
        if getattr(self.cluster, "dashboard", None) is self:
            self.cluster.detach_dashboard(only=self)
        if self.hub is None:
            return
        c = self.cluster
        if engines_alive and c.client is not None and c.ranks and not c.busy_ranks() \
                and not c.dead_ranks():
            try:
                c.view().apply_async(engine_dashboard.stop).wait(2.0)
            except Exception:  # engines going away anyway
                pass
        if self.hub.view is not None:
            self.hub.view.show_message(message)
        self.hub.stop()
        self.hub = None

    @property
    def running(self) -> bool:
        return self.hub is not None and self.hub.running

    def _on_event(self, event: str, cluster, **details) -> None:
        if cluster is not self.cluster or self.hub is None:
            return
        if event == "restarted":
            self.hub.forget()
            self._watch.marked.clear()
            self.hub.model.expect(range(cluster.size))
            for note in self.attach_engines():
                print(f"hvd: {note}")
        elif event == "scaled":
            self._rescaled(cluster)
        elif event == "cell_end":
            run = details.get("run")
            if getattr(run, "reason", None) == "stop button" and self.hub.view is not None:
                self.hub.view.show_message("cell stopped (its output says where each rank was)")
            for rank, why in cluster.dead_ranks().items():
                self._watch.marked.add(rank)
                self.hub.mark_dead(rank, reason=why)
            if self.hub.view is not None:
                try:
                    self.hub.sync_view(CELL_END_SYNC_S)
                except KeyboardInterrupt:  # a second Ctrl-C: the cell ends without it
                    pass
        elif event == "stopped":
            self.close(engines_alive=False)

    def _rescaled(self, cluster) -> None:
        """The world re-formed (%hvd_scale, or a rank lost in a cell): rows are renumbered,
        the ranks' publishers restarted under their new ranks, and the change (with the
        ranks that left and why) is shown with the cluster row."""
        from .widgets.model import WorldChange

        ew = cluster.elastic
        left = tuple((d.rank, d.pid, d.why) for d in ew.departed
                     if d.generation == ew.generation) if ew is not None else ()
        self.hub.model.record_world(WorldChange(ew.generation if ew else 0, self._size,
                                                cluster.size, left))
        self._size = cluster.size
        self.hub.forget()
        self._watch.marked.clear()
        self.hub.model.expect(range(cluster.size))
        for note in self.attach_engines():
            print(f"hvd: {note}")
        self.hub.notify()

    # -- controls (main thread; answers arrive on the hub thread) ---------------------------

    def stop_clicked(self) -> str:
        if interrupt_running_cell("stop button"):
            return "stopping every rank..."
        return "no %%hvd cell is running"

    def timeline_clicked(self, start: bool) -> str:
        path = timeline_path() if start else None
        self.hub.command("timeline", on_done=self._answered("timeline"),
                         timeout_s=COMMAND_TIMEOUT, start=start, path=path)
        return f"{'starting' if start else 'stopping'} the timeline..."

    def autotune_clicked(self, enabled: bool) -> str:
        self.hub.command("autotune", on_done=self._answered("autotune"),
                         timeout_s=COMMAND_TIMEOUT, enabled=enabled)
        return f"switching autotune {'on' if enabled else 'off'}..."

    def _answered(self, what: str):
        def on_done(answers: dict, missing: list) -> None:
            line, error = summarize(what, answers, missing)
            if self.hub is not None and self.hub.view is not None:
                self.hub.view.show_message(line, error=error)
            else:
                print(f"hvd: {line}")
        return on_done


def summarize(what: str, answers: dict, missing: list) -> tuple[str, bool]:
    """One line from every rank's answer to a command, and whether it is an error.

    Failures first, grouped by text ("timeline: ranks 0-3: RuntimeError: ..."); else
    rank 0's answer ("timeline: recording to /x.json")."""
    failed: dict[str, list[int]] = {}
    for rank, (ok, text) in answers.items():
        if not ok:
            failed.setdefault(text, []).append(rank)
    parts = [f"ranks {format_ranks(ranks)}: {text}" if len(ranks) > 1 else
             f"rank {ranks[0]}: {text}" for text, ranks in failed.items()]
    if missing:
        parts.append(f"no answer from rank{'s' if len(missing) > 1 else ''} "
                     f"{format_ranks(missing)}")
    if parts:
        return f"{what}: " + "; ".join(parts), True
    if not answers:
        return f"{what}: no rank is running", True
    first = answers[min(answers)][1]
    return f"{what}: {first}" if first else f"{what}: done on {len(answers)} ranks", False


def ask_ranks(cluster, call, timeout: float) -> tuple[dict, list]:
    """Run ``call(info)`` = ``(fn, *args)`` on every rank's engine at once (between cells:
    requests wait behind a running cell); returns ``({rank: (ok, text)}, ranks that did not
    answer within ``timeout`` s)``. A remote exception is ``(False, "Name: message")``."""
    pending, answers, missing = {}, {}, []
    for info in cluster.ranks:
        fn, *args = call(info)
        try:
            pending[info.rank] = cluster.client[info.engine_id].apply_async(fn, *args)
        except Exception as exc:  # the engine is gone (unregistered)
            answers[info.rank] = (False, f"engine {info.engine_id} unreachable ({exc}); "
                                         f"%hvd_restart brings it back")
    deadline = time.monotonic() + timeout
    for rank, ar in pending.items():
        try:
            answers[rank] = (True, str(ar.get(max(0.0, deadline - time.monotonic())) or ""))
        except TimeoutError:
            missing.append(rank)
        except Exception as exc:  # a RemoteError carries the engine's exception
            answers[rank] = (False, f"{getattr(exc, 'ename', None) or type(exc).__name__}: "
                                    f"{getattr(exc, 'evalue', None) or exc}")
    return answers, missing


def open_dashboard(cluster, show: bool = True) -> Dashboard | None:
    """Start a dashboard for ``cluster``; a failure is printed, never raised (the cluster is
    usable without it)."""
    dash = Dashboard(cluster)
    try:
        notes = dash.start(show)
    except Exception as exc:
        print(f"hvd: the dashboard did not start ({type(exc).__name__}: {exc}); the cluster "
              f"works without it. Fix: pip install ipywidgets pyzmq, then %hvd_dashboard")
        dash.close(engines_alive=False, message="")
        return None
    for note in notes:
        print(f"hvd: {note}")
    return dash
