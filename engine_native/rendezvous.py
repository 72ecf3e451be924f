"""A small authenticated key-value store for bootstrapping ranks without MPI: the server.

The launcher (``hvdrun``, ``hvd_magic.run``, the test harness) runs a :class:`RendezvousServer`;
every rank reaches it through :class:`RendezvousClient` (``HVD_RENDEZVOUS=host:port``,
``HVD_SECRET``) to publish its address and read everybody else's. Values are opaque bytes.
The client lives in :mod:`engine_native.rendezvous_client` and the protocol (handshake, frames,
keys) in :mod:`engine_native.rendezvous_wire`; both client names are importable from here.
Every frame after the handshake is authenticated (Note [Sealed frames] in
:mod:`engine_native.sealed_frames`): a request is parsed and acted on only once its tag
verifies, and a frame that fails closes that connection with a log line naming it.

Blocking reads wait on a condition variable on the server (no polling anywhere).
"""
from __future__ import annotations

import hmac
import logging
import secrets
import socket
import struct
import threading
import time
from typing import Callable, Optional

from .rendezvous_client import RendezvousClient, RendezvousError
from .rendezvous_wire import (ERROR, FRAME_CONTEXT, HANDSHAKE_TIMEOUT, MAC_SIZE, MAGIC,
                              MAX_KEYS_PER_WAIT, MISSING, NONCE_SIZE, OK, OP_GET, OP_SET, OP_WAIT,
                              check_timeout, mac, pack_key, pack_values, recv_exact,
                              unpack_key)
from .sealed_frames import FrameAuthError, SealedChannel

__all__ = ["RendezvousServer", "RendezvousClient", "RendezvousError"]

log = logging.getLogger(__name__)

_MAX_CONNECTIONS = 256


class RendezvousServer:
    """Authenticated key-value store served over TCP.

    Parameters
    ----------
    secret : bytes
        Per-job secret every client must prove knowledge of.
    host : str
        Interface to bind (loopback by default).
    port : int
        Port to bind; 0 picks a free one (see :meth:`start`'s return value).
    max_value_bytes : int
        Largest value accepted by ``set``.
    max_total_bytes : int
        Upper bound on the bytes held by the store; a ``set`` beyond it is refused.
    handshake_timeout : float
        Seconds a new connection has to authenticate before it is dropped.

    Examples
    --------
    >>> with RendezvousServer(b"s3cret") as server:
    ...     client = RendezvousClient("%s:%d" % server.address, b"s3cret")
    ...     client.set("rank0", b"10.0.0.1:4000")
    ...     client.get("rank0", timeout=1.0)
    b'10.0.0.1:4000'
    """

    def __init__(self, secret: bytes, host: str = "127.0.0.1", port: int = 0, *,
                 max_value_bytes: int = 1 << 20, max_total_bytes: int = 64 << 20,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT,
                 on_set: Optional[Callable[[str], None]] = None) -> None:
        if not isinstance(secret, (bytes, bytearray)) or not secret:
            raise ValueError("RendezvousServer: secret must be non-empty bytes")
        self._secret = bytes(secret)
        self._bind = (host, port)
        self._max_value = max_value_bytes
        self._max_total = max_total_bytes
        self._max_frame = max_value_bytes + 65536
        self._handshake_timeout = handshake_timeout
        self._on_set = on_set  # called with the key after every client set (server thread)
        self._store: dict[str, bytes] = {}
        self._total = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._listener: Optional[socket.socket] = None
        self._accept_thread: Optional[threading.Thread] = None
        self._conns: set[socket.socket] = set()
        self._slots = threading.BoundedSemaphore(_MAX_CONNECTIONS)
        self.address: Optional[tuple[str, int]] = None
        self.rejected = 0  # connections dropped for failed authentication or bad frames

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> tuple[str, int]:
        """Bind, listen and serve in background threads; returns ``(host, port)``."""
        if self._listener is not None:
            raise RuntimeError("RendezvousServer already started")
        family = socket.AF_INET6 if ":" in self._bind[0] else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(self._bind)
        listener.listen(128)
        self._listener = listener
        self.address = (self._bind[0], listener.getsockname()[1])
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                               name="hvd-rendezvous-accept")
        self._accept_thread.start()
        log.debug("rendezvous server listening on %s:%d", *self.address)
        return self.address

    def stop(self) -> None:
        """Stop accepting, close every connection and wake every blocked request."""
        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            self._cond.notify_all()
            conns = list(self._conns)
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5.0)

    def __enter__(self) -> "RendezvousServer":
        if self._listener is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def keys(self) -> list[str]:
        """The keys currently stored (for diagnostics)."""
        with self._cond:
            return sorted(self._store)

    # -- serving -----------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._listener is not None
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # listener closed by stop()
            if self._stopping:
                conn.close()
                return
            if not self._slots.acquire(blocking=False):
                log.warning("rendezvous: too many connections, dropping %s", peer)
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True,
                             name="hvd-rendezvous-conn").start()

    def _serve(self, conn: socket.socket, peer: object) -> None:
        with self._cond:
            self._conns.add(conn)
        try:
            channel = self._handshake(conn, peer)
            if channel is not None:
                conn.settimeout(None)
                self._request_loop(channel, peer)
        finally:
            with self._cond:
                self._conns.discard(conn)
            conn.close()
            self._slots.release()

    def _handshake(self, conn: socket.socket, peer: object) -> Optional[SealedChannel]:
        server_nonce = secrets.token_bytes(NONCE_SIZE)
        try:
            conn.settimeout(self._handshake_timeout)
            conn.sendall(MAGIC + server_nonce)
            reply = recv_exact(conn, NONCE_SIZE + MAC_SIZE)
        except (OSError, ConnectionError) as exc:
            self._reject(peer, f"handshake incomplete ({exc})")
            return None
        client_nonce, proof = reply[:NONCE_SIZE], reply[NONCE_SIZE:]
        expected = mac(self._secret, b"client", server_nonce, client_nonce)
        if not hmac.compare_digest(proof, expected):
            self._reject(peer, "failed authentication (wrong secret or not a rendezvous client)")
            return None
        try:
            conn.sendall(mac(self._secret, b"server", server_nonce, client_nonce))
        except OSError:
            return None
        return SealedChannel(conn, self._secret, server_nonce, client_nonce, is_server=True,
                             context=FRAME_CONTEXT)

    def _reject(self, peer: object, why: str) -> None:
        with self._cond:
            self.rejected += 1
        if not self._stopping:
            log.warning("rendezvous: dropped connection from %s: %s", peer, why)

    def _reject_frame(self, peer: object, exc: FrameAuthError) -> None:
        with self._cond:
            self.rejected += 1
        if not self._stopping:
            where = "%s:%s" % peer[:2] if isinstance(peer, tuple) else peer
            log.warning("rendezvous: frame %d from %s failed authentication (altered, replayed "
                        "or out of order); connection closed", exc.seq, where)

    def _request_loop(self, channel: SealedChannel, peer: object) -> None:
        while not self._stopping:
            try:
                op, body = channel.recv(self._max_frame)  # verified before anything parses it
            except FrameAuthError as exc:
                self._reject_frame(peer, exc)
                return
            except ConnectionError:
                return  # client went away
            except (OSError, ValueError, struct.error) as exc:
                self._reject(peer, f"bad frame ({exc})")
                return
            try:
                status, reply = self._dispatch(op, body)
            except (ValueError, UnicodeDecodeError, struct.error) as exc:
                self._reject(peer, f"malformed request ({exc})")
                return
            try:
                channel.send(status, reply)
            except OSError:
                return

    def _dispatch(self, op: int, body: bytes) -> tuple[int, bytes]:
        if op == OP_SET:
            key, pos = unpack_key(body, 0)
            return self._set(key, body[pos:])
        if op == OP_GET:
            (timeout,) = struct.unpack_from("!d", body, 0)
            key, pos = unpack_key(body, 8)
            if pos != len(body):
                raise ValueError("trailing bytes")
            return self._wait([key], check_timeout(timeout))
        if op == OP_WAIT:
            timeout, count = struct.unpack_from("!dH", body, 0)
            if count == 0 or count > MAX_KEYS_PER_WAIT:
                raise ValueError(f"bad key count {count}")
            keys, pos = [], 10
            for _ in range(count):
                key, pos = unpack_key(body, pos)
                keys.append(key)
            if pos != len(body):
                raise ValueError("trailing bytes")
            return self._wait(keys, check_timeout(timeout))
        raise ValueError(f"unknown op {op}")

    def _set(self, key: str, value: bytes) -> tuple[int, bytes]:
        if len(value) > self._max_value:
            return ERROR, f"value for {key!r} exceeds {self._max_value} bytes".encode()
        with self._cond:
            old = self._store.get(key)
            freed = 0 if old is None else len(old) + len(key)
            total = self._total + len(value) + len(key) - freed
            if total > self._max_total:
                return ERROR, f"store full ({self._max_total} bytes)".encode()
            self._store[key] = value
            self._total = total
            self._cond.notify_all()
        if self._on_set is not None:
            self._on_set(key)
        return OK, b""

    def _wait(self, keys: list[str], timeout: float) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                missing = [k for k in keys if k not in self._store]
                if not missing:
                    values = [self._store[k] for k in keys]
                    return OK, pack_values(values)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopping:
                    return MISSING, struct.pack("!H", len(missing)) + b"".join(
                        pack_key(k) for k in missing)
                self._cond.wait(remaining)
