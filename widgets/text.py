"""The dashboard as compact text, for terminals, CI logs and ``%hvd_status``.

:func:`render` turns the model into a few lines; :class:`TextStatus` is a hub sink that prints
them only when something worth a line changed (a rank's state) or, while ranks are busy, at a
slow heartbeat, so a log is not flooded at the hub's 5 Hz.
"""

import sys

from . import fmt


def render(model, now, max_ranks=16):
    """The dashboard as text.

    Parameters
    ----------
    model : DashboardModel
    now : float
        Driver ``time.monotonic()``.
    max_ranks : int
        Idle ranks beyond this many are summarised in one line; busy ones are always listed.

    Returns
    -------
    str

    Examples
    --------
    ::

        hvd: 4 ranks (3 running, 1 stalled) · 1.23k samples/s · spread 4% · fusion 8.1 · compute 80%
          r0 node1 pid 4242 GPU 0 H100 3.2 GiB 87% NCCL running cell train() · 310 samples/s
          r3 node1 pid 4250 GPU 3 H100 3.1 GiB 0% NCCL stalled in allreduce 'grad.w' for 63 s
          r4 node1 pid 4251 cpu idle
        autotune: bayes sample 7/20 · best fusion_threshold=64.0 MiB (score 1.2 GB/s)
    """
    rows, cl, at = model.rows(now), model.cluster(now), model.autotune()
    counts = ", ".join(f"{n} {state}" for state, n in sorted(cl.counts.items()))
    head = f"hvd: {cl.ranks} ranks ({counts}) · {fmt.rate(cl.total_rate, cl.unit)}"
    if cl.spread is not None and len(rows) > 1:
        head += f" · spread {fmt.pct(cl.spread)} (slowest r{cl.slowest[0]})"
    if cl.fusion is not None:
        head += f" · fusion {cl.fusion:.1f}"
    if cl.split and "compute" in cl.split:  # only while cells run (see model.cluster)
        head += f" · compute {fmt.pct(cl.split['compute'])} wait {fmt.pct(cl.split['wait'])}"
    if cl.straggler is not None:
        head += f" · straggler r{cl.straggler}"
    lines = [head]
    shown = [r for r in rows if r.state not in ("idle", "running") or r.stale_s or r.last_error]
    others = [r for r in rows if r not in shown]
    shown += others[:max(0, max_ranks - len(shown))]
    for r in sorted(shown, key=lambda r: r.rank):
        lines.append("  " + row_text(r))
    if len(shown) < len(rows):
        lines.append(f"  ... {len(rows) - len(shown)} more ranks idle or running")
    if cl.world:
        lines.append("world: " + world_text(cl.world))
    if at is not None:
        lines.append("autotune: " + autotune_text(at))
    return "\n".join(lines)


def world_text(changes):
    """Elastic re-formings as a line: ``generation 3: 4 -> 3 ranks, rank 2 (pid 4250) left:
    killed by SIGKILL``."""
    parts = []
    for w in changes:
        text = f"generation {w.generation}: {w.size_before} -> {w.size} ranks"
        if w.left:
            text += ", " + ", ".join(f"rank {r} (pid {pid}) left: {why}" for r, pid, why in w.left)
        parts.append(text)
    return "; ".join(parts)


def row_text(r):
    """One rank as a line."""
    device = fmt.gpu_label(r)
    if r.device.startswith("cuda"):
        util = f" {r.gpu_util:.0f}%" if r.gpu_util is not None else ""
        device += f" {fmt.mem(r.gpu_mem_used)}{util} {fmt.gpu_path(r.gpu_path)}"
    text = f"r{r.rank} {r.host or '?'} pid {r.pid if r.pid is not None else '?'} {device} {r.detail}"
    if r.rate is not None:
        text += f" · {fmt.rate(r.rate, r.unit)}"
    if r.pipeline is not None:
        text += f" · pipeline {fmt.bubble(r.pipeline)}"
    if r.stale_s is not None:
        text += f" · no data for {r.stale_s:.0f} s"
    if r.last_error:
        text += f" · last error: {r.last_error.splitlines()[0][:120]}"
    return text


def autotune_text(at):
    """The autotune panel as a line."""
    if not at.enabled:
        return "off"
    progress = f"sample {at.sample}/{at.samples}" if at.sample is not None else ""
    text = f"{at.phase} {progress}".strip()
    text += f" · current {fmt.params(at.current)}"
    if at.scores or at.best_score:  # nothing scored yet (warm-up): no "best" to show
        text += f" · best {fmt.params(at.best)}"
        if at.best_score is not None:
            text += f" (score {fmt.si(at.best_score, 'B/s')})"
    return text


class TextStatus:
    """Hub sink that prints :func:`render` output to a stream.

    Parameters
    ----------
    stream : file-like, optional
        Defaults to ``sys.stdout`` at print time (so a kernel's redirected stdout is used).
    heartbeat_s : float
        While any rank is running or in a collective, print at most this often even when no
        state changed; an all-idle cluster prints only on state changes.
    """

    def __init__(self, stream=None, heartbeat_s=30.0):
        self.stream = stream
        self.heartbeat_s = heartbeat_s
        self._last_key = None
        self._last_at = None
        self.printed = 0

    def update(self, model, now):
        """Print when the set of rank states changed, or on the heartbeat while busy."""
        rows = model.rows(now)
        key = tuple((r.rank, r.state, r.stale_s is not None, r.last_error) for r in rows)
        busy = any(r.state not in ("idle", "dead", "starting") for r in rows)
        due = busy and self._last_at is not None and now - self._last_at >= self.heartbeat_s
        if key == self._last_key and not due:
            return
        self._last_key, self._last_at = key, now
        print(render(model, now), file=self.stream or sys.stdout, flush=True)
        self.printed += 1
