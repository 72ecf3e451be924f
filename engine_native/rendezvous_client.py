"""The client side of the rendezvous store: :class:`RendezvousClient`, which every rank uses to
publish its address and read everybody else's, and :class:`RendezvousError`, the one error it
raises for an unreachable, unauthenticated or refusing server. The wire protocol is in
:mod:`engine_native.rendezvous_wire`; the server in :mod:`engine_native.rendezvous`, which
re-exports both names. Every reply is authenticated (Note [Sealed frames] in
:mod:`engine_native.sealed_frames`) before the client parses it or returns a value from it.
"""
from __future__ import annotations

import hmac
import secrets
import socket
import struct
import threading
import time
from typing import Iterable, Optional

from .rendezvous_wire import (FRAME_CONTEXT, HANDSHAKE_TIMEOUT, MAC_SIZE, MAGIC, MAGIC_FAMILY,
                              MAX_KEYS_PER_WAIT, MISSING, NONCE_SIZE, OK, OP_GET, OP_SET, OP_WAIT,
                              check_timeout, mac, pack_key, recv_exact, unpack_missing,
                              unpack_values)
from .sealed_frames import FrameAuthError, SealedChannel

__all__ = ["RendezvousClient", "RendezvousError"]


class RendezvousError(ConnectionError):
    """The rendezvous server could not be reached, failed authentication, refused a request,
    or a frame failed authentication (the connection is then closed)."""


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
    reply_timeout : float
        How long a request waits for its reply beyond the time the store itself may wait (a
        ``get``'s timeout): a live store answers at once, so none in time means the path to it
        is broken (a proxy swallowing frames, a stopped store) and the request fails.
    """

    def __init__(self, address: str, secret: bytes, connect_timeout: float = 30.0,
                 reply_timeout: float = 30.0) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"rendezvous address must be 'host:port', got {address!r}")
        self._addr = (host.strip("[]"), int(port))
        if not isinstance(secret, (bytes, bytearray)) or not secret:
            raise ValueError("RendezvousClient: secret must be non-empty bytes")
        self._secret = bytes(secret)
        self._connect_timeout = connect_timeout
        self._reply_timeout = reply_timeout
        self._channel: Optional[SealedChannel] = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RendezvousClient('{self._addr[0]}:{self._addr[1]}')"

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (overwrites)."""
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"rendezvous set({key!r}): value must be bytes, "
                            f"got {type(value).__name__}")
        status, body = self._request(OP_SET, pack_key(key) + bytes(value), 0.0)
        if status != OK:
            reason = body.decode(errors="replace")
            raise RendezvousError(f"rendezvous set({key!r}) refused: {reason}")

    def get(self, key: str, timeout: float = 30.0) -> bytes:
        """Return the value of ``key``, waiting up to ``timeout`` seconds for it to be set.

        Raises
        ------
        TimeoutError
            The key was not set in time; the message names it.
        """
        body = struct.pack("!d", check_timeout(timeout)) + pack_key(key)
        return self._wait_reply(OP_GET, body, [key], timeout)[0]

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
        if len(keys) > MAX_KEYS_PER_WAIT:
            values: list[bytes] = []
            deadline = time.monotonic() + check_timeout(timeout)
            for i in range(0, len(keys), MAX_KEYS_PER_WAIT):
                values += self.wait_all(keys[i:i + MAX_KEYS_PER_WAIT],
                                        max(0.0, deadline - time.monotonic()))
            return values
        body = struct.pack("!dH", check_timeout(timeout), len(keys))
        body += b"".join(pack_key(k) for k in keys)
        return self._wait_reply(OP_WAIT, body, keys, timeout)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.sock.close()
                self._channel = None

    def __enter__(self) -> "RendezvousClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------
    def _wait_reply(self, op: int, body: bytes, keys: list[str], timeout: float) -> list[bytes]:
        status, reply = self._request(op, body, timeout)
        try:
            if status == MISSING:
                missing = unpack_missing(reply)
            elif status == OK:
                return unpack_values(reply, len(keys))
        except ValueError as exc:  # UnicodeDecodeError too: a key that is not UTF-8
            raise RendezvousError(f"rendezvous {self._addr[0]}:{self._addr[1]}: malformed "
                                  f"reply ({exc})") from None
        if status == MISSING:
            shown = ", ".join(repr(k) for k in missing[:10])
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            raise TimeoutError(f"rendezvous {self._addr[0]}:{self._addr[1]}: key(s) {shown}{more} "
                               f"not set within {timeout:g} s")
        raise RendezvousError(f"rendezvous request failed: {reply.decode(errors='replace')}")

    def _request(self, op: int, body: bytes, store_wait: float) -> tuple[int, bytes]:
        """One request and its reply; ``store_wait``: how long the store may hold the reply."""
        with self._lock:
            channel = self._connected()
            where = f"rendezvous {self._addr[0]}:{self._addr[1]}"
            try:
                channel.sock.settimeout(store_wait + self._reply_timeout)
                channel.send(op, body)
                return channel.recv(1 << 31)  # verified before anything reads the reply
            except FrameAuthError as exc:
                self._drop(channel)
                raise RendezvousError(
                    f"{where}: reply {exc}; connection closed. Something between this process "
                    f"and the store changed its bytes, or it is not this job's store: check "
                    f"HVD_RENDEZVOUS and the network path to the launcher") from exc
            except (OSError, ConnectionError, ValueError) as exc:  # ValueError: oversized frame
                self._drop(channel)
                raise RendezvousError(
                    f"{where}: connection lost ({exc}); the store also closes a connection "
                    f"whose frames fail authentication, so if it is still running check its "
                    f"log and the network path to it") from exc

    def _drop(self, channel: SealedChannel) -> None:
        channel.sock.close()
        self._channel = None  # the next request reconnects

    def _connected(self) -> SealedChannel:
        if self._channel is not None:
            return self._channel
        deadline = time.monotonic() + self._connect_timeout
        delay = 0.05
        while True:
            try:
                sock = socket.create_connection(self._addr, timeout=HANDSHAKE_TIMEOUT)
                break
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    raise RendezvousError(
                        f"cannot reach rendezvous server {self._addr[0]}:{self._addr[1]} within "
                        f"{self._connect_timeout:g} s ({exc}); is the launcher running?") from exc
                time.sleep(delay)  # back-off between connection attempts, not a poll loop
                delay = min(delay * 2, 1.0)
        try:
            channel = self._authenticate(sock)
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._channel = channel
        return channel

    def _authenticate(self, sock: socket.socket) -> SealedChannel:
        hello = recv_exact(sock, len(MAGIC) + NONCE_SIZE)
        if hello[:len(MAGIC)] != MAGIC:
            if hello.startswith(MAGIC_FAMILY):
                theirs = hello[:len(MAGIC)].rstrip(b"\0").decode(errors="replace")
                ours = MAGIC.rstrip(b"\0").decode()
                raise RendezvousError(
                    f"rendezvous {self._addr[0]}:{self._addr[1]} speaks protocol {theirs}, this "
                    f"client {ours}: the launcher and the ranks run "
                    f"different hvd-magic versions; install the same version on both")
            raise RendezvousError(f"{self._addr[0]}:{self._addr[1]} is not a rendezvous server")
        server_nonce = hello[len(MAGIC):]
        client_nonce = secrets.token_bytes(NONCE_SIZE)
        sock.sendall(client_nonce + mac(self._secret, b"client", server_nonce, client_nonce))
        try:
            proof = recv_exact(sock, MAC_SIZE)
        except ConnectionError as exc:
            raise RendezvousError("rendezvous server rejected this client: wrong secret "
                                  "(check HVD_SECRET)") from exc
        expected = mac(self._secret, b"server", server_nonce, client_nonce)
        if not hmac.compare_digest(proof, expected):
            raise RendezvousError("rendezvous server failed authentication: it does not know "
                                  "the job secret")
        return SealedChannel(sock, self._secret, server_nonce, client_nonce, is_server=False,
                             context=FRAME_CONTEXT)
