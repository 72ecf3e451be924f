"""The rendezvous store's wire protocol: the handshake MAC, the sealed frames' context and the
key codec, shared by the server (:mod:`engine_native.rendezvous`) and the client
(:mod:`engine_native.rendezvous_client`).

Protocol (one TCP connection per client, big-endian):

A. Server sends ``MAGIC`` (``HVDRDV2``; a different version is refused here, by name) + a
   32-byte server nonce.
B. Client sends a 32-byte client nonce + HMAC-SHA256(secret, "client" + both nonces).
C. Server checks it (constant time); on failure the connection is dropped and logged. Otherwise
   it answers HMAC-SHA256(secret, "server" + both nonces), which the client checks in turn, so a
   rank never trusts addresses from a server that does not know the secret either.
D. Requests and replies are sealed frames (Note [Sealed frames] in
   :mod:`engine_native.sealed_frames`, context ``"rendezvous"``): ``op:u8 | length:u32 | body |
   tag:32``, the tag an HMAC-SHA256 under a key of this connection and direction over the
   direction, the frame's sequence number, op, length and body. Every byte after the handshake
   is authenticated: a request's op, key, timeout and value, a reply's status and values. The
   receiver checks the length (body at most ``max_value_bytes`` + 64 KiB) before reading the
   body and the tag before parsing it, so nothing is stored, returned or unpickled from a frame
   that was altered, injected, replayed or reordered; such a frame closes the connection (the
   server logs which frame and from where), a malformed one too, never the server.
"""
from __future__ import annotations

import hashlib
import hmac
import struct

from .sealed_frames import recv_exact  # noqa: F401  (re-exported for the handshakes)

MAGIC = b"HVDRDV2\0"
MAGIC_FAMILY = b"HVDRDV"
FRAME_CONTEXT = b"rendezvous"
NONCE_SIZE = 32
MAC_SIZE = 32
OP_SET, OP_GET, OP_WAIT = 1, 2, 3
OK, MISSING, ERROR = 0, 1, 2
MAX_KEY = 1024
MAX_KEYS_PER_WAIT = 4096
HANDSHAKE_TIMEOUT = 5.0
MAX_WAIT_SECONDS = 24 * 3600.0


def mac(secret: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, role + server_nonce + client_nonce, hashlib.sha256).digest()


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


def pack_values(values: list) -> bytes:
    """An OK reply's body: each value as ``length:u32 | bytes``."""
    return b"".join(struct.pack("!I", len(v)) + v for v in values)


def unpack_values(body: bytes, count: int) -> list:
    """The ``count`` values of an OK reply; ValueError unless they fill the body exactly."""
    values, pos = [], 0
    for _ in range(count):
        if pos + 4 > len(body):
            raise ValueError("truncated value length")
        (n,) = struct.unpack_from("!I", body, pos)
        if pos + 4 + n > len(body):
            raise ValueError("truncated value")
        values.append(body[pos + 4:pos + 4 + n])
        pos += 4 + n
    if pos != len(body):
        raise ValueError("trailing bytes")
    return values


def unpack_missing(body: bytes) -> list:
    """A MISSING reply's keys: ``count:u16`` then each key (:func:`pack_key`); ValueError
    unless they fill the body exactly."""
    if len(body) < 2:
        raise ValueError("truncated key count")
    (count,) = struct.unpack_from("!H", body, 0)
    keys, pos = [], 2
    for _ in range(count):
        key, pos = unpack_key(body, pos)
        keys.append(key)
    if pos != len(body):
        raise ValueError("trailing bytes")
    return keys


def check_timeout(timeout: float) -> float:
    if not (timeout >= 0.0) or timeout > MAX_WAIT_SECONDS:  # also rejects NaN
        raise ValueError(f"timeout must be in [0, {MAX_WAIT_SECONDS:.0f}] seconds, got {timeout}")
    return timeout
