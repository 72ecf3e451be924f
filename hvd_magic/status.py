"""Cluster status: a plain snapshot (:class:`ClusterStatus`), its text form, and the hooks.

:func:`show_status` is the single place the magics show a cluster's state (``%hvd_start``,
``%hvd_status``, "already running"). By default it prints text; a richer view (the dashboard
in ``hvd_magic.widgets``) plugs in with :func:`register_status_renderer`, and follows the
cluster's life through :func:`add_listener` (events ``started``, ``restarted``, ``stopped``,
``cell_start``, ``cell_end``, each with the HvdCluster; cell events also carry the CellRun).
Driver side, main thread.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from . import engine_side

QUERY_TIMEOUT = 2.0


@dataclass
class RankStatus:
    rank: int
    engine_id: int
    host: str
    pid: int
    local_rank: int
    device: str
    core: str        # "engine_native.torch ready", "not initialised", "n/a: <why>"
    state: str       # "idle", "busy", "dead: killed by SIGKILL"


@dataclass
class ClusterStatus:
    launcher: str
    n: int
    cluster_id: str
    ready_seconds: float | None
    started_at: float | None
    ranks: list[RankStatus] = field(default_factory=list)
    elastic: list[str] = field(default_factory=list)  # generation and ranks that left

    def as_dict(self) -> dict:
        return asdict(self)


def collect(cluster, live: bool = True) -> ClusterStatus:
    """Snapshot of ``cluster``; with ``live`` the idle ranks are asked for their core state."""
    dead = cluster.dead_ranks()
    busy = set(cluster.busy_ranks())
    cores: dict[int, dict] = {}
    idle = [r.rank for r in cluster.ranks if r.rank not in dead and r.rank not in busy]
    if live and idle and any(r.core for r in cluster.ranks):
        try:
            cores = dict(zip(idle, cluster.view(idle).apply_async(engine_side.core_state)
                             .get(QUERY_TIMEOUT)))
        except Exception:
            cores = {}
    rows = []
    for r in cluster.ranks:
        device = r.device + (f" ({r.device_name})" if r.device_name else "")
        state = f"dead: {dead[r.rank]}" if r.rank in dead else "busy" if r.rank in busy else "idle"
        rows.append(RankStatus(r.rank, r.engine_id, r.host, r.pid, r.local_rank, device,
                               _core_text(r, cores.get(r.rank)), state))
    return ClusterStatus(cluster.launcher, cluster.n, cluster.ipp.cluster_id if cluster.ipp
                         else "", cluster.ready_seconds, cluster.started_at, rows,
                         _elastic_lines(cluster.elastic))


def _elastic_lines(ew) -> list[str]:
    """An elastic cluster's generation and the ranks that left it (latest 5)."""
    if ew is None:
        return []
    lines = [f"elastic: generation {ew.generation}, --min-np {ew.min_np}"]
    lines += [f"left at generation {d.generation}: rank {d.rank} (pid {d.pid} on {d.host}), "
              f"{d.why}" for d in ew.departed[-5:]]
    return lines


def _core_text(info, state: dict | None) -> str:
    if not info.core:
        return f"n/a: {info.core_error}" if info.core_error else "n/a"
    if state is None:
        return f"{info.core}"
    if state.get("error"):
        return f"{info.core}: {state['error']}"
    if not state.get("initialized"):
        return f"{info.core}: not initialised"
    pending = state.get("pending") or []
    cpus = state.get("cpu_binding")  # HVD_CPU_BIND: auto binds ranks that outnumber the CPUs
    return (f"{info.core} ready" + (f", bound to CPUs {cpus}" if cpus else "") +
            (f", {len(pending)} pending" if pending else ""))


def format_status(status: ClusterStatus) -> str:
    """The text form: a header line and one row per rank."""
    head = f"hvd cluster: {len(status.ranks)} ranks, {status.launcher} launcher"
    if status.cluster_id:
        head += f", cluster {status.cluster_id}"
    if status.ready_seconds is not None:
        head += f", ready in {status.ready_seconds:.1f} s"
    if status.started_at:
        head += f", up {_ago(time.time() - status.started_at)}"
    cols = ("rank", "engine", "host", "pid", "device", "core", "state")
    rows = [[str(r.rank), str(r.engine_id), r.host, str(r.pid), r.device, r.core, r.state]
            for r in status.ranks]
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c)
              for i, c in enumerate(cols)]
    lines = [head, "  " + "  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines + status.elastic)


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


_renderers: list = []


def register_status_renderer(renderer) -> None:
    """Show cluster status with ``renderer(status: ClusterStatus)`` instead of text.

    The newest renderer is tried first; it returns False to fall back to the next one (and
    finally to text). The dashboard registers itself here.
    """
    if renderer not in _renderers:
        _renderers.append(renderer)


def unregister_status_renderer(renderer) -> None:
    if renderer in _renderers:
        _renderers.remove(renderer)


def show_status(status: ClusterStatus) -> None:
    """Show ``status``: through the newest registered renderer, else as text."""
    for renderer in reversed(_renderers):
        try:
            if renderer(status) is not False:
                return
        except Exception as exc:  # a broken view must not hide the status
            print(f"hvd: status renderer {renderer!r} failed: {exc}")
    print(format_status(status))


_listeners: list = []


def add_listener(listener) -> None:
    """Call ``listener(event: str, cluster, **details)`` on cluster and cell events.

    Events: ``started`` / ``restarted`` (ranks set up; e.g. start engine-side publishers),
    ``stopped``, ``cell_start`` / ``cell_end`` (``run=`` the CellRun; after ``cell_end``
    ``cluster.dead_ranks()`` tells which engines died). A failing listener is reported and
    never breaks a magic.
    """
    if listener not in _listeners:
        _listeners.append(listener)


def remove_listener(listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def emit(event: str, cluster, **details) -> None:
    for listener in list(_listeners):
        try:
            listener(event, cluster, **details)
        except Exception as exc:
            print(f"hvd: listener {listener!r} failed on {event}: {exc}")
