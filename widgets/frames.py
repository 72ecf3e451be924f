"""Signed JSON frames: the wire format of both dashboard channels, snapshots from the engines
(:mod:`.snapshot`) and commands to them (:mod:`.control`), and the field checks both schemas
use. Standard library only: engines import it without any Jupyter package.

A frame is one ZMQ frame: the 32-byte HMAC-SHA256 of the payload under the job key (32 zero
bytes when no key) followed by the UTF-8 JSON payload. JSON, never pickle: the driver decodes
data arriving on a network socket.
"""

import hashlib
import hmac
import json

SIGNATURE_BYTES = 32
MAX_TEXT = 200  # longest text kept from a frame's string fields
_NO_SIGNATURE = bytes(SIGNATURE_BYTES)


def sign(payload, key):
    """The signature field for ``payload`` (bytes) under ``key`` (all zeros without a key)."""
    if not key:
        return _NO_SIGNATURE
    return hmac.new(key, payload, hashlib.sha256).digest()


def pack(obj, key=None):
    """Serialise ``obj`` as compact JSON and sign it into one frame."""
    payload = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    return sign(payload, key) + payload


def unpack(frame, key, max_bytes, what, bad_signature_hint=""):
    """Check a frame's size and signature and decode its JSON.

    Parameters
    ----------
    frame : bytes
    key : bytes or None
        The job key the frame must be signed with.
    max_bytes : int
        Largest frame accepted.
    what : str
        Names the frame in errors ("metrics frame").
    bad_signature_hint : str
        Appended to the bad-signature error (a likely cause).

    Raises
    ------
    ValueError
        Bad size, bad signature or invalid JSON, starting with ``what``.
    """
    if not SIGNATURE_BYTES < len(frame) <= max_bytes:
        raise ValueError(f"{what}: size {len(frame)} outside ({SIGNATURE_BYTES}, {max_bytes}]")
    signature, payload = frame[:SIGNATURE_BYTES], frame[SIGNATURE_BYTES:]
    if not hmac.compare_digest(signature, sign(payload, key)):
        raise ValueError(f"{what}: bad signature{bad_signature_hint}")
    try:
        return json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what}: invalid JSON ({exc})") from None
    except RecursionError:  # nesting deeper than the interpreter's limit (found by tests/fuzz)
        raise ValueError(f"{what}: JSON nested too deep") from None


def is_int(x):
    """An int from JSON, booleans excluded."""
    return isinstance(x, int) and not isinstance(x, bool)
