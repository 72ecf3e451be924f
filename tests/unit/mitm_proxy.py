"""A tampering man in the middle for the sealed-frame tests: an in-process TCP relay on loopback
between a real client and a real server. It passes each connection's handshake through
untouched, then cuts the byte stream into frames (``op:u8 | length:u32 | body | tag:32``) and
hands every frame to ``tamper(conn, direction, seq, frame)``, which returns the frames to
forward instead (possibly none, several, altered or forged).

``conn`` counts accepted connections from 0, ``direction`` is ``C2S`` or ``S2C``, ``seq`` counts
the frames that arrived in that direction on that connection. When either side closes, both
sockets of that connection are shut down, and closed once both directions stopped, so a peer
learns of it promptly; :attr:`TamperingProxy.closed` holds one event per connection, set once
both of its sockets are closed.

:func:`old_protocol_server` is the other end a version check needs: a server that opens its
handshake with an older protocol's magic.
"""
from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
from typing import Callable

C2S, S2C = "c2s", "s2c"
HEADER = struct.Struct("!BI")
TAG = 32

Tamper = Callable[[int, str, int, bytes], list]
NONCE = 32


def frame(op: int, body: bytes, tag: bytes = bytes(TAG)) -> bytes:
    """A well-formed frame with whatever tag the caller chooses (zeros: a forger's guess)."""
    return HEADER.pack(op, len(body)) + body + tag


def split(frame_bytes: bytes) -> tuple[int, bytes, bytes]:
    """``(op, body, tag)`` of a frame."""
    op, length = HEADER.unpack_from(frame_bytes)
    return op, frame_bytes[HEADER.size:HEADER.size + length], frame_bytes[HEADER.size + length:]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


class TamperingProxy:
    def __init__(self, upstream: tuple[str, int], handshake: tuple[list, list],
                 tamper: Tamper) -> None:
        """``handshake``: the sizes of the handshake's messages client to server, and server to
        client, each forwarded whole as soon as it arrived."""
        self._upstream = upstream
        self._handshake = {C2S: handshake[0], S2C: handshake[1]}
        self._tamper = tamper
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self._listener.getsockname()[1]
        self.closed: list[threading.Event] = []
        self._socks: list[socket.socket] = []
        self._pumps_left: list[int] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="mitm-accept").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            with self._lock:
                conn = len(self.closed)
                self.closed.append(threading.Event())
                self._pumps_left.append(2)
                self._socks += [client, server]
            for direction, src, dst in ((C2S, client, server), (S2C, server, client)):
                threading.Thread(target=self._pump, args=(conn, direction, src, dst, client,
                                                          server), daemon=True).start()

    def _pump(self, conn: int, direction: str, src: socket.socket, dst: socket.socket,
              client: socket.socket, server: socket.socket) -> None:
        try:
            for size in self._handshake[direction]:
                dst.sendall(_recv_exact(src, size))
            seq = 0
            while True:
                header = _recv_exact(src, HEADER.size)
                rest = _recv_exact(src, HEADER.unpack(header)[1] + TAG)
                for out in self._tamper(conn, direction, seq, header + rest):
                    dst.sendall(out)
                seq += 1
        except OSError:
            pass
        finally:
            for sock in (client, server):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                self._pumps_left[conn] -= 1
                last = self._pumps_left[conn] == 0
            if last:
                client.close()
                server.close()
                self.closed[conn].set()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for sock in socks:
            sock.close()

    def __enter__(self) -> "TamperingProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def old_protocol_server(magic: bytes):
    """Yield the ``host:port`` of a loopback server that answers one connection the way a
    server of another protocol version opens its handshake (``magic`` and a nonce), then waits
    for the client to hang up."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def serve():
            conn, _ = listener.accept()
            with conn:
                conn.sendall(magic + os.urandom(NONCE))
                conn.recv(1)

        thread = threading.Thread(target=serve)
        thread.start()
        yield f"127.0.0.1:{listener.getsockname()[1]}"
        thread.join(10)
