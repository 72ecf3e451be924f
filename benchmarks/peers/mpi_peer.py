"""Rank-side adapter for MPI_Allreduce & co. through mpi4py (MPICH wheel), numpy buffers.

Allreduce variants: ``out-of-place`` (separate send and receive buffers, receive buffer reused)
and ``in-place`` (``MPI.IN_PLACE``). The 200-tensor case uses the blocking calls one by one
(``seq``), nonblocking ``Iallreduce`` + ``Waitall`` (``async``) and one pre-packed 800 KiB call
(``fused``, a floor that needs no packing).
"""

from __future__ import annotations

import numpy as np


class Adapter:
    name = "mpi"
    allreduce_variants = ("out-of-place", "in-place")
    fusion_modes = ("seq", "async", "fused")

    def init(self) -> None:
        import mpi4py

        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = True
        from mpi4py import MPI

        self.MPI = MPI
        # What a plain ``from mpi4py import MPI`` does: MPI_Init_thread(MPI_THREAD_MULTIPLE).
        # (MPI_Init, i.e. THREAD_SINGLE, makes MPICH's wait loop never yield the core: 12-16 ms
        # per op once ranks outnumber free cores.)
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._out = {}
        self._answer = (np.ones(1, np.int32), np.ones(1, np.int32))  # broadcast_answered's

    def array(self, nbytes: int, fill: float = 0.0):
        return np.full(max(1, nbytes // 4), fill, dtype=np.float32)

    def values(self, buf):
        return np.asarray(buf)

    def allreduce(self, buf, name: str, variant: str = "out-of-place"):
        if variant == "in-place":
            self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
            return buf
        out = self._out.get(buf.nbytes)
        if out is None:
            self._out.clear()
            out = self._out[buf.nbytes] = np.empty_like(buf)
        self.comm.Allreduce(buf, out, op=self.MPI.SUM)
        return out

    def allreduce_set(self, bufs, names, mode: str) -> None:
        MPI = self.MPI
        if mode == "seq":
            for b in bufs:
                self.comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)
        elif mode == "async":
            MPI.Request.Waitall([self.comm.Iallreduce(MPI.IN_PLACE, b, op=MPI.SUM)
                                 for b in bufs])
        else:  # fused: one op over the same bytes, no packing
            packed = self._out.get("fused")
            if packed is None:
                packed = self._out["fused"] = np.zeros(sum(b.size for b in bufs), np.float32)
            self.comm.Allreduce(MPI.IN_PLACE, packed, op=MPI.SUM)

    def allgather(self, buf, name: str):
        out = np.empty(buf.size * self.size, dtype=buf.dtype)
        self.comm.Allgather(buf, out)
        return out

    def broadcast(self, buf, name: str, root: int = 0):
        self.comm.Bcast(buf, root=root)
        return buf

    def broadcast_answered(self, buf, name: str, root: int = 0):
        """Bcast, then a 4 B answer from every rank reduced to the root: the least a root
        must wait for to raise when another rank's broadcast does not match (Horovod's
        guarantee, which ours keeps: Note [One round] B). MPI's Bcast alone has no answer."""
        self.comm.Bcast(buf, root=root)
        self.comm.Reduce(self._answer[0], self._answer[1], op=self.MPI.MIN, root=root)
        return buf

    def alltoall(self, buf, name: str):
        out = np.empty_like(buf)
        self.comm.Alltoall(buf, out)
        return out

    def reducescatter(self, buf, name: str):
        out = np.empty(buf.size // self.size, dtype=buf.dtype)
        self.comm.Reduce_scatter_block(buf, out, op=self.MPI.SUM)
        return out

    def send(self, buf, dst: int, tag: int) -> None:
        self.comm.Send(buf, dest=dst, tag=tag)

    def recv(self, buf, src: int, tag: int):
        self.comm.Recv(buf, source=src, tag=tag)  # into a buffer of the known size
        return buf

    recv_into = recv

    def barrier(self) -> None:
        self.comm.Barrier()

    def join(self) -> None:
        self.comm.Barrier()  # MPI has no join: every rank reaching this point is the same thing

    def metrics(self) -> dict:
        return {}

    def shutdown(self) -> None:
        pass
