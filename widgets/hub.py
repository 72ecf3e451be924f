"""Driver side of the dashboard: the metrics receiver and the one updater thread.

:class:`MetricsHub` owns a ZMQ PULL socket that every engine's publisher connects to, and ONE
daemon thread that (a) drains snapshots into the :class:`~.model.DashboardModel` and (b) calls
each sink's ``update(model, now)`` at most ``max_hz`` times a second: a burst of snapshots
becomes one render, so does a round of snapshots from every rank (``gather_s``), and with
nothing new it still refreshes once a second (ages, "no data for N s"). Past that cap, a cell's
end adds one render of every rank's state at that end (:meth:`MetricsHub.sync_view`). The
thread sleeps in ``zmq.Poller.poll`` with a timeout computed from the throttle; it never
spins. Calls from other threads (:meth:`MetricsHub.mark_dead`, :meth:`~MetricsHub.notify`,
:meth:`~MetricsHub.stop`) wake it through an inproc socket.

Why a socket of our own rather than ipyparallel's ``publish_data``: docs/pages/internals.md,
"The dashboard's channels".

Commands (the dashboard's buttons) go the other way on a PUB socket to every publisher, and
their answers come back inside snapshots (:mod:`.control`); ``on_done`` runs on this thread.
A snapshot is rendered, and its answers counted, only when it is newer than the last one
accepted from its publisher, and a command names the publishers it is for (Note [Dashboard
frames] in :mod:`.frames`: what a replayed, reordered or reflected frame meets). When to
render is :class:`.pacing.RenderPacer`'s decision.

Wiring, as hvd_magic.dashboard does it (the driver; engines run hvd_magic.engine_dashboard;
:func:`~.startup.start_dashboard` and :func:`~.startup.dashboard_mode` are in :mod:`.startup`)::

    hub = start_dashboard(size=n, key=key, on_stop=stop_all, on_timeline=timeline,
                          on_autotune=autotune)          # displays the view
    hub.command("timeline", on_done=show, start=True, path=p)  # a button, during a cell too
    hub.mark_dead(3, reason="killed by SIGKILL")           # when an engine exits
    hub.stop()                                             # %hvd_stop
"""

import logging
import socket
import threading
import time

from .control import Pending, pack_command
from .frames import RefusalLog, SnapshotOrder
from .model import DashboardModel
from .pacing import RenderPacer
from .snapshot import MAX_FRAME_BYTES, unpack
from .view_syncs import ViewSyncs

log = logging.getLogger("hvd_magic.widgets")


class MetricsHub:
    """Receive engine snapshots and drive the dashboard's sinks from one thread.

    Parameters
    ----------
    model : DashboardModel, optional
        Created with defaults when omitted.
    sinks : sequence, optional
        Objects with ``update(model, now)`` (the widget view, the text status).
    key : bytes or str, optional
        The job's metrics key; unsigned or wrongly signed frames are dropped and counted.
    bind : str
        ``tcp://<interface>`` to listen on (a random port is chosen). Loopback by default; for
        engines on other hosts bind the interface they reach the driver through.
    connect_host : str, optional
        Host put in :attr:`address` when ``bind`` is a wildcard (``0.0.0.0``).
    max_hz : float
        Upper bound on renders per second (default 5), but for :meth:`sync_view`'s.
    refresh_s : float
        Render at least this often while running, even without new snapshots.
    gather_s : float
        After a snapshot, wait up to this long for the other publishing ranks' next ones, so
        one render covers a round of snapshots (0: render each as soon as the throttle allows).
    clock : callable
        Driver clock (``time.monotonic``); tests may pass their own.

    Attributes
    ----------
    address : str
        What publishers connect to, valid after :meth:`start`.
    command_address : str
        Where publishers listen for commands (:meth:`command`), valid after :meth:`start`.
    received, rejected, stale, renders, view_syncs : int
        Counters for diagnostics and tests: snapshots accepted, frames that failed their tag
        or schema, snapshots refused as replayed, out of order or from a retired publisher
        (Note [Dashboard frames] in :mod:`.frames`), renders, and those of them that
        :meth:`sync_view` asked for (past the throttle).
    """

    def __init__(self, model=None, sinks=(), key=None, bind="tcp://127.0.0.1",
                 connect_host=None, max_hz=5.0, refresh_s=1.0, gather_s=0.25,
                 clock=time.monotonic):
        self.model = model if model is not None else DashboardModel()
        self.key = key.encode() if isinstance(key, str) else key
        self.bind = bind
        self.connect_host = connect_host
        self.pacer = RenderPacer(max_hz, refresh_s, gather_s)
        self.clock = clock
        self.address = self.command_address = None
        self.view = None  # set by start_dashboard
        self.received = self.rejected = self.stale = self.renders = 0
        self._sinks = list(sinks)
        self._sinks_lock = threading.Lock()
        self._wake_lock = threading.Lock()
        self._ctx = self._wake = self._thread = None
        self._stopping = False
        self._ready = threading.Event()
        self._error = None
        self._warned = set()
        self._commands_lock = threading.Lock()
        self._outbox = []  # (id, name, args, timeout_s, on_done, sync), sent by the hub thread
        self._next_id = 1
        self._pending = Pending(clock)
        self._syncs = ViewSyncs()  # hub thread: sync_view's callers, the publishers it skips
        self._arrived = threading.Condition()  # notified after snapshots were ingested
        self._order = SnapshotOrder()  # hub thread only
        self._refusals = RefusalLog(log, "dashboard hub", clock)

    # ---------------------------------------------------------------- control (any thread)
    def start(self, timeout=10.0):
        """Bind the socket and start the thread; returns :attr:`address`."""
        import zmq
        if self._thread is not None:
            return self.address
        self._ctx = zmq.Context()
        inproc = f"inproc://hvd-hub-{id(self)}"
        wake_in = self._ctx.socket(zmq.PULL)
        wake_in.bind(inproc)
        self._wake = self._ctx.socket(zmq.PUSH)
        self._wake.setsockopt(zmq.LINGER, 0)
        self._wake.connect(inproc)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, args=(wake_in,), daemon=True,
                                        name="hvd-dashboard-hub")
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            self.stop()
            raise RuntimeError(f"dashboard hub: could not listen on {self.bind}: {self._error}")
        return self.address

    def stop(self, timeout=5.0):
        """Stop the thread, close the sockets; safe to call twice."""
        if self._thread is None:
            return
        self._stopping = True
        self.notify()
        self._thread.join(timeout)
        with self._wake_lock:
            self._wake.close(0)
            self._wake = None
        if self._thread.is_alive():  # a sink is stuck; term() would block on its open socket
            log.warning("dashboard hub: updater thread did not stop within %.1f s", timeout)
        else:
            self._ctx.term()
        self._thread = self._ctx = None
        self._ready.clear()

    @property
    def running(self):
        return self._thread is not None and self._thread.is_alive()

    def notify(self):
        """Ask for a render soon (after a driver-side model change); never blocks."""
        import zmq
        with self._wake_lock:
            if self._wake is not None:
                try:
                    self._wake.send(b"", zmq.NOBLOCK)
                except zmq.Again:
                    pass  # a wake-up is already queued

    def add_sink(self, sink):
        with self._sinks_lock:
            self._sinks.append(sink)

    def remove_sink(self, sink):
        with self._sinks_lock:
            self._sinks.remove(sink)

    def mark_dead(self, rank, exit_code=None, signal=None, reason=None):
        """Show ``rank`` as dead (its engine exited with ``exit_code`` or ``signal``, or as
        ``reason`` says)."""
        self.model.mark_dead(rank, exit_code=exit_code, signal=signal, reason=reason)
        self.notify()

    def forget(self, ranks=None):
        """Drop ranks (all by default), e.g. before ``%hvd_restart`` re-registers engines."""
        self.model.forget(ranks)
        self.notify()

    def command(self, name, on_done=None, timeout_s=5.0, **args):
        """Send a command to every engine's publisher (protocol in :mod:`.control`).

        Returns at once with the command's id. On the hub thread, once every rank that was
        alive when it was sent answered, or after ``timeout_s``, ``on_done(answers, missing)``
        is called with ``answers = {rank: (ok, text)}`` and the ranks that did not answer.
        """
        return self._queue(name, args, timeout_s, on_done, sync=False)

    def sync_view(self, timeout_s=0.5):
        """Have every live rank send a snapshot now and render them at once, past the
        throttle; True once rendered with every rank waited for answering, False when one did
        not within ``timeout_s`` (it shows what it last sent) or the hub is not running.

        ``%%hvd`` calls it when a cell ends: the periodic snapshots (every 0.3 s) miss the end
        of a short cell, and a frontend that keeps only what a cell sent while it ran (nbclient,
        papermill: the notebook saved with its widgets) would keep a dashboard from before it.
        Dead and starting ranks are not waited for, nor, until they answer a command again,
        publishers that missed a call: one broken publisher costs one ``timeout_s``, not one
        per cell (a restarted engine's new publisher is waited for).
        """
        if not self.running or self._stopping:
            return False
        rendered, missing = threading.Event(), []

        def answered(_answers, not_answered):  # hub thread: the last answer is ingested next
            missing.extend(not_answered)
            self._syncs.answered([self._order.publisher(r) for r in not_answered], rendered.set)
            self.pacer.wake(at_once=True)

        self._queue("snapshot", {}, timeout_s, answered, sync=True)
        return rendered.wait(timeout_s + 0.25) and not missing  # (+ a late answer's render)

    @property
    def sync_skipped(self):
        """Publisher ids :meth:`sync_view` skips: they missed one and answered nothing since."""
        return self._syncs.skipped

    @property
    def view_syncs(self):
        """Renders :meth:`sync_view` asked for (counted before the sinks run)."""
        return self._syncs.count

    def _queue(self, name, args, timeout_s, on_done, sync):
        with self._commands_lock:
            cmd_id = self._next_id
            self._next_id += 1
            self._outbox.append((cmd_id, name, args, timeout_s, on_done, sync))
        self.notify()
        return cmd_id

    def wait_for_ranks(self, ranks, timeout):
        """Block until every rank in ``ranks`` sent a snapshot (or ``timeout`` s); True if so."""
        wanted, deadline = set(ranks), time.monotonic() + timeout
        with self._arrived:
            while not wanted <= {r.rank for r in self.model.rows(self.clock()) if r.pid}:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._arrived.wait(left)
        return True

    def ingest(self, rank, snapshot):
        """Feed a snapshot that did not come through the socket (e.g. pulled by ``%hvd_status``)."""
        self.model.ingest(rank, snapshot, self.clock())
        self.notify()

    # ---------------------------------------------------------------- the one thread
    def _run(self, wake_in):
        import zmq
        pull = self._ctx.socket(zmq.PULL)
        pub = self._ctx.socket(zmq.PUB)
        try:
            pull.setsockopt(zmq.LINGER, 0)
            pull.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
            pull.setsockopt(zmq.RCVHWM, 1000)
            pub.setsockopt(zmq.LINGER, 0)
            port = pull.bind_to_random_port(self.bind)
            cmd_port = pub.bind_to_random_port(self.bind)
            host = self.bind.rpartition("//")[2]
            if host in ("*", "0.0.0.0", "::", "[::]"):
                host = self.connect_host or socket.gethostname()
            self.address = f"tcp://{host}:{port}"
            self.command_address = f"tcp://{host}:{cmd_port}"
        except zmq.ZMQError as exc:
            self._error = exc
            for sock in (pull, pub, wake_in):
                sock.close(0)
            self._ready.set()
            return
        self._pub = pub
        self._ready.set()
        poller = zmq.Poller()
        poller.register(pull, zmq.POLLIN)
        poller.register(wake_in, zmq.POLLIN)
        try:
            self._loop(poller, pull, wake_in, zmq)
        finally:
            self._pending.expire(float("inf"))  # nobody will answer now: report them missing
            for tell in self._syncs.take_waiting():  # (no render comes: callers go on)
                tell()
            for sock in (pull, pub, wake_in):
                sock.close(0)

    def _loop(self, poller, pull, wake_in, zmq):
        """Drain → ingest → render when the pacer says so; sleep until its next due time, a
        command's deadline, a frame or a wake-up (dead rank, command, driver change)."""
        pacer = self.pacer
        while not self._stopping:
            now = self.clock()
            due = pacer.due(now)
            due = min(due, self._pending.next_deadline() or due)
            ready = dict(poller.poll(max(0, int((due - now) * 1000) + 1)))
            if wake_in in ready:
                _drain(wake_in, zmq)
                self._send_commands()
                pacer.wake()
            if pull in ready:
                self._receive(pull, zmq)
            if self._stopping:
                break
            now = self.clock()
            if self._pending:
                self._pending.expire(now)
            if pacer.render_due(now):
                self._render(now)

    def _receive(self, pull, zmq, limit=10000):
        got = False
        for _ in range(limit):
            try:
                frame = pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                snap = unpack(frame, self.key)
            except ValueError as exc:
                self.rejected += 1
                self._refusals.refused("bad", str(exc))
                continue
            refusal = self._order.admit(snap)  # Note [Dashboard frames]
            if refusal is not None:
                self.stale += 1
                kind, why = refusal
                self._refusals.refused(kind, why, logging.INFO if kind == "retired" else
                                       logging.WARNING)
                continue
            self.received += 1
            if snap.get("acks"):
                self._pending.ack(snap["rank"], snap["acks"])
                self._syncs.heard_from(snap.get("pub"))
            now = self.clock()
            self.model.ingest(snap["rank"], snap, now)
            self.pacer.arrived(snap["rank"], now)
            got = True
        if got:
            with self._arrived:
                self._arrived.notify_all()
        return got

    def _send_commands(self):
        """Publish queued commands; each waits for the ranks alive now (hub thread only)."""
        with self._commands_lock:
            outbox, self._outbox = self._outbox, []
        if not outbox:
            return
        rows = self.model.rows(self.clock())
        alive = [r.rank for r in rows if r.state not in ("dead", "starting")]
        to = self._order.publishers(alive)  # a rank whose publisher is unknown: missing
        for cmd_id, name, args, timeout_s, on_done, sync in outbox:
            self._pub.send(pack_command(cmd_id, name, args, self.key, to=to))
            waited = self._syncs.waited(alive, self._order.publisher) if sync else alive
            self._pending.sent(cmd_id, waited, timeout_s, on_done)

    def _render(self, now):
        done = self._syncs.take_waiting()  # (counted before the sinks: they may read it)
        with self._sinks_lock:
            sinks = list(self._sinks)
        for sink in sinks:
            try:
                sink.update(self.model, now)
            except Exception as exc:  # a broken sink must not stop the others or the thread
                self._warn_once(type(sink).__name__, f"dashboard sink {sink!r} failed: {exc!r}")
        self.renders += 1
        for tell in done:
            tell()

    def _warn_once(self, what, text):
        if what not in self._warned:
            self._warned.add(what)
            log.warning(text)
        else:
            log.debug(text)


def _drain(sock, zmq):
    while True:
        try:
            sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
