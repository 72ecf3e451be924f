"""Rank-side adapter for Horovod 0.28.1 (``horovod.torch``) from benchmarks/.venv-horovod.

Started by the venv's ``mpiexec`` (CPU ops over MPI, Horovod's default when built with MPI) or
by ``horovodrun --gloo`` (CPU ops over gloo). Allreduce is Horovod's in-place ``allreduce_``,
the path its DistributedOptimizer takes; the 200-tensor case is ``allreduce_async_`` for every
tensor, then ``synchronize`` on each (the path tensor fusion batches). Horovod's defaults apply
(cycle time 1 ms, fusion threshold 128 MiB) unless the launcher's environment sets them.
"""

from __future__ import annotations


class Adapter:
    name = "horovod"
    allreduce_variants = ("in-place",)
    fusion_modes = ("async",)

    def init(self) -> None:
        import horovod.torch as hvd
        import torch

        self.torch, self.hvd = torch, hvd
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()

    def array(self, nbytes: int, fill: float = 0.0):
        return self.torch.full((max(1, nbytes // 4),), fill, dtype=self.torch.float32)

    def values(self, buf):
        return buf.numpy()

    def allreduce(self, buf, name: str, variant: str = "in-place"):
        return self.hvd.allreduce_(buf, op=self.hvd.Sum, name=name)

    def allreduce_set(self, bufs, names, mode: str) -> None:
        hvd = self.hvd
        if mode == "seq":
            for b, n in zip(bufs, names):
                hvd.allreduce_(b, op=hvd.Sum, name=n)
            return
        handles = [hvd.allreduce_async_(b, op=hvd.Sum, name=n) for b, n in zip(bufs, names)]
        for h in handles:
            hvd.synchronize(h)

    def allgather(self, buf, name: str):
        return self.hvd.allgather(buf, name=name)

    def broadcast(self, buf, name: str, root: int = 0):
        return self.hvd.broadcast_(buf, root_rank=root, name=name)

    def alltoall(self, buf, name: str):
        return self.hvd.alltoall(buf, name=name)

    def reducescatter(self, buf, name: str):
        return self.hvd.reducescatter(buf, op=self.hvd.Sum, name=name)

    def barrier(self) -> None:
        self.hvd.barrier()

    def metrics(self) -> dict:
        return {}

    def shutdown(self) -> None:
        self.hvd.shutdown()
