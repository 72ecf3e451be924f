"""What the driver knows of one rank: filled by :mod:`hvd_magic.ranksetup` when engines
register, kept by :class:`hvd_magic.cluster.HvdCluster` and read by the reports and the
dashboard. A module of its own so that both import it from here, not from each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RankInfo:
    """One rank as the driver knows it."""
    rank: int
    engine_id: int
    host: str
    pid: int
    local_rank: int = 0
    device: str = "cpu"
    device_name: str = ""
    device_memory: int | None = None  # bytes, for a GPU
    core: str | None = None
    core_error: str | None = None
    pin_slot: int | None = None  # the local rank its GPU was pinned for (kept when renumbered)
