"""Rank output from Spark tasks to the driver: a small authenticated line stream over TCP.

A Spark task's stdout ends in the executor's log, not in the notebook. Each barrier task (see
hvd_magic.spark.task) therefore connects to a :class:`LogServer` on the driver and sends its
rank's lines and, at the end, the rank's exit code; the driver shows the lines with rank
prefixes and uses exit codes to fail fast.

Protocol (big-endian), mutual HMAC-SHA256 proof of the job secret before anything is trusted:

A. Server sends ``MAGIC`` + a 32-byte server nonce.
B. Client sends rank:u32 + a 32-byte client nonce + HMAC(secret, "log-client" + nonces + rank).
C. Server checks it (else drops the connection) and answers HMAC(secret, "log-server" + nonces
   + rank), which the client checks.
D. Task to driver only, sealed frames (Note [Sealed frames] in
   :mod:`engine_native.sealed_frames`, context ``"log" | rank``): ``kind:u8 | length:u32 | body
   | tag:32`` (body at most 1 MiB, UTF-8): ``HELLO`` (the task's host), ``STDOUT``/``STDERR``
   (one line), ``EXIT`` (the exit code). The tag is an HMAC-SHA256 under a key of this
   connection over the direction, the frame's sequence number, kind, length and body, so every
   byte after the handshake is authenticated, and the rank too (it is in the handshake MAC and
   the key). The driver checks the length before reading the body and the tag before decoding
   it: a line, hello or exit code that was altered, injected, replayed or reordered is never
   shown or acted on; it closes the connection with a log line naming the frame and rank (the
   rank is then reported "closed"), as does anything malformed, never the server.

``MAGIC`` is ``HVDLOG2``; a task and a driver of different versions fail at step A, by name.
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
from collections.abc import Callable

from engine_native.sealed_frames import FrameAuthError, SealedChannel, recv_exact

__all__ = ["EXIT", "HELLO", "STDERR", "STDOUT", "LogClient", "LogServer"]

log = logging.getLogger(__name__)

MAGIC = b"HVDLOG2\0"
_MAGIC_FAMILY = b"HVDLOG"
HELLO, STDOUT, STDERR, EXIT = 1, 2, 3, 4
KINDS = {HELLO: "hello", STDOUT: "stdout", STDERR: "stderr", EXIT: "exit"}
_NONCE = 32
_MAX_BODY = 1 << 20
_HANDSHAKE_TIMEOUT = 10.0


def _mac(secret: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes, rank: int) -> bytes:
    return hmac.new(secret, role + server_nonce + client_nonce + struct.pack("!I", rank),
                    hashlib.sha256).digest()


def _channel(sock: socket.socket, secret: bytes, server_nonce: bytes, client_nonce: bytes,
             rank: int, is_server: bool) -> SealedChannel:
    return SealedChannel(sock, secret, server_nonce, client_nonce, is_server=is_server,
                         context=b"log" + struct.pack("!I", rank))


class LogServer:
    """Accepts task connections; calls ``on_message(rank, kind, text)`` from reader threads
    (``kind`` one of "hello", "stdout", "stderr", "exit", and "closed" when a task's
    connection ends)."""

    def __init__(self, secret: bytes, on_message: Callable[[int, str, str], None],
                 host: str = "127.0.0.1"):
        self._secret = secret
        self._on_message = on_message
        self._listener = socket.create_server((host, 0), backlog=128)
        self.address = (host, self._listener.getsockname()[1])
        self._stopping = False
        self._conns: set = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="hvd-spark-logs", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True,
                             name="hvd-spark-log-conn").start()

    def _serve(self, conn: socket.socket, peer) -> None:
        with self._lock:
            self._conns.add(conn)
        rank = None
        try:
            accepted = self._handshake(conn)
            if accepted is None:
                return
            rank, channel = accepted
            conn.settimeout(None)
            while True:
                kind, body = channel.recv(_MAX_BODY)  # verified before it is decoded
                if kind not in KINDS:
                    raise ValueError(f"bad frame (kind {kind})")
                self._on_message(rank, KINDS[kind], body.decode("utf-8", errors="replace"))
        except FrameAuthError as exc:
            if not self._stopping:
                log.warning("spark log channel: frame %d from rank %s (%s) failed "
                            "authentication (altered, replayed or out of order); connection "
                            "closed", exc.seq, rank, peer)
        except (OSError, ConnectionError, ValueError, struct.error) as exc:
            if rank is not None and not isinstance(exc, ConnectionError) and not self._stopping:
                log.warning("spark log channel: dropped rank %s (%s): %s", rank, peer, exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            if rank is not None:
                self._on_message(rank, "closed", "")

    def _handshake(self, conn: socket.socket) -> tuple[int, SealedChannel] | None:
        server_nonce = secrets.token_bytes(_NONCE)
        try:
            conn.settimeout(_HANDSHAKE_TIMEOUT)
            conn.sendall(MAGIC + server_nonce)
            reply = recv_exact(conn, 4 + _NONCE + 32)
        except (OSError, ConnectionError):
            return None
        (rank,) = struct.unpack_from("!I", reply, 0)
        client_nonce, proof = reply[4:4 + _NONCE], reply[4 + _NONCE:]
        if not hmac.compare_digest(proof, _mac(self._secret, b"log-client", server_nonce,
                                                 client_nonce, rank)):
            if not self._stopping:
                log.warning("spark log channel: connection failed authentication, dropped")
            return None
        conn.sendall(_mac(self._secret, b"log-server", server_nonce, client_nonce, rank))
        return rank, _channel(conn, self._secret, server_nonce, client_nonce, rank, True)

    def stop(self) -> None:
        self._stopping = True
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class LogClient:
    """A task's end of the channel; :meth:`send` is thread-safe."""

    def __init__(self, address: str, secret: bytes, rank: int, connect_timeout: float = 60.0):
        host, _, port = address.rpartition(":")
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self._sock = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self._address = address
        self._lock = threading.Lock()  # send and close never interleave
        head = recv_exact(self._sock, len(MAGIC) + _NONCE)
        if head[:len(MAGIC)] != MAGIC:
            self._sock.close()
            if head.startswith(_MAGIC_FAMILY):
                theirs = head[:len(MAGIC)].rstrip(b"\0").decode(errors="replace")
                ours = MAGIC.rstrip(b"\0").decode()
                raise ConnectionError(f"{address}: the driver's log channel speaks {theirs}, this "
                                      f"task {ours}: the driver and the "
                                      f"executors run different hvd-magic versions; install the "
                                      f"same version on both")
            raise ConnectionError(f"{address} is not an hvd_magic log channel")
        server_nonce, client_nonce = head[len(MAGIC):], secrets.token_bytes(_NONCE)
        self._sock.sendall(struct.pack("!I", rank) + client_nonce
                           + _mac(secret, b"log-client", server_nonce, client_nonce, rank))
        proof = recv_exact(self._sock, 32)
        if not hmac.compare_digest(proof, _mac(secret, b"log-server", server_nonce,
                                               client_nonce, rank)):
            raise ConnectionError(f"{address}: the driver failed authentication")
        self._sock.settimeout(None)
        self._channel = _channel(self._sock, secret, server_nonce, client_nonce, rank, False)

    def send(self, kind: int, text: str) -> None:
        """Send one frame; ``ConnectionError`` naming the channel once the driver has closed it."""
        body = text.encode("utf-8", errors="replace")[:_MAX_BODY]
        try:
            with self._lock:
                self._channel.send(kind, body)
        except OSError as exc:
            raise ConnectionError(
                f"spark log channel {self._address}: the driver closed the connection ({exc}); "
                f"it closes a connection whose frames fail authentication (altered, replayed or "
                f"out of order on the way), so if the driver is still running check its log "
                f"and the network path between this executor and the driver") from exc

    def close(self) -> None:
        with self._lock:
            try:
                self._sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self._sock.close()

    def __enter__(self) -> LogClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
