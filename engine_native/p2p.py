"""Point-to-point messages between two ranks (issue #36): a rank sends a NumPy array to one
other rank, which receives it by (source rank, tag), with no other rank involved.

>>> import engine_native as hvd
>>> hvd.init()
>>> if hvd.rank() == 0:
...     hvd.send(np.arange(4.0), dst=1, tag=7)
... elif hvd.rank() == 1:
...     x = hvd.recv(src=0, tag=7)   # dtype and shape travel with the message

Ranks are global ranks. Messages from one rank with one tag are received in the order they
were sent; different tags may be received in any order. A send does not wait for its receive
(the receiver keeps a message until it asks for it). Errors, never hangs: a receive that gets
nothing from its peer for ``HVD_TIMEOUT`` seconds raises ``HorovodInternalError`` naming the
peer and tag, and a peer that dies fails every rank's pending ops, as for collectives (Note
[Point-to-point] in engine_native/csrc/runtime/peer_ops.cc). A message that does not fit a
receive's ``out`` raises ``ValueError`` on both ranks (Note [Refused messages]). Each pair of
ranks has its own channel: shared-memory rings within a host, a TCP connection between hosts.
(CUDA tensors: engine_native.torch's send/recv, by CUDA IPC within a host.)
"""
from __future__ import annotations

import operator
import threading

import numpy as np

from . import _core, _dtypes, basics

_lock = threading.Lock()
_in_use: dict = {}  # handle -> the array the core reads (a send) or writes (recv's out=)


def _forget_all() -> None:
    """At a world's end (shutdown, init) the core reads and writes no array any more: the
    arrays of requests dropped unfinished (after a failure, say) go, not kept for good."""
    with _lock:
        _in_use.clear()


basics._per_world_resets.append(_forget_all)


class P2PRequest:
    """An :func:`isend` or :func:`irecv` in flight. ``wait()`` blocks until it is done and
    returns None for a send, the received array for a receive; ``is_completed()`` never
    blocks. ``convert(result, what, out)`` turns a receive's (buffer, shape, dtype code) into
    what ``wait()`` returns (engine_native.torch passes one that makes tensors); ``what`` names
    the receive in convert's errors."""

    def __init__(self, handle: int, what: str, out=None, convert=None, kept: bool = False):
        self._handle = handle
        self._what = what
        self._out = out
        self._convert = convert or _received
        self._kept = kept  # _in_use holds an array for the handle (start_send, start_recv_into)
        self._result = None
        self._error = None  # a receive whose `out` did not fit: raised by every wait()
        self._done = False

    def is_completed(self) -> bool:
        return self._done or _core.poll(self._handle)

    def _forget(self) -> None:
        if self._kept:
            with _lock:
                _in_use.pop(self._handle, None)

    def wait(self):
        if self._error is not None:
            raise self._error
        if self._done:
            return self._result
        try:
            result = _core.wait(self._handle)
        except (KeyboardInterrupt, SystemExit):
            raise  # the op is still pending: its array stays in use (and kept)
        except BaseException:
            self._forget()  # the op failed: the core no longer reads the array
            raise
        self._forget()
        self._done = True
        if result is not None:
            try:
                self._result = self._convert(result, self._what, self._out)
            except ValueError as exc:
                self._error = exc
                raise
        return self._result


# Tags from here up are the bindings' own (torch's gradients of messages, a pipeline's hand-offs):
# a user's tag is below, so it never takes one of their messages.
USER_TAGS = 1 << 40


def check_tag(tag, what: str) -> int:
    """``tag`` as an int in [0, USER_TAGS) (a NumPy integer too); else ValueError naming
    ``what``."""
    if type(tag) is int and 0 <= tag < USER_TAGS:
        return tag
    try:
        value = None if isinstance(tag, bool) else operator.index(tag)
    except TypeError:
        value = None
    if value is None or not 0 <= value < USER_TAGS:
        raise ValueError(f"{what}: tag must be an int in [0, 2**40), got {tag!r}")
    return value


def isend(array, dst: int, tag: int = 0) -> P2PRequest:
    """Start sending ``array`` (any shape, a dtype of the core) to rank ``dst``. The array must
    not be changed until the request completes."""
    return _isend(array, dst, check_tag(tag, "isend"), wait_now=False)


def _isend(array, dst: int, tag: int, wait_now: bool) -> P2PRequest:
    x, code = _sendable(array, dst, tag)
    return start_send(dst, tag, code, x.shape, x, keep=x, wait_now=wait_now)


def _sendable(array, dst: int, tag: int):
    """(C-contiguous array, dtype code) of what a send writes; TypeError for a dtype the core
    does not carry (its message made only then)."""
    x = np.asarray(array)
    if not x.flags.c_contiguous:  # (np.ascontiguousarray would turn a 0-d array into 1-d)
        x = x.copy(order="C")
    code = _dtypes.numpy_code_or_none(x.dtype)
    if code is None:
        _dtypes.numpy_code(x.dtype, "send", f"to rank {dst}, tag {tag}")  # raises TypeError
    return x, code


def start_send(dst: int, tag: int, code: int, shape, data, keep, convert=None,
               wait_now: bool = False, device: int = -1, stream: int = 0) -> P2PRequest:
    """Submit a send of ``data`` (a buffer or an address) of dtype ``code`` and ``shape``;
    ``keep`` (what owns the bytes) stays referenced until the send completed, even if the
    request is dropped. ``wait_now``: the caller waits for it at once, and drives it (Note
    [Point-to-point] E in the core). ``device >= 0``: ``data`` is the address of a CUDA tensor
    on that device, produced on ``stream`` (Note [Device point-to-point] in the core)."""
    handle = _core.p2p_send(int(dst), int(tag), code, shape, data, wait_now, device, stream)
    with _lock:
        _in_use[handle] = keep
    # no name: a send's wait returns None, and its errors come from the core, naming the peer
    # and tag (a pipeline's every hand-off would format one for nothing)
    return P2PRequest(handle, "", convert=convert, kept=True)


def irecv(src: int, tag: int = 0, out: np.ndarray | None = None) -> P2PRequest:
    """Start receiving the next message with ``tag`` from rank ``src``. Its dtype and shape come
    with it; with ``out``, the message is written into that array, which must have the same
    dtype and shape (else ``ValueError`` on this rank, and the sender's send, or its next op
    with this rank, raises ``ValueError`` too) and must not be used until the request
    completes. A receive that fails may leave ``out`` partly written."""
    return _irecv(src, check_tag(tag, "irecv"), out, wait_now=False)


def _irecv(src: int, tag: int, out, wait_now: bool) -> P2PRequest:
    what = f"recv(from rank {src}, tag {tag})"
    code = _bindable(out)
    if code is None:
        expected = _expected(out)
        if expected is None:  # no out=, or one of a dtype no message can have
            return P2PRequest(_core.p2p_recv(int(src), int(tag), wait_now), what, out)
        # the core refuses a message of another type, so its sender raises too (Note
        # [Refused messages] in the core); this out= is filled by _received's copy
        handle = _core.p2p_recv(int(src), int(tag), wait_now, -1, False, None, *expected)
        return P2PRequest(handle, what, out)
    return start_recv_into(src, tag, code, out.shape, out, out, wait_now, what)


def _expected(out):
    """``(dtype code, shape)`` of an ndarray ``out`` the core cannot write into itself, for
    its check of the message's type; None for no ``out`` or a dtype the core does not carry."""
    if not isinstance(out, np.ndarray):
        return None
    code = _dtypes.numpy_code_or_none(out.dtype)
    return None if code is None else (code, out.shape)


def _bindable(out):
    """The dtype code of an ``out`` the core can write into itself (a writable C-contiguous
    ndarray of a dtype it carries), else None (the message is copied into it)."""
    if isinstance(out, np.ndarray) and out.size and out.flags.c_contiguous and \
            out.flags.writeable:
        return _dtypes.numpy_code_or_none(out.dtype)
    return None


def start_recv_into(src: int, tag: int, code: int, shape, into, out, wait_now: bool,
                    what: str, convert=None, device: int = -1) -> P2PRequest:
    """Submit a receive whose message, if of dtype ``code`` and ``shape``, the core writes to
    host memory ``into`` (an address, or ``out`` itself as a buffer): Note [Receive into out]
    in the core. ``out`` stays referenced until the receive completed, even if the request is
    dropped. ``device``: the CUDA device that reads a CUDA tensor sent from this host (-1:
    none)."""
    handle = _core.p2p_recv(int(src), int(tag), wait_now, device, False, into, code, shape)
    with _lock:
        _in_use[handle] = out
    return P2PRequest(handle, what, out, convert=convert, kept=True)


def _wait_holding(handle: int, keep):
    """``_core.wait`` for a blocking send or receive, whose array ``keep`` the caller's frame
    holds meanwhile; an interrupted wait leaves the op pending, so ``keep`` is kept (as an
    abandoned request's is)."""
    try:
        return _core.wait(handle)
    except (KeyboardInterrupt, SystemExit):
        with _lock:
            _in_use[handle] = keep
        raise


def send(array, dst: int, tag: int = 0) -> None:
    """Send ``array`` to rank ``dst``; returns once its bytes are written (not received)."""
    tag = check_tag(tag, "send")
    x, code = _sendable(array, dst, tag)
    # Blocking: no request object, no table entry (this frame keeps x) and no name string
    # unless an error needs one: the few microseconds a small message's round trip is.
    _wait_holding(_core.p2p_send(int(dst), int(tag), code, x.shape, x, True), x)


def recv(src: int, tag: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """Receive the next message with ``tag`` from rank ``src`` (a new array, or ``out``).
    A wait interrupted by Ctrl-C leaves the receive posted, as a dropped ``irecv`` is: the next
    message of that tag is still written into ``out``, until ``abort()`` or ``shutdown()``."""
    tag = check_tag(tag, "recv")
    if out is None:
        buffer, shape, code = _core.wait(_core.p2p_recv(int(src), int(tag), True))
        return np.frombuffer(buffer, dtype=_dtypes.numpy_dtype(code)).reshape(shape)
    code = _bindable(out)
    if code is None:
        return _irecv(src, tag, out, wait_now=True).wait()
    result = _wait_holding(_core.p2p_recv(int(src), int(tag), True, -1, False, out, code,
                                          out.shape), out)
    if result[0] is None:  # written into out (Note [Receive into out])
        return out
    return _received(result, f"recv(from rank {src}, tag {tag})", out)


def _received(result, what: str, out: np.ndarray | None) -> np.ndarray:
    buffer, shape, code = result
    if buffer is None:  # written into out itself, of its dtype and shape
        return out
    array = np.frombuffer(buffer, dtype=_dtypes.numpy_dtype(code)).reshape(shape)
    if out is None:
        return array
    if out.dtype != array.dtype or tuple(out.shape) != tuple(array.shape):
        raise ValueError(f"{what}: the message is {array.dtype} {tuple(array.shape)}, "
                         f"out is {out.dtype} {tuple(out.shape)}")
    out[...] = array
    return out


# The isend/irecv functions P2POp takes, by identity: "send" or "recv" (each binding adds its
# own, so torch.distributed's isend, say, is refused rather than called with our arguments).
_BATCHABLE: dict = {}


def batchable(send, recv) -> None:
    """Lets P2POp take a binding's ``isend`` and ``irecv``."""
    _BATCHABLE[send], _BATCHABLE[recv] = "send", "recv"


class P2POp:
    """One operation of :func:`batch_isend_irecv`, as in ``torch.distributed``:
    ``P2POp(hvd.isend, array, peer, tag)`` sends ``array``; ``P2POp(hvd.irecv, array, peer,
    tag)`` receives into ``array``. ``hvd`` is any binding with ``isend``/``irecv`` (this NumPy
    API, ``engine_native.torch``)."""

    def __init__(self, op, tensor, peer: int, tag: int = 0):
        if op not in _BATCHABLE:
            raise ValueError(f"P2POp: op must be hvd.isend or hvd.irecv of an engine_native "
                             f"binding, not {op!r}")
        # (here, so a batch with a bad tag starts none of its ops)
        self.op, self.tensor, self.peer, self.tag = op, tensor, peer, check_tag(tag, "P2POp")


def batch_isend_irecv(p2p_op_list: list) -> list:
    """Start every send and receive of the list at once and return their requests. The
    order does not matter: a send never waits for its receive, and a pair's messages are
    matched by (peer, tag) on each side alone (no round with other ranks), so a batch is its
    ops started together; nothing more is needed to keep two ranks that both send first
    from waiting on each other."""
    return [op.op(op.tensor, op.peer, op.tag) if _BATCHABLE[op.op] == "send" else
            op.op(op.peer, op.tag, out=op.tensor) for op in p2p_op_list]


batchable(isend, irecv)
