"""Rates from monotonic counters, and the one-point-per-second series behind the sparklines.

Owned by :class:`hvd_magic.widgets.model.DashboardModel` (called under its lock). Engines send
cumulative counters (bytes, ops, samples, seconds waiting); a rate is the counter difference
over the engine's own clock between the newest snapshot and the oldest one inside the rate
window, so jitter in delivery to the driver never shows up as throughput noise.
"""

from collections import deque


class CounterHistory:
    """Recent (engine time, counters) points of one rank.

    Parameters
    ----------
    window_s : float
        Rates are averaged over about this many seconds of engine time.
    """

    def __init__(self, window_s=2.0):
        self.window_s = window_s
        self._points = deque()

    def add(self, t, counters):
        """Record counters at engine time ``t``.

        A counter that went down (core re-initialised) or time going backwards restarts the
        history, so no negative or mixed-lifetime rate is ever produced.

        Returns
        -------
        bool
            True when any counter increased since the previous point (progress).
        """
        progressed = False
        if self._points:
            t_prev, prev = self._points[-1]
            if t < t_prev or any(v is not None and (counters.get(k) or 0) < v
                                 for k, v in prev.items()):
                self._points.clear()
            else:
                progressed = any(v is not None and v > (prev.get(k) or 0)
                                 for k, v in counters.items())
        self._points.append((t, dict(counters)))
        while len(self._points) > 2 and self._points[1][0] <= t - self.window_s:
            self._points.popleft()
        return progressed

    def rate(self, name):
        """Per-second rate of one counter over the window; None with fewer than two points or
        when the counter is not reported (None)."""
        if len(self._points) < 2:
            return None
        (t0, c0), (t1, c1) = self._points[0], self._points[-1]
        if t1 <= t0 or c0.get(name) is None or c1.get(name) is None:
            return None
        return (c1[name] - c0[name]) / (t1 - t0)

    def delta(self, name):
        """Increase of one counter over the window (0 with fewer than two points)."""
        if len(self._points) < 2:
            return 0
        return self._points[-1][1].get(name, 0) - self._points[0][1].get(name, 0)

    def latest(self, name, default=0):
        """The newest value of one counter."""
        return self._points[-1][1].get(name, default) if self._points else default


class Series:
    """A value sampled once per ``step_s`` bucket and kept for ``span_s`` (driver time).

    Parameters
    ----------
    span_s : float
        How much history to keep (the sparkline's width: one minute by default).
    step_s : float
        Minimum spacing of points, which caps the point count at ``span_s / step_s``.
    """

    def __init__(self, span_s=60.0, step_s=1.0):
        self.span_s = span_s
        self.step_s = step_s
        self._points = deque()

    def offer(self, now, value):
        """Append ``value`` if it falls in a later bucket than the last point; drop old points."""
        if value is None:
            return
        if not self._points or now // self.step_s > self._points[-1][0] // self.step_s:
            self._points.append((now, float(value)))
        while self._points and self._points[0][0] < now - self.span_s:
            self._points.popleft()

    def values(self):
        """The kept values, oldest first."""
        return [v for _, v in self._points]

    def clear(self):
        self._points.clear()


def fusion_ratio(histories):
    """Tensors per fused batch over the window, summed over ranks (lifetime ratio when nothing
    fused within the window); None before any batch fused."""
    histories = list(histories)
    batches = sum(h.delta("fused_batches") for h in histories)
    tensors = sum(h.delta("fused_tensors") for h in histories)
    if batches <= 0:
        batches = sum(h.latest("fused_batches") for h in histories)
        tensors = sum(h.latest("fused_tensors") for h in histories)
    return tensors / batches if batches > 0 else None


def time_split(histories):
    """Mean fractions of wall time over ranks, for the parts the core reports.

    ``negotiate``, ``communicate`` and ``idle`` are the core's background thread (they overlap
    the framework's compute); ``wait`` is the framework thread blocked in wait(), and when it
    is reported ``compute`` = 1 - wait. None when nothing is reported.
    """
    parts = {"negotiate": [], "communicate": [], "wait": [], "idle": []}
    for h in histories:
        for name, values in parts.items():
            rate = h.rate(name + "_s")
            if rate is not None:
                values.append(min(1.0, max(0.0, rate)))
    out = {name: sum(v) / len(v) for name, v in parts.items() if v}
    if not out:
        return None
    return {"compute": 1.0 - out["wait"], **out} if "wait" in out else out


def straggler(rank_histories, gap=0.1):
    """The rank that waits least while another waits ``gap`` (fraction of wall time) more:
    in synchronous data parallelism everyone else is waiting for it. None otherwise."""
    waits = [(r, h.rate("wait_s")) for r, h in rank_histories]
    waits = [(r, w) for r, w in waits if w is not None]
    if len(waits) < 2:
        return None
    low, high = min(waits, key=lambda x: x[1]), max(waits, key=lambda x: x[1])
    return low[0] if high[1] - low[1] >= gap else None
