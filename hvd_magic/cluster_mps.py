"""The cluster's MPS daemon on this machine (issue #19; ``%hvd_start``'s default when its ranks
share a GPU, ``--mps`` / ``--no-mps``: Note [MPS by default] in launch/mps.py).

:class:`ClusterMps` is owned by :class:`hvd_magic.cluster.HvdCluster` and called by
:class:`hvd_magic.ranksetup.RankSetup` once the engines said where they run (step A) and
before any of them initialised CUDA (step D pins, then the core). When the ranks on this
machine outnumber its GPUs it starts one :class:`hvd_magic.launch.mps.MpsDaemon` and gives
those ranks its variables; ``%hvd_restart`` keeps it (the new engines get the same
variables); ``HvdCluster.stop`` stops it after the engines (Note [MPS clients] in
launch/mps.py), which covers ``%hvd_stop``, a failed start and the kernel's exit; the reaper
kills it when the kernel dies. Ranks on other hosts are told to run their own daemon.
"""

from __future__ import annotations

import os
import socket

from .errors import StartError
from .launch import mps as mpslib


class ClusterMps:
    """The MPS daemon of one cluster (none until :meth:`prepare` decides one is needed)."""

    def __init__(self, mode: str):
        self.mode = mpslib.mode_of(mode, "%hvd_start mps")
        self.daemon: mpslib.MpsDaemon | None = None
        self.host = socket.gethostname()  # engines report socket.gethostname() too

    def prepare(self, ranks, launch_env: dict) -> list[str]:
        """Start the daemon when this machine's ranks share GPUs; returns notes to show once.
        Raises StartError with the fix when the daemon cannot start."""
        if self.mode == "off" or self.daemon is not None:
            return []
        here = [r for r in ranks if r.host == self.host]
        others = sorted({r.host for r in ranks} - {self.host})
        notes = []
        if others and self.mode == "on":
            notes.append(f"MPS: the ranks on {', '.join(others)} run without MPS (the daemon "
                         f"is started on this machine only); start `nvidia-cuda-mps-control -d` "
                         f"on those hosts before %hvd_start to share their GPUs")
        if not here:
            return notes
        env = dict(os.environ, **launch_env)
        try:
            self.daemon = mpslib.start_for_job(self.mode, len(here), mpslib.gpu_count(env),
                                               env, lambda text: notes.insert(0, text),
                                               self.host)
        except mpslib.MpsError as exc:
            raise StartError(str(exc)) from None
        return notes

    def rank_env(self, info) -> dict:
        """The MPS variables of rank ``info`` ({} off this machine or without a daemon)."""
        return dict(self.daemon.env) if self.daemon is not None and info.host == self.host \
            else {}

    def pids(self) -> list[int]:
        return list(self.daemon.pids) if self.daemon is not None else []

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
            self.daemon = None

