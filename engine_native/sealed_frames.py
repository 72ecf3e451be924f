"""Sealed frames: every frame on a control connection carries an HMAC-SHA256 tag under a key of
that connection and direction, with a sequence number, so a frame that was altered, injected,
replayed, reordered, reflected back or moved from another connection is refused before its body
is looked at. One implementation for the rendezvous store (:mod:`engine_native.rendezvous`,
:mod:`engine_native.rendezvous_client`) and the Spark log channel
(:mod:`hvd_magic.spark.logchannel`); each protocol runs its own handshake first, which gives
both ends the job secret's proof and the two nonces, and then wraps its socket in a
:class:`SealedChannel`.

Note [Sealed frames]
A. Keys. After the handshake both ends derive one key per direction::

       key(dir) = HMAC-SHA256(secret, "hvd-frames" | context | dir | server_nonce | client_nonce)

   ``dir`` is ``"c2s"`` (client to server) or ``"s2c"``; ``context`` names the protocol
   (``"rendezvous"``, ``"log" | rank``). Both nonces are fresh per connection and each end
   chooses one, so no two connections share a key and a man in the middle cannot choose it.
B. Frame: ``op:u8 | length:u32 | body | tag:32`` with
   ``tag = HMAC-SHA256(key(dir), dir | seq:u64 | op:u8 | length:u32 | body)``, where ``seq``
   counts the frames already sent in that direction on this connection (the first is 0).
C. The receiver reads the 5-byte header, refuses a length over its limit before reading the
   body (the tag covers the length too), reads body and tag, recomputes the tag with its own
   count of frames received and compares in constant time. Only a frame whose tag verifies is
   returned; otherwise :class:`FrameAuthError` is raised, the count does not advance and the
   caller closes the connection (there is no resynchronisation).
D. Not covered: confidentiality (bodies travel in clear), and a frame dropped at the very end
   of a conversation (indistinguishable from a slow peer; the protocols' timeouts apply). A
   frame dropped anywhere else shifts every later sequence number and fails at the next one.
"""
from __future__ import annotations

import hashlib
import hmac
import socket
import struct
import threading

__all__ = ["FrameAuthError", "SealedChannel", "TAG_SIZE", "recv_exact"]

HEADER = struct.Struct("!BI")
TAG_SIZE = 32
_SEQ = struct.Struct("!Q")
_C2S, _S2C = b"c2s", b"s2c"
_GATHER_ABOVE = 64 << 10


class FrameAuthError(ConnectionError):
    """A received frame failed authentication; the connection must be closed.

    ``seq`` is the number of the frame (0 for the first one received on the connection).
    """

    def __init__(self, seq: int) -> None:
        super().__init__(f"frame {seq} failed authentication (altered, replayed or out of "
                         f"order)")
        self.seq = seq


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes; ``ConnectionError`` if the peer closes first."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


def _direction_key(secret: bytes, context: bytes, direction: bytes, server_nonce: bytes,
                   client_nonce: bytes) -> bytes:
    return hmac.new(secret, b"hvd-frames" + context + direction + server_nonce + client_nonce,
                    hashlib.sha256).digest()


class SealedChannel:
    """Sealed frames over one connected socket (Note [Sealed frames]).

    One thread may send while another receives; concurrent senders are serialised here,
    concurrent receivers are not supported.

    Parameters
    ----------
    sock : socket.socket
        The connection, handshake already done.
    secret : bytes
        The job secret the handshake proved.
    server_nonce, client_nonce : bytes
        The two nonces of this connection's handshake.
    is_server : bool
        Which end this is (chooses the send and receive keys).
    context : bytes
        The protocol's label, so keys of different protocols never coincide.
    """

    def __init__(self, sock: socket.socket, secret: bytes, server_nonce: bytes,
                 client_nonce: bytes, *, is_server: bool, context: bytes) -> None:
        self.sock = sock
        out_dir, in_dir = (_S2C, _C2S) if is_server else (_C2S, _S2C)
        self._out_dir, self._in_dir = out_dir, in_dir
        self._out_key = _direction_key(secret, context, out_dir, server_nonce, client_nonce)
        self._in_key = _direction_key(secret, context, in_dir, server_nonce, client_nonce)
        self._sent = 0
        self.received = 0  # frames received and verified so far
        self._send_lock = threading.Lock()

    def send(self, op: int, body: bytes) -> None:
        """Send one frame (``OSError`` if the connection is gone)."""
        header = HEADER.pack(op, len(body))
        with self._send_lock:
            tag = self._tag(self._out_key, self._out_dir, self._sent, header, body)
            _send_parts(self.sock, header, body, tag)
            self._sent += 1

    def recv(self, max_body: int) -> tuple[int, bytes]:
        """Receive one frame and return ``(op, body)`` once its tag verifies.

        Raises
        ------
        ValueError
            The header announces a body over ``max_body`` bytes (nothing more is read).
        FrameAuthError
            The tag does not verify; close the connection.
        ConnectionError
            The peer closed the connection.
        """
        header = recv_exact(self.sock, HEADER.size)
        op, length = HEADER.unpack(header)
        if length > max_body:
            raise ValueError(f"frame of {length} bytes exceeds the limit of {max_body}")
        rest = memoryview(_recv_into(self.sock, length + TAG_SIZE))
        expected = self._tag(self._in_key, self._in_dir, self.received, header, rest[:length])
        if not hmac.compare_digest(rest[length:], expected):
            raise FrameAuthError(self.received)
        self.received += 1
        return op, bytes(rest[:length])

    @staticmethod
    def _tag(key: bytes, direction: bytes, seq: int, header: bytes, body) -> bytes:
        h = hmac.new(key, direction + _SEQ.pack(seq) + header, "sha256")
        h.update(body)  # no copy of a large body
        return h.digest()


def _recv_into(sock: socket.socket, n: int) -> bytearray:
    """Exactly ``n`` bytes into one buffer (a large frame is not copied while it arrives)."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("connection closed")
        got += k
    return buf


def _send_parts(sock: socket.socket, *parts: bytes) -> None:
    """``sendall`` of the parts' concatenation; a large frame in gathered writes, without
    building it (a small one is cheaper to join: one plain send costs less than a gathered one)."""
    if sum(len(p) for p in parts) < _GATHER_ABOVE or not hasattr(sock, "sendmsg"):
        sock.sendall(b"".join(parts))
        return
    views = [memoryview(p) for p in parts if len(p)]
    while views:
        sent = sock.sendmsg(views)
        while sent:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0], sent = views[0][sent:], 0
