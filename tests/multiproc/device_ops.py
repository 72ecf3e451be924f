"""Rank-side helpers of the device-path tests: CUDA collectives through the core on the fake
CUDA runtime and fake NCCL (tests/fakecuda), whose "device memory" is host memory — so NumPy
arrays stand for CUDA tensors, with ``device=0`` and a producer stream in each op.

Parent side: :func:`rank_envs` makes the environment that loads the fakes and gives every
rank either a GPU of its own (distinct PCI bus ids: NCCL) or one shared GPU (staged path).
"""
from __future__ import annotations

import ctypes
import os
import time

import numpy as np
from fakecuda.clib import Fakes

import engine_native as hvd
from engine_native import _core, _dtypes, gpu

SHARED_BUS_ID = "0000:01:00.0"


def rank_envs(fake, np_: int, shared: bool, extra=None, ipc: bool = False) -> dict:
    """``run_ranks`` keyword arguments: the fakes for every rank; per-rank bus ids. The fake
    NCCL's rendezvous folders go next to the fake libraries (a temporary folder), never to
    /dev/shm, so a rank killed by a test leaves nothing behind there. Ranks sharing a GPU take
    the staged path (HVD_GPU_PATH=staged) unless ``ipc``: then the core chooses (CUDA IPC,
    test_device_ipc.py); ``extra`` overrides either."""
    comms = os.path.join(os.path.dirname(fake.cudart), "comms")
    os.makedirs(comms, exist_ok=True)
    forced = {"HVD_GPU_PATH": "staged"} if shared and not ipc else {}
    env = dict(fake.env(), FAKE_NCCL_DIR=comms, **dict(forced, **(extra or {})))
    bus = {r: SHARED_BUS_ID if shared else f"0000:{r + 1:02x}:00.0" for r in range(np_)}
    return {"env": env, "rank_env": {r: {"FAKE_CUDA_BUS_IDS": bus[r]} for r in range(np_)}}


def init():
    """The core on this rank with the fake CUDA runtime and NCCL loaded."""
    hvd.init()
    info = gpu.require_cuda()
    assert info["path"] == os.environ["HVD_CUDA_RUNTIME_LIBRARY"], info
    assert gpu.nccl_info()["path"] == os.environ["HVD_NCCL_LIBRARY"], gpu.nccl_info()
    return hvd


def fakes() -> Fakes:
    return Fakes(os.environ["HVD_CUDA_RUNTIME_LIBRARY"], os.environ["HVD_NCCL_LIBRARY"])


def gpu_path(set_id: int = 0):
    """The path the core chose for a process set's CUDA collectives ("nccl" / "cuda-ipc" /
    "staged")."""
    entry = hvd.metrics()["gpu_paths"].get(set_id)
    return entry and entry["path"]


def enqueue(kind, x, out, name, op=_dtypes.Sum, pre=1.0, post=1.0, root=0, set_id=0,
            splits=None, stream=0, device=0):
    """One op on "device" arrays; returns the core handle (the arrays must outlive it)."""
    code = _dtypes.numpy_code(x.dtype, "enqueue", name)
    return _core.enqueue(kind, name, code, x.shape, x, out, op, float(pre), float(post), root,
                         set_id, splits, device, stream)


def device_array(buffer, shape, dtype) -> np.ndarray:
    """A copy of a core-owned device result (fake device memory is host memory)."""
    assert buffer.device == 0, f"expected CUDA memory of device 0, got {buffer.device}"
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.empty(shape, dtype)
    raw = ctypes.string_at(buffer.ptr, count * dtype.itemsize)
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def allreduce(x, op, name, pre=1.0, post=1.0, stream=0):
    out = np.empty_like(x)
    _core.wait(enqueue(_core.ALLREDUCE, x, out, name, op, pre, post, stream=stream))
    return out


def allgather(x, name):
    buffer, shape = _core.wait(enqueue(_core.ALLGATHER, x, None, name))
    return device_array(buffer, shape, x.dtype)


def broadcast(x, root, name):
    out = np.empty_like(x)
    _core.wait(enqueue(_core.BROADCAST, x, out, name, root=root))
    return out


def alltoall(x, splits, name):
    buffer, shape, received = _core.wait(enqueue(_core.ALLTOALL, x, None, name, splits=splits))
    return device_array(buffer, shape, x.dtype), list(received)


def reducescatter(x, op, name, pre=1.0, post=1.0):
    buffer, shape = _core.wait(enqueue(_core.REDUCESCATTER, x, None, name, op, pre, post))
    return device_array(buffer, shape, x.dtype)


def held_for_a_second(hvd, kind: str, start):
    """``start()`` enqueues one op of ``kind`` ("ALLGATHER", ...) and returns its handle; once
    the loop queued it on its stream, the op is watched for a second. Returns the handle and
    whether the op was still pending then: a bounded negative check, as an op that nothing
    holds finishes well within it, and a held one stays pending whatever the wait."""
    queued = hvd.metrics()["ops"][kind] + 1
    handle = start()
    deadline = time.monotonic() + 30
    while hvd.metrics()["ops"][kind] < queued:
        assert time.monotonic() < deadline, f"the {kind} was never queued"
        time.sleep(0.005)
    deadline = time.monotonic() + 1.0
    while not _core.poll(handle) and time.monotonic() < deadline:
        time.sleep(0.005)
    return handle, not _core.poll(handle)


class StuckAllreduce:
    """An allreduce on every rank whose input on ``blocked_rank`` comes from a producer kernel
    that never finishes (the fake's blocker), so the other ranks wait for it: it stays pending
    until the test acts. Holds the arrays, which must outlive the op, and the blocker's token
    (0 on the other ranks) for :meth:`release`."""

    def __init__(self, blocked_rank: int):
        f = fakes()
        producer = f.stream()
        self.token = f.cuda.fakeCudaLaunchBlocker(producer) if hvd.rank() == blocked_rank else 0
        self.x = np.ones(1024, np.float32)
        self.out = np.empty_like(self.x)
        self.handle = enqueue(_core.ALLREDUCE, self.x, self.out, "stuck", hvd.Sum,
                              stream=producer)

    def rank0_acts(self, action: str, bus) -> bool:
        """Rank 0 looks after a moment (a stimulus, not a synchronisation), aborts when
        ``action`` is "abort" and tells the others it acted; returns whether the op was still
        pending. The other ranks wait for that word."""
        if hvd.rank() != 0:
            bus.get("rank0-ready", timeout=30)
            return True
        time.sleep(0.3)
        pending = not _core.poll(self.handle)
        if action == "abort":
            hvd.abort("test")
        bus.set("rank0-ready", b"1")
        return pending

    def release(self) -> None:
        if self.token:
            fakes().check(fakes().cuda.fakeCudaReleaseBlocker(self.token))
