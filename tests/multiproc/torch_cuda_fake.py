"""Rank-side helper of the torch CUDA tests: every tensor of the rank is a "CUDA tensor" of
device 0, on the fake CUDA runtime and fake NCCL (tests/fakecuda), whose device memory is host
memory — so CPU-only torch computes on it while every collective takes the core's device path.

What is faked (only what talks to ``torch.cuda`` or asks "is this tensor on the CPU?"):

- ``devices.placement``: a CPU tensor is reported as ``(0, stream)``, ``stream`` being this
  rank's "current stream" (a real stream of the fake runtime, :func:`current_stream`), as
  ``torch.cuda.current_stream(device).cuda_stream`` would give for a CUDA tensor;
- ``devices.device_tensor``: a core-owned device Buffer is wrapped without a copy through
  ``__array_interface__`` (host memory) instead of ``__cuda_array_interface__``; the tensor
  keeps the Buffer alive, exactly as the real one does;
- ``devices.join_device``: the real function, except that a CUDA device without an index means
  device 0 (the real one asks ``torch.cuda.current_device()``);
- the C paths of allreduce and of the grouped ops (``_core.torch_allreduce_async`` and
  ``_core.torch_group_async``, which take CPU tensors only, judging by ``tensor.is_cpu``)
  decline every tensor, as they decline a real CUDA tensor.

What is real: all of engine_native.torch above that seam (checks, names, handles, grouping,
autograd, the optimizer, SyncBatchNorm, compression, object helpers), the loading of the CUDA
runtime and NCCL (``devices._require_cuda``), the core's device path (ready events on the
producer stream, NCCL with distinct bus ids, staged with a shared one, device outputs), and the
fake CUDA runtime and NCCL below it, whose collectives really combine the ranks' data.

The fake cannot tell tensors Horovod keeps on the CPU (the row counts in allgather's backward)
from CUDA ones: in a faked rank, every tensor goes to the device. (broadcast_object's and
allgather_object's bytes go through the NumPy API, engine_native/objects.py, so they stay on
the host here too.)

Example
-------
In a rank started with ``device_ops.rank_envs(fake_cuda, np, shared)``:

>>> hvd = torch_cuda_fake.start()                   # doctest: +SKIP
>>> with torch_cuda_fake.on_device(ops=1):          # doctest: +SKIP
...     out = hvd.allgather(torch.ones(2, 3))
>>> torch_cuda_fake.is_device_output(out)           # doctest: +SKIP
True
"""
from __future__ import annotations

import contextlib
import weakref

import numpy as np
import torch

from engine_native import _core
from engine_native.torch import devices
from multiproc import device_ops

FAKE_DEVICE = 0
_state = {"stream": None, "wrapped": {}, "placed": 0}  # wrapped: ptr -> weakref(holder)
_real = {"join_device": devices.join_device, "device_tensor": devices.device_tensor,
         "placement": devices.placement,
         "torch_allreduce_async": _core.torch_allreduce_async,
         "torch_group_async": _core.torch_group_async}


class _HostArray:
    """Fake device memory (host memory) as ``__array_interface__``; keeps the Buffer alive."""
    __slots__ = ('__array_interface__', '__weakref__', 'buffer')

    def __init__(self, buffer, shape, typestr):
        self.buffer = buffer
        self.__array_interface__ = {'shape': shape, 'typestr': typestr, 'strides': None,
                                    'data': (buffer.ptr, False), 'version': 3}


def _placement(tensor):
    if tensor.device.type != 'cpu':
        raise AssertionError(f'a faked rank has CPU tensors only, got {tensor.device}')
    devices._require_cuda()  # the real loading of the (fake) CUDA runtime and NCCL
    _state["placed"] += 1
    return FAKE_DEVICE, _state["stream"]


def _device_tensor(buffer, shape, dtype):
    assert buffer.device == FAKE_DEVICE, f'expected memory of device 0, got {buffer.device}'
    if 0 in shape or buffer.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    holder = _HostArray(buffer, shape, devices._TYPESTR[dtype])
    out = torch.from_numpy(np.asarray(holder))  # the array's base is holder: no copy
    _state["wrapped"][buffer.ptr] = weakref.ref(holder)
    return out.view(torch.bfloat16) if dtype == torch.bfloat16 else out


def _join_device(device):
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type == 'cuda' and device.index is None:
        device = FAKE_DEVICE  # torch.cuda.current_device() of the fake
    return _real["join_device"](device)


def _torch_allreduce_async(*args):
    """The C path's answer for a CUDA tensor (every tensor of a faked rank): None, declined,
    so the checked Python path takes it."""


def _torch_group_async(*args):
    """The grouped C path's answer for a group of CUDA tensors: None, declined, likewise."""


def install():
    """Fake the seam (see the module docstring). Needs ``device_ops.rank_envs``' environment."""
    if _state["stream"] is None:
        _state["stream"] = device_ops.fakes().stream()
    devices.placement = _placement
    devices.device_tensor = _device_tensor
    devices.join_device = _join_device
    _core.torch_allreduce_async = _torch_allreduce_async
    _core.torch_group_async = _torch_group_async


def uninstall():
    """The real seam again (CPU tensors take the CPU path)."""
    for module, names in ((devices, ("placement", "device_tensor", "join_device")),
                          (_core, ("torch_allreduce_async", "torch_group_async"))):
        for name in names:
            setattr(module, name, _real[name])


def start():
    """``engine_native.torch`` initialised on this rank with the seam faked; returns it."""
    import engine_native.torch as hvd
    hvd.init()
    install()
    return hvd


def current_stream() -> int:
    """The fake device's current stream (what placement gives as the producer stream)."""
    return _state["stream"]


def is_device_output(tensor) -> bool:
    """True if ``tensor``'s memory is a core-owned device Buffer that device_tensor wrapped
    (and whose wrapper still lives, so the address cannot have been reused)."""
    holder = _state["wrapped"].get(tensor.data_ptr())
    return holder is not None and holder() is not None


def gpu_path(set_id: int = 0):
    """The core's path for a process set's CUDA collectives ("nccl" / "cuda-ipc" / "staged")."""
    return device_ops.gpu_path(set_id)


def _counters():
    f = device_ops.fakes()
    return {"ready_events": f.calls("cudaEventRecord"), "waits": f.calls("cudaStreamWaitEvent"),
            "nccl": f.nccl.fakeNcclCollectives(), "copies": f.calls("cudaMemcpyAsync"),
            "placed": _state["placed"]}


@contextlib.contextmanager
def on_device(ops, data=True):
    """Assert that the block ran at least ``ops`` tensors through the core's device path:
    each placed on device 0, its ready event recorded and waited for by the core's stream,
    and (unless ``data`` is False: empty tensors) data moved by NCCL or by the staged or IPC copies,
    whichever path the global set took."""
    before = _counters()
    yield
    after = _counters()
    delta = {k: after[k] - before[k] for k in after}
    path = device_ops.gpu_path()
    assert min(delta["placed"], delta["ready_events"], delta["waits"]) >= ops, \
        f"expected {ops} tensors on the device path, got {delta} (path {path})"
    # an NCCL set stages what NCCL cannot reduce (int16, integer Average, scaled integers)
    moved = delta["nccl"] + delta["copies"] if path == "nccl" else delta["copies"]
    assert path in ("nccl", "cuda-ipc", "staged") and (moved > 0 or not data), (ops, delta, path)


# ---- deterministic inputs -------------------------------------------------------------------

def x_of(rank, shape, dtype=torch.float32):
    """Rank ``rank``'s input: small integers 1..5 (exact in every dtype, sums included)."""
    n = 1
    for d in shape:
        n *= d
    return ((torch.arange(n, dtype=torch.int64) + 3 * rank) % 5 + 1).reshape(shape).to(dtype)


def close(got, want, what, tol=1e-12):
    """Same dtype and shape; equal values (within ``tol`` relative for floating point)."""
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: got {got.dtype} {tuple(got.shape)}, expected {want.dtype} {tuple(want.shape)}"
    good = torch.isclose(got.double(), want.double(), rtol=tol, atol=tol) \
        if got.dtype.is_floating_point else got == want
    if not bool(good.all()):
        first = int((~good).flatten().nonzero()[0])
        raise AssertionError(
            f"{what}: {int((~good).sum())} of {good.numel()} values differ; at flat index "
            f"{first} got {got.flatten()[first].item()}, expected {want.flatten()[first].item()}")
