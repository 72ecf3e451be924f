"""When the dashboard hub renders: :class:`RenderPacer`, the decision of the hub's one thread
(:mod:`.hub`), kept apart from its sockets so tests drive it alone on a clock of their own."""


class RenderPacer:
    """When the hub renders; on the hub's clock.

    At most once per ``1 / max_hz`` s, but for a render asked for at once. After new
    snapshots: once every rank that sent one within the last second sent one since the last
    render, so the ranks' unsynchronised publishers (N snapshots per interval) make one render
    per interval rather than one per snapshot, but at most ``gather_s`` after the first of
    them. After a wake-up (dead rank, command, driver change): as soon as the throttle allows;
    after one asking for a render at once (a cell's end, :meth:`.hub.MetricsHub.sync_view`):
    now, and the throttle counts from it. With nothing new: every ``refresh_s`` (ages, "no
    data for N s"). Once at the start.
    """

    def __init__(self, max_hz=5.0, refresh_s=1.0, gather_s=0.25):
        self.min_interval_s = 1.0 / max_hz
        self.refresh_s = refresh_s
        self.gather_s = gather_s
        self._dirty = self._urgent = True
        self._since = 0.0  # when the first snapshot since the last render arrived
        self._last_render, self._next_allowed = float("-inf"), 0.0
        self._fresh = set()  # ranks with a snapshot since the last render
        self._arrived_at = {}  # rank -> time of its latest snapshot

    def arrived(self, rank, now):
        """A snapshot of ``rank`` was ingested at ``now``."""
        if not self._dirty:
            self._dirty, self._since = True, now
        self._fresh.add(rank)
        self._arrived_at[rank] = now

    def wake(self, at_once=False):
        """Render as soon as the throttle allows; ``at_once``: now, throttle or not (one
        render a cell's end asks for; the throttle counts from it)."""
        self._dirty = self._urgent = True
        if at_once:
            self._next_allowed = 0.0  # (as at the start: any time)

    def due(self, now):
        """The earliest time :meth:`render_due` may say yes without further news."""
        if not self._dirty:
            return self._last_render + self.refresh_s
        if self._urgent or self._all_fresh(now):
            return self._next_allowed
        return max(self._next_allowed, self._since + self.gather_s)

    def render_due(self, now):
        """True when a render is due at ``now``; the caller renders, and it counts as done."""
        if now < self._next_allowed:
            return False
        if self._dirty:
            if not (self._urgent or now >= self._since + self.gather_s
                    or self._all_fresh(now)):
                return False
        elif now < self._last_render + self.refresh_s:  # (due()'s sum: the same rounding)
            return False
        self._fresh.clear()
        self._dirty = self._urgent = False
        self._last_render, self._next_allowed = now, now + self.min_interval_s
        return True

    def _all_fresh(self, now):
        return all(r in self._fresh for r, t in self._arrived_at.items() if now - t <= 1.0)
