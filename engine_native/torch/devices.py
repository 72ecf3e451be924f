"""Where a tensor lives, as the core sees it: the only module of engine_native.torch that
talks to ``torch.cuda``.

A CPU tensor is ``(-1, 0)``. A CUDA tensor is ``(ordinal, stream)``: its device and the
``cudaStream_t`` of that device's current stream, on which the core records an event when the
op is enqueued, so the collective waits (on the device) for the kernels that produced the
tensor and for nothing queued later (Horovod's stream contract). Results the core allocates
on a device (allgather, alltoall, reducescatter) come back as memory of that device and are
wrapped without a copy through ``__cuda_array_interface__``; the tensor keeps the core's
buffer alive.

The CUDA runtime (and NCCL, when it is there) is loaded at the first CUDA tensor
(``engine_native.gpu.require_cuda``), never before: a CPU-only job pays no CUDA context.
"""
import torch

from engine_native import gpu

# __cuda_array_interface__ type strings; bfloat16 has none and travels as int16 bits.
_TYPESTR = {
    torch.uint8: '|u1', torch.int8: '|i1', torch.int16: '<i2', torch.int32: '<i4',
    torch.int64: '<i8', torch.float16: '<f2', torch.float32: '<f4', torch.float64: '<f8',
    torch.bool: '|b1', torch.bfloat16: '<i2',
}

_cuda_ready = False
_PER_THREAD_STREAM = 2  # cudaStreamPerThread's handle
# The current stream's raw cudaStream_t without building a torch.cuda.Stream object (a few µs
# per op on the hot path); the public call where a torch build lacks it (same value).
_raw_stream = getattr(torch._C, '_cuda_getCurrentRawStream', None)


def _require_cuda():
    global _cuda_ready
    if not _cuda_ready:
        gpu.require_cuda()
        _cuda_ready = True


def placement(tensor):
    """``(device, stream)`` for the core: ``(-1, 0)`` on the CPU."""
    device = tensor.device
    if device.type != 'cuda':
        return -1, 0
    _require_cuda()
    return device.index, current_stream(device.index)


def current_stream(index: int) -> int:
    """The ``cudaStream_t`` of device ``index``'s current stream."""
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def join_device(device):
    """The CUDA ordinal ``join(device=...)`` names, or -1 for the CPU (Horovod's default).

    The default in a process that already uses CUDA is its current device: the zeros a joined
    rank contributes to the others' CUDA collectives need a GPU. A device named in a process
    without CUDA joins on the CPU (Note [join's device without CUDA] in the core)."""
    if device is None or (isinstance(device, int) and device < 0):
        if torch.cuda.is_initialized():
            _require_cuda()
            return torch.cuda.current_device()
        return -1
    index = torch.device('cuda', device) if isinstance(device, int) else torch.device(device)
    if index.type == 'cpu':
        return -1
    if index.type != 'cuda':
        raise ValueError('join(device=%r): expected a CUDA device, an ordinal or -1' % (device,))
    try:
        _require_cuda()
    except RuntimeError:
        return -1  # no CUDA runtime: no CUDA tensor can exist here (Note [join's device ...])
    if index.index is not None:
        return index.index
    # 'cuda' alone: the current device; a torch without CUDA has none, and the core decides.
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


class _DeviceArray:
    """Core-owned device memory as ``__cuda_array_interface__`` (keeps the buffer alive)."""
    __slots__ = ('__cuda_array_interface__', 'buffer')

    def __init__(self, buffer, shape, typestr):
        self.buffer = buffer
        self.__cuda_array_interface__ = {'shape': shape, 'typestr': typestr, 'strides': None,
                                         'data': (buffer.ptr, False), 'version': 2}


def device_tensor(buffer, shape, dtype):
    """A tensor over the core's device buffer (no copy), on the buffer's device."""
    if 0 in shape or buffer.nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=torch.device('cuda', buffer.device))
    # the stream PyTorch assumes the tensor is used on: the block is reused after it got there
    # (a per-thread default stream would name the dropping thread's: the legacy stream, 0,
    # synchronises with it)
    stream = current_stream(buffer.device)
    buffer.release_stream = 0 if stream == _PER_THREAD_STREAM else stream
    array = _DeviceArray(buffer, shape, _TYPESTR[dtype])
    out = torch.as_tensor(array, device=torch.device('cuda', buffer.device))
    return out.view(torch.bfloat16) if dtype == torch.bfloat16 else out


def receive_device(device, what: str):
    """``device=`` of a receive: None for the CPU, else a CUDA torch.device (checked before
    anything is submitted, so a bad one loses no message)."""
    if device is None:
        return None
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"{what}: device={device!r} is not a device ({exc})") from None
    if d.type == "cpu":
        return None
    if d.type != "cuda":
        raise ValueError(f"{what}: device must be the CPU or a CUDA device, got {d}")
    if not torch.cuda.is_available():
        raise ValueError(f"{what}: device={d}, but this torch sees no CUDA device")
    if d.index is not None and d.index >= torch.cuda.device_count():
        raise ValueError(f"{what}: device={d}, but this process sees "
                         f"{torch.cuda.device_count()} CUDA device(s)")
    return d
