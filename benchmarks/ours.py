"""Rank-side adapter for this project's core (engine_native, numpy API).

Two allreduce variants: ``out-of-place`` is the public numpy API (``engine_native.allreduce``
allocates a fresh result array each call); ``in-place`` hands the core the same pointer as input
and output, which is the path ``engine_native.torch.allreduce_`` and the DistributedOptimizer use.
It calls ``_core.enqueue`` directly so these ranks need not import torch.
"""

from __future__ import annotations

import numpy as np


def core_metrics() -> dict:
    """The core's counters the cases print (ours.py and ours_torch.py share one core)."""
    from engine_native import metrics

    m = metrics()
    return {k: m.get(k) for k in ("negotiate_seconds", "communicate_seconds", "wait_seconds",
                                   "fused_batches", "fused_tensors", "transports")} | {
        "allreduce_ops": m.get("ops", {}).get("ALLREDUCE")}


class Adapter:
    name = "ours"
    allreduce_variants = ("out-of-place", "in-place")
    fusion_modes = ("async",)

    def init(self) -> None:
        import engine_native as hvd

        self.hvd = hvd
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        from engine_native import _core
        from engine_native._dtypes import numpy_code

        self._core = _core
        self._f32 = numpy_code(np.float32, "allreduce", "bench")
        self._set = hvd.global_process_set.process_set_id

    def array(self, nbytes: int, fill: float = 0.0):
        return np.full(max(1, nbytes // 4), fill, dtype=np.float32)

    def values(self, buf):
        return np.asarray(buf)

    def allreduce(self, buf, name: str, variant: str = "out-of-place"):
        if variant == "out-of-place":
            return self.hvd.allreduce(buf, op=self.hvd.Sum, name=name)
        # As engine_native.torch.allreduce_: enqueued for an at-once wait, input and output the
        # same memory (the array itself: buf.ctypes.data cost ~1 us per call in Python).
        h = self._core.enqueue_for_wait(self._core.ALLREDUCE, "allreduce." + name, self._f32,
                                        buf.shape, buf, buf, self.hvd.Sum, 1.0, 1.0, 0,
                                        self._set)
        self._core.wait(h)
        return buf

    def allreduce_set(self, bufs, names, mode: str = "async") -> None:
        handles = [self.hvd.allreduce_async(b, op=self.hvd.Sum, name=n)
                   for b, n in zip(bufs, names)]
        for h in handles:
            self.hvd.synchronize(h)

    def allgather(self, buf, name: str):
        return self.hvd.allgather(buf, name=name)

    def broadcast(self, buf, name: str, root: int = 0):
        return self.hvd.broadcast(buf, root_rank=root, name=name)

    def broadcast_(self, buf, name: str, root: int = 0):
        return self.hvd.broadcast_(buf, root_rank=root, name=name)

    def alltoall(self, buf, name: str):
        return self.hvd.alltoall(buf, name=name)[0]  # even splits of dimension 0

    def reducescatter(self, buf, name: str):
        return self.hvd.reducescatter(buf, op=self.hvd.Sum, name=name)

    def send(self, buf, dst: int, tag: int) -> None:
        self.hvd.send(buf, dst, tag)

    def recv(self, buf, src: int, tag: int):
        return self.hvd.recv(src, tag)  # a new array: the message brings its dtype and shape

    def recv_into(self, buf, src: int, tag: int):
        return self.hvd.recv(src, tag, out=buf)  # written into buf (Note [Receive into out])

    def barrier(self) -> None:
        self.hvd.barrier()

    def join(self) -> None:
        self.hvd.join()

    def metrics(self) -> dict:
        return core_metrics()

    def shutdown(self) -> None:
        self.hvd.shutdown()
