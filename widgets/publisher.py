"""Engine side of the dashboard: the metrics publisher thread.

Runs inside every engine (rank). :class:`Publisher` is one daemon thread that every
``interval_s`` builds a snapshot (schema in :mod:`.snapshot`) from the core's metrics, the
progress the training code reported (``hvd.report(samples=64, loss=0.3)``, kept by
``engine_native.progress``), the last pipeline step's forwards and backwards (kept by
``engine_native.pipeline.last_step``) and this process's identity and device (described by
:mod:`.device_info`), signs it and sends it to the driver's hub.

Channel: a ZMQ PUSH socket per engine, connected to the hub's PULL socket (address and key
passed by the magic; why not ipyparallel's ``publish_data``: docs/pages/internals.md). It never
blocks (``IMMEDIATE`` + ``NOBLOCK`` + a small high-water mark: with no hub, snapshots are dropped
and counted); the thread runs on while the main thread waits in the core, which is exactly when
"rank 3 is stuck in allreduce" must show.

The same thread runs the dashboard's commands (the timeline and autotune buttons, the snapshot a
cell's end asks for) arriving on a SUB socket from the hub, so they act while a cell keeps the
engine's main thread busy; answers ride in the next snapshots (protocol in :mod:`.control`).
Every publisher draws a fresh id (:attr:`Publisher.pub_id`) that its snapshots carry and the
hub's commands name, so a command recorded for an earlier publisher (before ``%hvd_restart``)
is refused by a later one, and a replayed or reordered one by the same one (Note [Dashboard
frames] in :mod:`.frames`).

Example (what ``%hvd_start`` runs on every engine, after the core is initialised; see
hvd_magic.engine_dashboard)::

    from hvd_magic.widgets.publisher import start_publisher
    import engine_native.basics as basics
    start_publisher("tcp://10.0.0.1:53411", rank=basics.rank(), key=key,
                    metrics=basics.metrics, device="cuda:0",
                    command_address="tcp://10.0.0.1:53412", handlers={"timeline": fn})
"""

import atexit
import logging
import os
import secrets
import socket
import sys
import threading
import time

from .control import MAX_COMMAND_BYTES, unpack_command
from .device_info import device_info
from .frames import RefusalLog
from .snapshot import MAX_BAR_S, MAX_EVENTS, MERGE_GAP_S, SCHEMA_VERSION, normalize_core, pack

log = logging.getLogger("hvd_magic.widgets")

_lock = threading.Lock()
_cell = None  # label set explicitly by the magics; overrides the IPython hooks
_hook_cell = None  # set by the IPython hooks: "" while a cell runs, its first line when known
_publisher = None


def set_cell(label):
    """Mark this engine busy with a cell (``label``) or idle (``None``); used by the magics
    when cells run through ``apply`` rather than ``execute`` (which the IPython hooks see)."""
    global _cell
    with _lock:
        _cell = label


def _reported():
    """(samples, extra, cell label or None when idle). Progress comes from
    ``engine_native.progress`` (``hvd.report``) when this process imported it; this thread
    never imports the core itself."""
    progress = sys.modules.get("engine_native.progress")
    samples, extra = progress.totals() if progress is not None else (0, {})
    with _lock:
        label = _cell if _cell is not None else _hook_cell
    return samples, extra, label


def _pipeline_step():
    """This rank's last pipeline training step (``engine_native.pipeline.last_step``), or
    None: the module is read only when a step imported it, as ``_reported`` reads progress."""
    last_step = sys.modules.get("engine_native.pipeline.last_step")
    return last_step.latest() if last_step is not None else None


def _on_pre_execute():
    """Every executed cell, silent ones included (ipyparallel runs ``execute`` silently)."""
    global _hook_cell
    with _lock:
        _hook_cell = ""


def _on_pre_run_cell(info=None):
    """Non-silent cells only (a kernel running the cell itself): label it by its first line."""
    global _hook_cell
    raw = getattr(info, "raw_cell", "") or ""
    lines = [ln.strip() for ln in raw.splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    with _lock:
        _hook_cell = lines[0][:40] if lines else ""


def _on_post_execute():
    global _hook_cell
    with _lock:
        _hook_cell = None


_HOOKS = (("pre_execute", _on_pre_execute), ("pre_run_cell", _on_pre_run_cell),
          ("post_execute", _on_post_execute))


def _events(raw_events, gap=MERGE_GAP_S, longest=MAX_BAR_S):
    """Events from the core (``[op, name, start_ago_s, dur_s]``, oldest first; dicts accepted
    too) as the snapshot's ``events``: back-to-back collectives of one op (less than ``gap``
    seconds apart, together at most ``longest`` long) become one ``[op, first name,
    start_ago_s, dur_s, count, busy_s]`` entry, so a training loop's hundreds of allreduces a
    second cost a few entries per snapshot to build, send and merge (the strip cannot show
    them apart: a pixel is ~9 ms)."""
    out, last, last_op = [], None, None
    for ev in raw_events or ():
        if isinstance(ev, dict):
            ev = (ev.get("op"), ev.get("name"), ev.get("start_ago_s"), ev.get("dur_s"))
        if len(ev) != 4:
            continue
        op, ago, dur = ev[0], float(ev[2]), float(ev[3])
        # start = -ago; the entry spans [-last[2], -last[2] + last[3]]
        if (op == last_op and last[2] >= ago >= last[2] - last[3] - gap
                and last[2] - ago + dur <= longest):
            last[3] = max(last[3], last[2] - ago + dur)
            last[4] += 1
            last[5] += dur
        else:
            last, last_op = [str(op).lower(), str(ev[1]), ago, dur, 1, dur], op
            out.append(last)
    return [e[:4] if e[4] == 1 else e for e in out[-MAX_EVENTS:]]


class Publisher:
    """Daemon thread sending this rank's snapshot to the hub every ``interval_s``.

    Parameters
    ----------
    address : str
        The hub's ZMQ address, e.g. ``"tcp://127.0.0.1:53411"`` (``MetricsHub.address``).
    rank : int
        This engine's global rank.
    key : bytes or str, optional
        The job's metrics key (same as the hub's); frames are HMAC-signed with it.
    metrics : callable, optional
        Returns the core's metrics dict (``engine_native.basics.metrics``); may raise before
        the core is initialised, in which case the snapshot carries no ``core`` field.
    events : callable, optional
        Returns collectives finished since its previous call (``[op, name, start_ago_s,
        dur_s]``); when absent, an ``events`` list inside the metrics dict is used.
    device : str or dict, optional
        ``"cpu"`` or ``"cuda:k"`` as pinned by the magic (or a dict, see
        :func:`.device_info.device_info`); else the core's ``device`` entry.
    gpu : callable, optional
        This rank's GPU with live numbers (:class:`.gpu_stats.GpuStats`); ``{}`` on a CPU rank,
        which then falls back to ``device``.
    interval_s : float
        Seconds between snapshots.
    command_address : str, optional
        The hub's command socket (``MetricsHub.command_address``); commands arriving there
        run on this thread (protocol in :mod:`.control`).
    handlers : dict, optional
        ``{name: callable(**args) -> str}`` for those commands; an exception is the answer
        ``ok=False`` with its text.

    Attributes
    ----------
    pub_id : str
        Drawn at random for this publisher; its snapshots carry it as ``pub``, and it runs
        only commands whose ``to`` names it.
    commands_run, commands_refused : int
        Commands run, and commands refused (Note [Dashboard frames] in :mod:`.frames`).
    """

    ACK_REPEATS = 3  # snapshots that carry each answer

    def __init__(self, address, rank, key=None, metrics=None, events=None, device=None,
                 interval_s=0.3, hwm=16, command_address=None, handlers=None, gpu=None):
        self.address = address
        self.rank = int(rank)
        self.key = key.encode() if isinstance(key, str) else key
        self.metrics = metrics
        self.events = events
        self.device = device
        self.gpu = gpu
        self.interval_s = interval_s
        self.hwm = hwm
        self.command_address = command_address
        self.handlers = dict(handlers or {})
        self.pub_id = secrets.token_hex(8)
        self.commands_run = self.commands_refused = 0
        self._refusals = RefusalLog(log, f"rank {self.rank} metrics publisher", time.monotonic)
        self.busy_s = 0.0  # thread CPU time spent building and sending snapshots
        self._last_command = -1
        self._acks = []  # [[id, ok, text], repeats left]
        self.sent = self.dropped = 0  # snapshots sent, and dropped (no hub, or its queue full)
        self._seq = 0
        self._host = socket.gethostname()
        self._stop = threading.Event()
        self._wake = None  # (read, write) pipe: stop() ends a wait on the command socket at once
        self._thread = None
        self._warned = False

    @property
    def running(self):
        return self._thread is not None and self._thread.is_alive()

    def snapshot(self):
        """Build one snapshot now (also usable without the thread, e.g. from ``%hvd_status``)."""
        samples, extra, cell = _reported()
        snap = {"v": SCHEMA_VERSION, "rank": self.rank, "t": time.time(), "seq": self._seq,
                "pub": self.pub_id, "host": self._host, "pid": os.getpid(),
                "busy": cell is not None, "cell": cell or "", "samples": samples, "extra": extra}
        self._seq += 1
        raw = None
        if self.metrics is not None:
            try:
                raw = self.metrics()
            except Exception as exc:  # core not initialised yet, or shut down
                self._warn_once(f"metrics() failed: {exc}")
        if isinstance(raw, dict):
            snap["core"] = normalize_core(raw)
        snap["device"] = device_info(self.device, raw, self.gpu)
        try:
            snap["events"] = _events(self.events() if self.events else (raw or {}).get("events"))
        except Exception as exc:
            self._warn_once(f"events() failed: {exc}")
        pipeline = _pipeline_step()
        if pipeline is not None:
            snap["pipeline"] = pipeline
        if self._acks:
            snap["acks"] = [ack for ack, _ in self._acks]
            self._acks = [[ack, n - 1] for ack, n in self._acks if n > 1]
        return snap

    def _warn_once(self, text):
        if not self._warned:
            self._warned = True
            log.debug("rank %d metrics publisher: %s", self.rank, text)

    def start(self):
        """Start the thread (idempotent)."""
        if self.running:
            return self
        self._stop.clear()
        self._wake = os.pipe()
        self._thread = threading.Thread(target=self._run, args=(self._wake[0],),
                                        name=f"hvd-metrics-r{self.rank}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout=2.0):
        """Stop the thread and close its socket; returns within about ``timeout`` seconds."""
        self._stop.set()
        if self._wake is not None:
            try:
                os.write(self._wake[1], b"x")
            except OSError:  # the thread ended already and closed the pipe's other end
                pass
            os.close(self._wake[1])
            self._wake = None
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():  # else still running: start() adds no second one
                self._thread = None

    def _run(self, wake):  # the thread; wake: the pipe's read end stop() writes to, closed here
        ctx = sock = cmd = poller = None
        try:
            import zmq
            ctx = zmq.Context()
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, self.hwm)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing while the hub is not connected
            sock.connect(self.address)
            if self.command_address:
                cmd = ctx.socket(zmq.SUB)
                cmd.setsockopt(zmq.LINGER, 0)
                cmd.setsockopt(zmq.MAXMSGSIZE, MAX_COMMAND_BYTES)
                cmd.setsockopt(zmq.SUBSCRIBE, b"")
                cmd.connect(self.command_address)
                poller = zmq.Poller()
                poller.register(cmd, zmq.POLLIN)
                poller.register(wake, zmq.POLLIN)
            while True:
                self._send(sock, zmq)
                if self._wait(cmd, poller, zmq):
                    break
        except Exception as exc:
            log.warning("rank %d metrics publisher stopped: %s", self.rank, exc)
        finally:
            for socket_ in [x for x in (sock, cmd) if x is not None]:
                socket_.close(0)
            if ctx is not None:
                ctx.term()
            os.close(wake)

    def _wait(self, cmd, poller, zmq):
        """Sleep until the next snapshot is due, running commands that arrive meanwhile (each
        answered at once by an extra snapshot). Returns True when asked to stop."""
        if cmd is None:
            return self._stop.wait(self.interval_s)
        deadline = time.monotonic() + self.interval_s
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if cmd in dict(poller.poll(int(left * 1000) + 1)):  # else woken by stop()
                self._command(cmd.recv(zmq.NOBLOCK))
                return False  # the next snapshot carries the answer
        return True

    def _command(self, frame):
        """Run one command frame from the hub, unless Note [Dashboard frames] (D) refuses it."""
        try:
            cmd_id, name, args, to = unpack_command(frame, self.key)
        except ValueError as exc:
            return self._refuse("bad", str(exc))
        if self.pub_id not in to:  # also what a command sent before the hub heard from us meets
            return self._refuse("to", f"command {cmd_id} ({name!r}) is not addressed to this "
                                      f"publisher (recorded for an earlier one?)", logging.INFO)
        if cmd_id <= self._last_command:
            return self._refuse("order", f"command {cmd_id} ({name!r}) not after command "
                                         f"{self._last_command} (replayed or out of order)")
        self._last_command = cmd_id
        handler = self.handlers.get(name)
        try:
            if handler is None:
                raise NotImplementedError(f"this engine has no handler for {name!r}")
            ok, text = True, str(handler(**args) or "")
        except Exception as exc:  # the answer, not a crash of the publisher
            ok, text = False, f"{type(exc).__name__}: {exc}"
        self.commands_run += 1
        self._acks.append([[cmd_id, ok, text], self.ACK_REPEATS])

    def _refuse(self, kind, reason, level=logging.WARNING):
        self.commands_refused += 1
        self._refusals.refused(kind, reason, level)

    def _send(self, sock, zmq):
        t0 = time.thread_time()
        try:
            self._send_one(sock, zmq)
        finally:
            self.busy_s += time.thread_time() - t0

    def _send_one(self, sock, zmq):
        snap = self.snapshot()
        try:
            frame = pack(snap, self.key)
        except (TypeError, ValueError) as exc:  # a non-JSON value from the core or report()
            self._warn_once(f"snapshot not serialisable ({exc}); sent without core/extra")
            for name in ("core", "extra", "pipeline"):
                snap.pop(name, None)
            frame = pack(snap, self.key)
        try:
            sock.send(frame, zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            self.dropped += 1


def start_publisher(address, rank, key=None, **kwargs):
    """Start this process's publisher, replacing a previous one; hooks IPython's
    ``pre_execute``/``post_execute`` when running in an engine so the dashboard shows "running
    cell" (cells sent through ``apply`` fire no hooks: use :func:`set_cell`). Returns the
    Publisher."""
    global _publisher
    stop_publisher()
    _publisher = Publisher(address, rank, key=key, **kwargs).start()
    shell = _ipython()
    if shell is not None:
        for name, fn in _HOOKS:
            if fn not in shell.events.callbacks[name]:
                shell.events.register(name, fn)
    return _publisher


def stop_publisher():
    """Stop this process's publisher, if any, and unhook IPython's cell events."""
    global _publisher
    if _publisher is not None:
        _publisher.stop()
        _publisher = None
    shell = _ipython()
    if shell is not None:
        for name, fn in _HOOKS:
            if fn in shell.events.callbacks[name]:
                shell.events.unregister(name, fn)


def _ipython():
    """The running IPython shell, without importing IPython into a plain process."""
    ipy = sys.modules.get("IPython")
    return ipy.get_ipython() if ipy is not None else None


atexit.register(stop_publisher)
