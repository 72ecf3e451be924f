"""Point-to-point for torch tensors (issue #36; not in Horovod): ``send``/``recv`` between two
ranks, autograd-aware, and ``isend``/``irecv``/``batch_isend_irecv`` with torch.distributed's
names but not its signatures (a receive returns a new tensor, ``out=`` fills one; no group;
``P2POp(op, tensor, peer, tag)``)::

    if hvd.rank() == 0:
        token = hvd.send(stage0(x), dst=1)     # its backward waits for rank 1's gradient
        token.backward()
    else:
        h = hvd.recv(src=0, requires_grad=True)  # dtype and shape come with the message
        loss_fn(stage1(h), y).backward()         # sends h's gradient back to rank 0

Ranks are global ranks; tags 0 .. 2**40 - 1 are the program's (the pipeline's and the
gradients' messages use tags above). CUDA tensors go by NCCL where the core says so (another
host with NCCL loaded, or HVD_GPU_PATH=nccl: Note [NCCL point-to-point] in the core), else by
CUDA IPC to a rank of the same host and through host memory to another host (Note [Staged
point-to-point]); a receive gives a CPU
tensor unless ``device=`` says where it goes. Messages of one (rank, tag) arrive in the order
sent. Note [Gradient tags]: the gradient of the k-th message sent from A to B with tag t goes
back from B to A with a tag made of t and k, so gradients find their message whatever order
the backwards run in; both ranks count the messages of each (peer, tag) they send or receive
through this module since ``init()`` (mixing engine_native's NumPy send/recv into the same
(peer, tag) would shift the count).
"""
from __future__ import annotations

import collections
import threading

import torch

import engine_native.basics as _basics
from engine_native import _core
from engine_native import p2p as _p2p
from engine_native.p2p import (  # noqa: F401 (P2POp, P2PRequest: this module's names too)
    USER_TAGS,
    P2POp,
    P2PRequest,
    batch_isend_irecv,
    batchable,
)
from engine_native.p2p import check_tag as _check_tag
from engine_native.torch import devices
from engine_native.torch import runtime as rt

__all__ = ["P2POp", "batch_isend_irecv", "irecv", "isend", "recv", "send"]

_GRAD_TAGS = 1 << 62
_SEQUENCE_WRAP = 1 << 21  # gradients of messages this many apart on one (peer, tag) share a tag
_CODES_TO_DTYPES = {code: dtype for dtype, code in rt._DTYPE_CODES.items()}
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # what raw_isend may send as it is

_lock = threading.Lock()
_sends = collections.Counter()     # (dst, tag) -> messages sent since init()
_receives = collections.Counter()  # (src, tag) -> receives posted since init()


def _reset_counts():
    with _lock:
        _sends.clear()
        _receives.clear()


_basics._per_world_resets.append(_reset_counts)


def _next(counter, key) -> int:
    """The number of the next message of ``key`` (counted once it was submitted)."""
    with _lock:
        return counter[key]


def _count(counter, key) -> None:
    """A message of ``key`` was submitted (a refused one is not counted, on either side)."""
    with _lock:
        counter[key] += 1


def _grad_tag(tag: int, sequence: int) -> int:
    return _GRAD_TAGS + (sequence % _SEQUENCE_WRAP) * USER_TAGS + tag


def _check(tensor, what: str):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{what}: CPU or CUDA tensors only (got one on {tensor.device})")
    return rt.dtype_code(tensor, what)


# Note [Staged point-to-point]
# Where _core.p2p_cuda_route says "nccl" or "ipc" the core moves a CUDA tensor itself (Note
# [NCCL point-to-point], Note [Device point-to-point] in the core): the send passes the tensor's address and its device's current
# stream, and a receive names the device that reads it (``device=``, else this process's
# current CUDA device) and whether the result stays there. To another host, or with
# HVD_GPU_PATH=staged, a CUDA tensor goes through host memory: ``.to("cpu")`` copies it on its
# device's current stream and waits for that copy, so the kernels that produced it (queued
# before, on that stream: Horovod's stream contract) have finished and the bytes are final
# before the core reads them; the sending thread blocks for the copy. A receive of a host
# message is a CPU tensor, moved with ``.to(device)`` (a copy on that device's current stream)
# when ``device=`` names one; a contiguous CPU ``out=`` is written by the core itself (Note
# [Receive into out]), any other ``out=`` filled by a copy wherever it lives. The gradient of a
# sent CUDA tensor comes back to the tensor's device. Both ways ran on an H200 (tests/gpu/
# test_p2p_gpu.py, 2026-12-04).


def _by_ipc(tensor: torch.Tensor, dst: int) -> bool:
    return tensor.device.type == "cuda" and _core.p2p_cuda_route(int(dst)) in ("ipc", "nccl")


def _host_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """What a staged send writes: the tensor itself on the CPU, a host copy of a device
    tensor."""
    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.to("cpu")
    return data.contiguous()


def _reading_device(device) -> tuple[int, bool]:
    """``(device, on_device)`` of a receive for the core: the CUDA ordinal that reads a CUDA
    tensor sent from this host (-1: none) and whether the result stays there."""
    if device is not None:
        devices._require_cuda()
        return (device.index if device.index is not None else torch.cuda.current_device()), True
    if torch.cuda.is_initialized():
        devices._require_cuda()
        return torch.cuda.current_device(), False
    return -1, False


def _received(result, what: str, out, device=None):
    buffer, shape, code = result
    if buffer is None:  # written into out itself (Note [Receive into out])
        # as out.copy_() would: autograd then refuses a graph that saved out's old values
        torch.autograd.graph.increment_version(out)
        return out
    tensor = rt.tensor_from_buffer(buffer, shape, _CODES_TO_DTYPES[code])
    if out is None:
        if device is None or tensor.device.type == "cuda":  # a CUDA read lands on `device`
            return tensor
        return tensor.to(device)
    if out.dtype != tensor.dtype or tuple(out.shape) != tuple(tensor.shape):
        raise ValueError(f"{what}: the message is {tensor.dtype} {tuple(tensor.shape)}, the "
                         f"tensor to fill is {out.dtype} {tuple(out.shape)}")
    with torch.no_grad():
        out.copy_(tensor)
    return out


def raw_isend(tensor, dst: int, tag: int, wait_now: bool = False) -> P2PRequest:
    """isend without the tag range check or the message count (the pipeline's own tags).
    ``wait_now``: the caller waits for it at once (and drives it)."""
    if type(tensor) in _PLAIN and tensor.is_cpu and tensor.layout is torch.strided and \
            tensor.is_contiguous():
        code = rt._DTYPE_CODES.get(tensor.dtype)
        if code is not None:  # a pipeline's every hand-off: the checks below cost ~3 µs more
            # kept as an alias: the storage outlives a `tensor.data = ...` meanwhile, and the
            # request holds no autograd graph
            return _p2p.start_send(dst, tag, code, tensor.shape, tensor.data_ptr(),
                                   keep=tensor.detach(), wait_now=wait_now)
    code = _check(tensor, f"send(to rank {dst}, tag {tag})")
    if _by_ipc(tensor, dst):
        data = tensor.detach().contiguous()  # (a strided tensor: a copy on its current stream)
        device, stream = devices.placement(data)
        return _p2p.start_send(dst, tag, code, data.shape, data.data_ptr(), keep=data,
                               wait_now=wait_now, device=device, stream=stream)
    data = _host_bytes(tensor)
    return _p2p.start_send(dst, tag, code, data.shape, data.data_ptr(), keep=data,
                           wait_now=wait_now)


def raw_irecv(src: int, tag: int, out=None, wait_now: bool = False,
              device=None, stream_ordered: bool = False) -> P2PRequest:
    """irecv without the tag range check or the message count (the pipeline's own tags).
    ``wait_now``: the caller waits for it at once (and drives it); ``device``: None (the CPU)
    or a CUDA torch.device the received tensor is moved to. ``stream_ordered`` (with
    ``device``): a CUDA tensor sent by IPC or NCCL is the caller's once its copy or ncclRecv is
    queued, final in the order of ``device``'s current stream, which waits for it (Note [Device
    point-to-point] I; by NCCL only where ``device`` is the one receiving from that rank); any
    other message once its bytes are there."""
    what = f"recv(from rank {src}, tag {tag})"
    if out is not None:
        _check(out, what)
    convert = _received if device is None else \
        (lambda result, what_, out_: _received(result, what_, out_, device))
    reader, on_device = _reading_device(device)
    if out is not None and out.device.type == "cpu" and out.is_contiguous() and out.numel() > 0:
        # written there by the core (Note [Receive into out]); _received then copies nothing
        return _p2p.start_recv_into(src, tag, rt.dtype_code(out, what), out.shape,
                                    out.data_ptr(), out, wait_now, what, convert, reader)
    # an out= the core cannot write (strided, on a CUDA device, empty) still brings its type:
    # a message of another one is refused, so its sender raises too (Note [Refused messages])
    expected = (None, 0, None) if out is None else (None, rt.dtype_code(out, what),
                                                    tuple(out.shape))
    consumer = devices.current_stream(reader) if stream_ordered and on_device else -1
    return P2PRequest(_core.p2p_recv(int(src), int(tag), wait_now, reader, on_device, *expected,
                                     consumer), what, out, convert=convert)


def raw_recv_now(src: int, tag: int) -> torch.Tensor:
    """``raw_irecv(src, tag, wait_now=True).wait()`` for a new tensor on the CPU, without the
    request object or its name (a pipeline's every hand-off: the core's errors name the peer
    and tag). Interrupted (Ctrl-C), the receive stays posted, as a dropped irecv's does."""
    reader, on_device = _reading_device(None)
    buffer, shape, code = _core.wait(_core.p2p_recv(src, tag, True, reader, on_device))
    return rt.tensor_from_buffer(buffer, shape, _CODES_TO_DTYPES[code])


def isend(tensor: torch.Tensor, dst: int, tag: int = 0) -> P2PRequest:
    """Start sending ``tensor`` to rank ``dst``; it must not change until ``wait()``."""
    tag = _check_tag(tag, "isend")
    request = raw_isend(tensor, dst, tag)
    _count(_sends, (dst, tag))
    return request


def irecv(src: int, tag: int = 0, out: torch.Tensor | None = None,
          device=None) -> P2PRequest:
    """Start receiving the next message with ``tag`` from rank ``src``; ``wait()`` returns a
    new tensor (on the CPU, or on ``device``), or ``out`` filled (same dtype and shape, else
    ValueError, on the sender too: its send or its next op with this rank raises)."""
    tag = _check_tag(tag, "irecv")
    device = devices.receive_device(device, "irecv")
    if device is not None and out is not None:
        raise ValueError("irecv: give out= (filled where it lives) or device=, not both")
    request = raw_irecv(src, tag, out, device=device)
    _count(_receives, (src, tag))
    return request


class _Send(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, dst, tag, sequence):
        ctx.dst, ctx.tag, ctx.sequence = dst, tag, sequence
        ctx.shape, ctx.dtype = tensor.shape, tensor.dtype
        ctx.device = tensor.device if tensor.device.type != "cpu" else None
        request = raw_isend(tensor, dst, tag, wait_now=True)
        _count(_sends, (dst, tag))
        request.wait()
        return torch.zeros((), dtype=tensor.dtype)

    @staticmethod
    def backward(ctx, _):
        grad = raw_irecv(ctx.dst, _grad_tag(ctx.tag, ctx.sequence), wait_now=True,
                         device=ctx.device).wait()
        if grad.shape != ctx.shape or grad.dtype != ctx.dtype:
            raise ValueError(f"send(to rank {ctx.dst}, tag {ctx.tag}): the gradient that came "
                             f"back is {grad.dtype} {tuple(grad.shape)}, the tensor sent was "
                             f"{ctx.dtype} {tuple(ctx.shape)}")
        return grad, None, None, None


class _Recv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, _anchor, src, tag, sequence, device):
        ctx.src, ctx.tag, ctx.sequence = src, tag, sequence
        request = raw_irecv(src, tag, wait_now=True, device=device)
        _count(_receives, (src, tag))
        return request.wait()

    @staticmethod
    def backward(ctx, grad):
        raw_isend(grad, ctx.src, _grad_tag(ctx.tag, ctx.sequence), wait_now=True).wait()
        return None, None, None, None, None


def send(tensor: torch.Tensor, dst: int, tag: int = 0) -> torch.Tensor:
    """Send ``tensor`` to rank ``dst``; returns once its bytes are written (not received).

    Returns a zero-dimensional token: when ``tensor`` requires grad, ``token.backward()`` (or
    any backward through it) waits for the gradient that rank ``dst``'s :func:`recv` sends back
    and passes it to ``tensor``'s graph."""
    tag = _check_tag(tag, "send")
    sequence = _next(_sends, (dst, tag))
    if tensor.requires_grad and torch.is_grad_enabled():
        token = _Send.apply(tensor, dst, tag, sequence)  # (counted once submitted, below)
    else:
        request = raw_isend(tensor, dst, tag, wait_now=True)
        _count(_sends, (dst, tag))
        request.wait()
        token = torch.zeros((), dtype=tensor.dtype)
    return token


def recv(src: int, tag: int = 0, out: torch.Tensor | None = None,
         requires_grad: bool = False, device=None) -> torch.Tensor:
    """Receive the next message with ``tag`` from rank ``src``: a new tensor (on the CPU, or
    on ``device``), or ``out`` filled.

    With ``requires_grad=True`` the tensor is part of the autograd graph: its gradient is sent
    back to rank ``src``, whose :func:`send` token receives it."""
    tag = _check_tag(tag, "recv")
    device = devices.receive_device(device, "recv")
    if device is not None and out is not None:
        raise ValueError("recv: give out= (filled where it lives) or device=, not both")
    if requires_grad:
        if out is not None:
            raise ValueError("recv: requires_grad=True returns a new tensor; out= is for "
                             "receives outside autograd")
        anchor = torch.empty(0, requires_grad=True)  # puts the receive in the graph
        return _Recv.apply(anchor, src, tag, _next(_receives, (src, tag)), device)
    request = raw_irecv(src, tag, out, wait_now=True, device=device)
    _count(_receives, (src, tag))
    return request.wait()


batchable(isend, irecv)  # P2POp takes these two
