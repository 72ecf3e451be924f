"""Rank-side adapter for torch.distributed with the gloo backend (CPU tensors, env:// init).

gloo's collectives work in place on torch tensors; ``async`` posts ``async_op=True`` works and
waits on them all.
"""

from __future__ import annotations


class Adapter:
    name = "gloo"
    allreduce_variants = ("in-place",)
    fusion_modes = ("async",)

    def init(self) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo", init_method="env://")
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def array(self, nbytes: int, fill: float = 0.0):
        return self.torch.full((max(1, nbytes // 4),), fill, dtype=self.torch.float32)

    def values(self, buf):
        return buf.numpy()

    def allreduce(self, buf, name: str, variant: str = "in-place"):
        self.dist.all_reduce(buf)
        return buf

    def allreduce_set(self, bufs, names, mode: str) -> None:
        if mode == "seq":
            for b in bufs:
                self.dist.all_reduce(b)
        else:
            for w in [self.dist.all_reduce(b, async_op=True) for b in bufs]:
                w.wait()

    def allgather(self, buf, name: str):
        out = self.torch.empty(buf.numel() * self.size, dtype=buf.dtype)
        try:
            self.dist.all_gather_into_tensor(out, buf)
        except (RuntimeError, NotImplementedError):
            parts = [self.torch.empty_like(buf) for _ in range(self.size)]
            self.dist.all_gather(parts, buf)
            out = self.torch.cat(parts)
        return out

    def broadcast(self, buf, name: str, root: int = 0):
        self.dist.broadcast(buf, src=root)
        return buf

    def alltoall(self, buf, name: str):
        out = self.torch.empty_like(buf)
        self.dist.all_to_all_single(out, buf)
        return out

    def reducescatter(self, buf, name: str):
        out = self.torch.empty(buf.numel() // self.size, dtype=buf.dtype)
        self.dist.reduce_scatter_tensor(out, buf)
        return out

    def send(self, buf, dst: int, tag: int) -> None:
        self.dist.send(buf, dst, tag=tag)

    def recv(self, buf, src: int, tag: int):
        self.dist.recv(buf, src, tag=tag)  # into a tensor of the known size
        return buf

    recv_into = recv

    def barrier(self) -> None:
        self.dist.barrier()

    def metrics(self) -> dict:
        return {}

    def shutdown(self) -> None:
        self.dist.destroy_process_group()
