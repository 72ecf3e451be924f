"""The rendezvous store's wire protocol: the handshake MAC, frames and the key codec, shared
by the server (:mod:`engine_native.rendezvous`) and the client
(:mod:`engine_native.rendezvous_client`).

Protocol (one TCP connection per client, big-endian):

A. Server sends ``MAGIC`` + a 32-byte server nonce.
B. Client sends a 32-byte client nonce + HMAC-SHA256(secret, "client" + both nonces).
C. Server checks it (constant time); on failure the connection is dropped and logged. Otherwise
   it answers HMAC-SHA256(secret, "server" + both nonces), which the client checks in turn, so a
   rank never trusts addresses from a server that does not know the secret either.
D. Requests and replies are frames ``op:u8 | length:u32 | body``, body at most
   ``max_value_bytes`` + 64 KiB; anything malformed drops the connection, never the server.
"""
from __future__ import annotations

import hashlib
import hmac
import socket
import struct

MAGIC = b"HVDRDV1\0"
NONCE_SIZE = 32
MAC_SIZE = 32
FRAME = struct.Struct("!BI")
OP_SET, OP_GET, OP_WAIT = 1, 2, 3
OK, MISSING, ERROR = 0, 1, 2
MAX_KEY = 1024
MAX_KEYS_PER_WAIT = 4096
HANDSHAKE_TIMEOUT = 5.0
MAX_WAIT_SECONDS = 24 * 3600.0


def mac(secret: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, role + server_nonce + client_nonce, hashlib.sha256).digest()


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


def send_frame(sock: socket.socket, op: int, body: bytes) -> None:
    sock.sendall(FRAME.pack(op, len(body)) + body)


def recv_frame(sock: socket.socket, max_body: int) -> tuple[int, bytes]:
    op, length = FRAME.unpack(recv_exact(sock, FRAME.size))
    if length > max_body:
        raise ValueError(f"frame of {length} bytes exceeds the limit of {max_body}")
    return op, recv_exact(sock, length)


def pack_key(key: str) -> bytes:
    raw = key.encode("utf-8")
    if not raw or len(raw) > MAX_KEY:
        raise ValueError(f"rendezvous key must be 1..{MAX_KEY} UTF-8 bytes, got {len(raw)}")
    return struct.pack("!H", len(raw)) + raw


def unpack_key(body: bytes, pos: int) -> tuple[str, int]:
    if pos + 2 > len(body):
        raise ValueError("truncated key")
    (n,) = struct.unpack_from("!H", body, pos)
    if n == 0 or n > MAX_KEY or pos + 2 + n > len(body):
        raise ValueError("bad key length")
    return body[pos + 2:pos + 2 + n].decode("utf-8"), pos + 2 + n


def check_timeout(timeout: float) -> float:
    if not (timeout >= 0.0) or timeout > MAX_WAIT_SECONDS:  # also rejects NaN
        raise ValueError(f"timeout must be in [0, {MAX_WAIT_SECONDS:.0f}] seconds, got {timeout}")
    return timeout
