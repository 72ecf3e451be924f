"""What :meth:`.hub.MetricsHub.sync_view` keeps between calls: the callers the next render
tells, and the publishers a cell's end no longer waits for. Written by the hub's thread only."""


class ViewSyncs:
    """The hub thread's bookkeeping of view syncs. ``skipped`` holds publisher ids, so the new
    publisher of a restarted or renumbered engine is waited for; it is replaced, never changed
    in place, so any thread may read it."""

    def __init__(self):
        self.skipped = frozenset()  # publishers that missed a sync and answered nothing since
        self.count = 0  # renders that told a caller
        self._waiting = []  # callables, each told by the next render

    def answered(self, missing, tell):
        """A sync ended (every publisher waited for answered, or its time ran out): ``tell``
        after the next render; the ``missing`` publishers are not waited for until they answer
        a command again."""
        if missing:
            self.skipped = self.skipped | frozenset(missing)
        self._waiting.append(tell)

    def heard_from(self, publisher):
        """``publisher`` answered a command: later syncs wait for it again."""
        if publisher in self.skipped:
            self.skipped = self.skipped - {publisher}

    def waited(self, ranks, publisher_of):
        """Of the live ``ranks``, those a sync waits for (``publisher_of(rank)``: its id)."""
        return [r for r in ranks if publisher_of(r) not in self.skipped]

    def take_waiting(self):
        """The callers to tell once the render about to run is done (counted as one)."""
        waiting, self._waiting = self._waiting, []
        self.count += bool(waiting)
        return waiting
