"""Signed JSON frames: the wire format of both dashboard channels, snapshots from the engines
(:mod:`.snapshot`) and commands to them (:mod:`.control`), the hub's record of which snapshots
are new (:class:`SnapshotOrder`) and the field checks both schemas use. Standard library only:
engines import it without any Jupyter package.

A frame is one ZMQ frame: a 32-byte tag followed by the UTF-8 JSON body. JSON, never pickle:
the driver decodes data arriving on a network socket.

Note [Dashboard frames]
A. Tag. ``tag = HMAC-SHA256(job key, "hvd-dashboard\\n" | direction | "\\n" | body)`` with
   ``direction`` ``"snapshot"`` (engine to hub) or ``"command"`` (hub to engine); 32 zero bytes
   when the job has no key (then nothing is authenticated). The body holds the frame's
   sequence number, so the tag covers direction, sequence number and body; it is checked
   before the body is parsed.
B. Snapshots carry ``pub``, an id each publisher draws at random when it starts (a new one
   after ``%hvd_restart`` or a re-scale), and ``seq``, counting that publisher's snapshots.
   The hub (:class:`SnapshotOrder`) accepts a snapshot only if its ``seq`` is greater than the
   last one accepted from the same rank and ``pub``, or if its ``pub`` is new (the previous
   publisher of that rank is then retired for good).
C. Commands carry ``id`` (the hub's count, only growing) and ``to``: the ``pub`` ids of the
   publishers the hub heard from and sends it to. A publisher runs a command only if its own
   id is in ``to`` and ``id`` is greater than the last one it ran.
D. What a bad frame meets: an altered or foreign frame fails its tag; a snapshot fed back as a
   command (or the reverse) fails its tag, the direction differs; a replayed or reordered
   snapshot (``seq`` not after the last) or one from a retired publisher is not rendered and
   its acks are not counted; a replayed or reordered command (``id`` not after the last run)
   or one recorded for an earlier publisher (not in ``to``: a new publisher's id is fresh) is
   not run. Each is dropped, changes no state and is logged with its reason
   (:class:`RefusalLog`: a warning per kind at most every ``LOG_EVERY_S``, the rest at debug;
   info for the two kinds normal operation also produces: a replaced publisher's last frames
   still on their way, a command sent before the hub heard from a new publisher). Nothing
   ends a connection: ZMQ's fan-in shows none to end, and PUB/SUB and the publishers'
   high-water mark drop frames in normal operation, so a gap in ``seq`` or ``id`` is no error.
E. Not covered: confidentiality; delay (the frames of a publisher the hub never heard from,
   all withheld and delivered later, pass as a new publisher and retire the rank's current
   one: a denial of service, by someone who could drop every frame anyway); a holder of the
   job key, which every engine is (it can sign either direction).
"""

import hashlib
import hmac
import json
import logging

SIGNATURE_BYTES = 32
MAX_TEXT = 200  # longest text kept from a frame's string fields
MAX_ID = 64  # longest publisher id kept
LOG_EVERY_S = 30.0  # a warning per kind of refused frame at most this often
SNAPSHOT = b"snapshot"  # engine -> hub
COMMAND = b"command"  # hub -> engine
_DOMAIN = b"hvd-dashboard\n"
_NO_SIGNATURE = bytes(SIGNATURE_BYTES)


def sign(payload, key, direction):
    """The tag of ``payload`` (bytes) sent in ``direction`` (:data:`SNAPSHOT` or
    :data:`COMMAND`) under ``key`` (all zeros without a key)."""
    if direction not in (SNAPSHOT, COMMAND):
        raise ValueError(f"frame direction: expected {SNAPSHOT!r} or {COMMAND!r}, "
                         f"got {direction!r}")
    if not key:
        return _NO_SIGNATURE
    return hmac.new(key, _DOMAIN + direction + b"\n" + payload, hashlib.sha256).digest()


def pack(obj, key, direction):
    """Serialise ``obj`` as compact JSON and sign it into one frame for ``direction``."""
    payload = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    return sign(payload, key, direction) + payload


def unpack(frame, key, max_bytes, what, direction, bad_signature_hint=""):
    """Check a frame's size and tag and decode its JSON.

    Parameters
    ----------
    frame : bytes
    key : bytes or None
        The job key the frame must be signed with.
    max_bytes : int
        Largest frame accepted.
    what : str
        Names the frame in errors ("metrics frame").
    direction : bytes
        :data:`SNAPSHOT` or :data:`COMMAND`: the direction the frame must have been sent in.
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
    if not hmac.compare_digest(signature, sign(payload, key, direction)):
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


def is_id(x):
    """A publisher id from JSON: a non-empty string of at most :data:`MAX_ID` characters."""
    return isinstance(x, str) and 0 < len(x) <= MAX_ID


class SnapshotOrder:
    """Which snapshots arriving on the hub's socket are new (Note [Dashboard frames], B).

    Used by the hub thread only. Nothing is forgotten while the hub lives (not even by
    ``MetricsHub.forget``), so a retired publisher's frames stay refused: a few dozen bytes
    per publisher started.
    """

    def __init__(self):
        self._current = {}  # rank -> [pub id, last seq accepted]
        self._seen = set()  # every pub id ever accepted

    def admit(self, snap):
        """Record ``snap`` (a validated snapshot) as accepted and return None, or return
        ``(kind, why)`` when it is refused (and record nothing): kind ``"order"`` (no
        sequence, or replayed or out of order) or ``"retired"`` (its publisher was replaced;
        also the fate of a replaced publisher's last frames still on their way)."""
        rank, pub, seq = snap["rank"], snap.get("pub"), snap.get("seq")
        if pub is None or seq is None:
            return "order", f"snapshot from rank {rank} without publisher id or sequence number"
        current = self._current.get(rank)
        if current is not None and current[0] == pub:
            if seq <= current[1]:
                return "order", (f"snapshot {seq} from rank {rank} not after {current[1]} "
                                 f"(replayed or out of order)")
            current[1] = seq
            return None
        if pub in self._seen:
            return "retired", f"snapshot {seq} from a replaced publisher of rank {rank}"
        self._seen.add(pub)
        self._current[rank] = [pub, seq]
        return None

    def publishers(self, ranks):
        """The current publisher ids of ``ranks`` (those the hub heard from)."""
        return [p for p in map(self.publisher, ranks) if p is not None]

    def publisher(self, rank):
        """``rank``'s current publisher id, or None before the hub heard from it."""
        entry = self._current.get(rank)
        return entry[0] if entry else None


class RefusalLog:
    """Logs refused frames: per kind, one line at the given level (a warning unless said
    otherwise) at most every ``every_s`` seconds, with how many were refused since; the
    others at debug.

    Parameters
    ----------
    logger : logging.Logger
    prefix : str
        Starts every line ("dashboard hub").
    clock : callable
        Monotonic seconds.
    """

    def __init__(self, logger, prefix, clock, every_s=LOG_EVERY_S):
        self.logger, self.prefix, self.clock, self.every_s = logger, prefix, clock, every_s
        self._last = {}  # kind -> [clock of the last warning, refused since]

    def refused(self, kind, reason, level=logging.WARNING):
        now = self.clock()
        last = self._last.get(kind)
        if last is not None and now - last[0] < self.every_s:
            last[1] += 1
            self.logger.debug("%s: refused a frame: %s", self.prefix, reason)
            return
        since = f" ({last[1]} more refused since the last warning)" if last and last[1] else ""
        self._last[kind] = [now, 0]
        self.logger.log(level, "%s: refused a frame: %s%s", self.prefix, reason, since)
