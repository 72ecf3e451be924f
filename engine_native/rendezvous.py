"""A small authenticated key-value store for bootstrapping ranks without MPI.

The launcher (``hvdrun``, ``hvd_magic.run``, the test harness) runs a :class:`RendezvousServer`;
every rank reaches it through :class:`RendezvousClient` (``HVD_RENDEZVOUS=host:port``,
``HVD_SECRET``) to publish its address and read everybody else's. Values are opaque bytes.

Protocol (one TCP connection per client, big-endian):

A. Server sends ``MAGIC`` + a 32-byte server nonce.
B. Client sends a 32-byte client nonce + HMAC-SHA256(secret, "client" + both nonces).
C. Server checks it (constant time); on failure the connection is dropped and logged. Otherwise
   it answers HMAC-SHA256(secret, "server" + both nonces), which the client checks in turn, so a
   rank never trusts addresses from a server that does not know the secret either.
D. Requests and replies are frames ``op:u8 | length:u32 | body``, body at most
   ``max_value_bytes`` + 64 KiB; anything malformed drops the connection, never the server.

Blocking reads wait on a condition variable on the server (no polling anywhere).
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import socket
import struct
import threading
import time
from typing import Callable, Iterable, Optional

__all__ = ["RendezvousServer", "RendezvousClient", "RendezvousError"]

log = logging.getLogger(__name__)

MAGIC = b"HVDRDV1\0"
_NONCE = 32
_MAC = 32
_FRAME = struct.Struct("!BI")
_OP_SET, _OP_GET, _OP_WAIT = 1, 2, 3
_OK, _MISSING, _ERROR = 0, 1, 2
_MAX_KEY = 1024
_MAX_KEYS_PER_WAIT = 4096
_HANDSHAKE_TIMEOUT = 5.0
_MAX_CONNECTIONS = 256
_MAX_WAIT_SECONDS = 24 * 3600.0


class RendezvousError(ConnectionError):
    """The rendezvous server could not be reached, failed authentication or refused a request."""


def _mac(secret: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, role + server_nonce + client_nonce, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


def _send_frame(sock: socket.socket, op: int, body: bytes) -> None:
    sock.sendall(_FRAME.pack(op, len(body)) + body)


def _recv_frame(sock: socket.socket, max_body: int) -> tuple[int, bytes]:
    op, length = _FRAME.unpack(_recv_exact(sock, _FRAME.size))
    if length > max_body:
        raise ValueError(f"frame of {length} bytes exceeds the limit of {max_body}")
    return op, _recv_exact(sock, length)


def _pack_key(key: str) -> bytes:
    raw = key.encode("utf-8")
    if not raw or len(raw) > _MAX_KEY:
        raise ValueError(f"rendezvous key must be 1..{_MAX_KEY} UTF-8 bytes, got {len(raw)}")
    return struct.pack("!H", len(raw)) + raw


def _unpack_key(body: bytes, pos: int) -> tuple[str, int]:
    if pos + 2 > len(body):
        raise ValueError("truncated key")
    (n,) = struct.unpack_from("!H", body, pos)
    if n == 0 or n > _MAX_KEY or pos + 2 + n > len(body):
        raise ValueError("bad key length")
    return body[pos + 2:pos + 2 + n].decode("utf-8"), pos + 2 + n


def _check_timeout(timeout: float) -> float:
    if not (timeout >= 0.0) or timeout > _MAX_WAIT_SECONDS:  # also rejects NaN
        raise ValueError(f"timeout must be in [0, {_MAX_WAIT_SECONDS:.0f}] seconds, got {timeout}")
    return timeout


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
                 handshake_timeout: float = _HANDSHAKE_TIMEOUT,
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
            if self._handshake(conn, peer):
                conn.settimeout(None)
                self._request_loop(conn, peer)
        finally:
            with self._cond:
                self._conns.discard(conn)
            conn.close()
            self._slots.release()

    def _handshake(self, conn: socket.socket, peer: object) -> bool:
        server_nonce = secrets.token_bytes(_NONCE)
        try:
            conn.settimeout(self._handshake_timeout)
            conn.sendall(MAGIC + server_nonce)
            reply = _recv_exact(conn, _NONCE + _MAC)
        except (OSError, ConnectionError) as exc:
            self._reject(peer, f"handshake incomplete ({exc})")
            return False
        client_nonce, proof = reply[:_NONCE], reply[_NONCE:]
        expected = _mac(self._secret, b"client", server_nonce, client_nonce)
        if not hmac.compare_digest(proof, expected):
            self._reject(peer, "failed authentication (wrong secret or not a rendezvous client)")
            return False
        try:
            conn.sendall(_mac(self._secret, b"server", server_nonce, client_nonce))
        except OSError:
            return False
        return True

    def _reject(self, peer: object, why: str) -> None:
        with self._cond:
            self.rejected += 1
        if not self._stopping:
            log.warning("rendezvous: dropped connection from %s: %s", peer, why)

    def _request_loop(self, conn: socket.socket, peer: object) -> None:
        while not self._stopping:
            try:
                op, body = _recv_frame(conn, self._max_frame)
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
                _send_frame(conn, status, reply)
            except OSError:
                return

    def _dispatch(self, op: int, body: bytes) -> tuple[int, bytes]:
        if op == _OP_SET:
            key, pos = _unpack_key(body, 0)
            return self._set(key, body[pos:])
        if op == _OP_GET:
            (timeout,) = struct.unpack_from("!d", body, 0)
            key, pos = _unpack_key(body, 8)
            if pos != len(body):
                raise ValueError("trailing bytes")
            return self._wait([key], _check_timeout(timeout))
        if op == _OP_WAIT:
            timeout, count = struct.unpack_from("!dH", body, 0)
            if count == 0 or count > _MAX_KEYS_PER_WAIT:
                raise ValueError(f"bad key count {count}")
            keys, pos = [], 10
            for _ in range(count):
                key, pos = _unpack_key(body, pos)
                keys.append(key)
            if pos != len(body):
                raise ValueError("trailing bytes")
            return self._wait(keys, _check_timeout(timeout))
        raise ValueError(f"unknown op {op}")

    def _set(self, key: str, value: bytes) -> tuple[int, bytes]:
        if len(value) > self._max_value:
            return _ERROR, f"value for {key!r} exceeds {self._max_value} bytes".encode()
        with self._cond:
            old = self._store.get(key)
            freed = 0 if old is None else len(old) + len(key)
            total = self._total + len(value) + len(key) - freed
            if total > self._max_total:
                return _ERROR, f"store full ({self._max_total} bytes)".encode()
            self._store[key] = value
            self._total = total
            self._cond.notify_all()
        if self._on_set is not None:
            self._on_set(key)
        return _OK, b""

    def _wait(self, keys: list[str], timeout: float) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                missing = [k for k in keys if k not in self._store]
                if not missing:
                    values = [self._store[k] for k in keys]
                    return _OK, b"".join(struct.pack("!I", len(v)) + v for v in values)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopping:
                    return _MISSING, struct.pack("!H", len(missing)) + b"".join(
                        _pack_key(k) for k in missing)
                self._cond.wait(remaining)


class RendezvousClient:
    """Client of a :class:`RendezvousServer`; thread-safe, one connection, reconnects lazily.

    Parameters
    ----------
    address : str
        ``"host:port"`` (``"[::1]:port"`` for IPv6), e.g. the value of ``HVD_RENDEZVOUS``.
    secret : bytes
        The job's secret (``bytes.fromhex(os.environ["HVD_SECRET"])``).
    connect_timeout : float
        How long to keep retrying while the server is not reachable yet.
    """

    def __init__(self, address: str, secret: bytes, connect_timeout: float = 30.0) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"rendezvous address must be 'host:port', got {address!r}")
        self._addr = (host.strip("[]"), int(port))
        if not isinstance(secret, (bytes, bytearray)) or not secret:
            raise ValueError("RendezvousClient: secret must be non-empty bytes")
        self._secret = bytes(secret)
        self._connect_timeout = connect_timeout
        self._sock: Optional[socket.socket] = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RendezvousClient('{self._addr[0]}:{self._addr[1]}')"

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (overwrites)."""
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"rendezvous set({key!r}): value must be bytes, "
                            f"got {type(value).__name__}")
        status, body = self._request(_OP_SET, _pack_key(key) + bytes(value), None)
        if status != _OK:
            reason = body.decode(errors="replace")
            raise RendezvousError(f"rendezvous set({key!r}) refused: {reason}")

    def get(self, key: str, timeout: float = 30.0) -> bytes:
        """Return the value of ``key``, waiting up to ``timeout`` seconds for it to be set.

        Raises
        ------
        TimeoutError
            The key was not set in time; the message names it.
        """
        body = struct.pack("!d", _check_timeout(timeout)) + _pack_key(key)
        return self._wait_reply(_OP_GET, body, [key], timeout)[0]

    def wait_all(self, keys: Iterable[str], timeout: float = 30.0) -> list[bytes]:
        """Return the values of all ``keys`` (in order) once every one is set.

        Raises
        ------
        TimeoutError
            Some keys were not set in time; the message names them.
        """
        keys = list(keys)
        if not keys:
            return []
        if len(keys) > _MAX_KEYS_PER_WAIT:
            values: list[bytes] = []
            deadline = time.monotonic() + _check_timeout(timeout)
            for i in range(0, len(keys), _MAX_KEYS_PER_WAIT):
                values += self.wait_all(keys[i:i + _MAX_KEYS_PER_WAIT],
                                        max(0.0, deadline - time.monotonic()))
            return values
        body = struct.pack("!dH", _check_timeout(timeout), len(keys))
        body += b"".join(_pack_key(k) for k in keys)
        return self._wait_reply(_OP_WAIT, body, keys, timeout)

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def __enter__(self) -> "RendezvousClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------
    def _wait_reply(self, op: int, body: bytes, keys: list[str], timeout: float) -> list[bytes]:
        status, reply = self._request(op, body, timeout)
        if status == _MISSING:
            (count,) = struct.unpack_from("!H", reply, 0)
            missing, pos = [], 2
            for _ in range(count):
                key, pos = _unpack_key(reply, pos)
                missing.append(key)
            shown = ", ".join(repr(k) for k in missing[:10])
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            raise TimeoutError(f"rendezvous {self._addr[0]}:{self._addr[1]}: key(s) {shown}{more} "
                               f"not set within {timeout:g} s")
        if status != _OK:
            raise RendezvousError(f"rendezvous request failed: {reply.decode(errors='replace')}")
        values, pos = [], 0
        for _ in keys:
            (n,) = struct.unpack_from("!I", reply, pos)
            values.append(reply[pos + 4:pos + 4 + n])
            pos += 4 + n
        return values

    def _request(self, op: int, body: bytes, timeout: Optional[float]) -> tuple[int, bytes]:
        with self._lock:
            sock = self._connected()
            try:
                sock.settimeout(None if timeout is None else timeout + 30.0)
                _send_frame(sock, op, body)
                return _recv_frame(sock, 1 << 31)
            except (OSError, ConnectionError) as exc:
                sock.close()
                self._sock = None  # the next request reconnects
                raise RendezvousError(f"rendezvous {self._addr[0]}:{self._addr[1]}: "
                                      f"connection lost ({exc})") from exc

    def _connected(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        deadline = time.monotonic() + self._connect_timeout
        delay = 0.05
        while True:
            try:
                sock = socket.create_connection(self._addr, timeout=_HANDSHAKE_TIMEOUT)
                break
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    raise RendezvousError(
                        f"cannot reach rendezvous server {self._addr[0]}:{self._addr[1]} within "
                        f"{self._connect_timeout:g} s ({exc}); is the launcher running?") from exc
                time.sleep(delay)  # back-off between connection attempts, not a poll loop
                delay = min(delay * 2, 1.0)
        try:
            self._authenticate(sock)
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        return sock

    def _authenticate(self, sock: socket.socket) -> None:
        hello = _recv_exact(sock, len(MAGIC) + _NONCE)
        if hello[:len(MAGIC)] != MAGIC:
            raise RendezvousError(f"{self._addr[0]}:{self._addr[1]} is not a rendezvous server")
        server_nonce = hello[len(MAGIC):]
        client_nonce = secrets.token_bytes(_NONCE)
        sock.sendall(client_nonce + _mac(self._secret, b"client", server_nonce, client_nonce))
        try:
            proof = _recv_exact(sock, _MAC)
        except ConnectionError as exc:
            raise RendezvousError("rendezvous server rejected this client: wrong secret "
                                  "(check HVD_SECRET)") from exc
        expected = _mac(self._secret, b"server", server_nonce, client_nonce)
        if not hmac.compare_digest(proof, expected):
            raise RendezvousError("rendezvous server failed authentication: it does not know "
                                  "the job secret")
