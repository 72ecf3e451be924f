"""Rank-side adapter for this project's torch API (``engine_native.torch``), making exactly the
calls peers/horovod_peer.py makes to ``horovod.torch`` (it inherits them): in-place
``allreduce_`` and, for a step's gradients, ``allreduce_async_`` on every tensor then
``synchronize`` on each (the DistributedOptimizer's calls). ours.py measures the core through
the numpy API; this adds the torch layer's per-tensor cost, the figure a Horovod user moving
over would see.
"""

from __future__ import annotations

from ours import core_metrics
from peers.horovod_peer import Adapter as HorovodAdapter


class Adapter(HorovodAdapter):
    name = "ours-torch"

    def init(self) -> None:
        import torch

        import engine_native.torch as hvd

        self.torch, self.hvd = torch, hvd
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()

    def metrics(self) -> dict:
        return core_metrics()
