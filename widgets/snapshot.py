"""The metrics snapshot: the one message engines send to the driver's dashboard.

Built on the engine by :mod:`hvd_magic.widgets.publisher` a few times a second, framed and
signed by :func:`pack`, checked by :func:`unpack` on the driver and merged by
:class:`hvd_magic.widgets.model.DashboardModel`. This module is the single definition of the
schema; it imports nothing outside the standard library, so engines need no Jupyter package.

Schema, version 1 (a JSON object; every field but ``v``, ``rank`` and ``t`` may be missing)::

    v        int    schema version (SCHEMA_VERSION)
    rank     int    global rank of the engine
    t        float  engine wall clock (time.time()) when built; only differences are used
    seq      int    per-publisher sequence number (a gap means snapshots were dropped)
    pub      str    the publisher's id, drawn at random when it starts (with ``seq``, what the
                    hub orders snapshots by: Note [Dashboard frames] in .frames)
    host     str    hostname
    pid      int    engine process id
    device   dict   {"kind": "cpu"} or {"kind": "cuda", "index": k, "name": "NVIDIA H100",
                    "mem_used": bytes held by this process, "mem_total": bytes,
                    "gpu": nvidia-smi index of the pinned GPU, "util": percent busy,
                    "dev_mem_used": bytes in use on the GPU by all processes,
                    "path": a key of gpu_stats.GPU_PATHS (the core's CUDA collectives)}
    busy     bool   a cell is running on the engine
    cell     str    short label of the running cell ("" when idle)
    samples  int    cumulative samples reported with report(samples=...)
    extra    dict   latest scalar values passed as report(**extra) (≤ 16 keys)
    core     dict   core metrics, normalised by normalize_core(); absent before init():
      ops            {op: int}     collectives completed per op kind, and point-to-point
                                   messages as "send" and "recv" (monotonic)
      bytes          {op: int}     bytes reduced/moved per op kind (monotonic)
      fused_batches  int           batches holding more than one tensor (monotonic)
      fused_tensors  int           tensors inside those batches (monotonic)
      negotiate_s    float         seconds the loop spent negotiating (monotonic)
      communicate_s  float         seconds the loop spent moving data (monotonic)
      wait_s         float         seconds framework threads spent blocked in wait() (monotonic)
      idle_s         float         seconds the loop sat idle waiting for work (monotonic)
      queue_depth    int           requests enqueued and not yet complete
      collective     dict | None   the oldest unfinished collective: {"op", "name", "age_s",
                                   "phase": "negotiate" | "execute", "missing": [ranks]}
      last_error     str           last error text ("" when none)
      transport      {peer: str}   "self" / "shm" / "tcp" / "nccl" per peer rank (keys are str)
      timeline       bool          a timeline is being recorded
      autotune       dict | None   {"enabled", "phase", "sample", "samples", "current": {},
                                   "best": {}, "best_score", "scores": [[sample, score], ...]}
    events   list   [[op, name, start_ago_s, dur_s], ...] collectives finished since the previous
                    snapshot; start_ago_s is seconds before ``t`` (so no clocks are compared).
                    Back-to-back collectives of one op (< MERGE_GAP_S apart, ≤ MAX_BAR_S in all)
                    come as one [op, first name, start_ago_s, dur_s, count, busy_s]
    acks     list   [[command id, ok, text], ...] answers to dashboard commands (see .control)
    pipeline dict   the rank's last pipeline training step, action by action (.pipeline_step)

Counters are monotonic within one core lifetime; a decrease means the core was re-initialised
and the model restarts its rate baselines.

Wire frame: a signed JSON frame in the ``snapshot`` direction (:mod:`.frames`, shared with the
dashboard's commands, which are signed in the other direction).
"""

import math

from . import frames, pipeline_step
from .control import clean_acks
from .frames import MAX_TEXT, is_id, is_int
from .gpu_stats import GPU_PATHS

SCHEMA_VERSION = 1
MAX_FRAME_BYTES = 256 * 1024
MAX_EVENTS = 200
MERGE_GAP_S = 0.002  # events of one op closer than this are sent (and kept) as one entry...
MAX_BAR_S = 0.25  # ... as long as it spans at most this long
MAX_EXTRA = 16
OP_NAMES = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier", "join")
# point-to-point messages sent and received (the core's p2p_* counters), counted with the ops
P2P_NAMES = ("send", "recv")


def pack(snapshot, key=None):
    """Serialise and sign a snapshot into one frame.

    Parameters
    ----------
    snapshot : dict
        A snapshot following the schema above.
    key : bytes, optional
        The job's metrics key; without one the signature field is all zeros.

    Returns
    -------
    bytes
    """
    return frames.pack(snapshot, key, frames.SNAPSHOT)


def unpack(frame, key=None):
    """Verify and decode one frame into a validated snapshot.

    Parameters
    ----------
    frame : bytes
        As produced by :func:`pack`.
    key : bytes, optional
        The job's metrics key; when given, frames signed with another key are rejected.

    Returns
    -------
    dict
        The snapshot after :func:`validate`.

    Raises
    ------
    ValueError
        Bad size, bad signature, invalid JSON or a snapshot that fails validation.
    """
    return validate(frames.unpack(frame, key, MAX_FRAME_BYTES, "metrics frame", frames.SNAPSHOT,
                                  " (engine started with another key?)"))


def validate(obj):
    """Check a decoded snapshot and return a cleaned copy holding only known, typed fields.

    Unknown fields are dropped, optional fields of the wrong type are dropped, text is clipped.

    Parameters
    ----------
    obj : object
        Decoded JSON.

    Returns
    -------
    dict

    Raises
    ------
    ValueError
        Not an object, unsupported version, or ``rank``/``t`` missing or invalid.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"snapshot: expected a JSON object, got {type(obj).__name__}")
    if obj.get("v") != SCHEMA_VERSION:
        raise ValueError(f"snapshot: expected schema version {SCHEMA_VERSION}, got {obj.get('v')!r}")
    rank, t = obj.get("rank"), obj.get("t")
    if not (is_int(rank) and 0 <= rank < 1 << 20):
        raise ValueError(f"snapshot: expected an integer rank, got {rank!r}")
    if not _is_num(t):
        raise ValueError(f"snapshot from rank {rank}: expected a float 't', got {t!r}")
    out = {"v": SCHEMA_VERSION, "rank": rank, "t": float(t)}
    for name in ("seq", "pid", "samples"):
        if _is_count(obj.get(name)):
            out[name] = obj[name]
    for name in ("host", "cell"):
        if isinstance(obj.get(name), str):
            out[name] = obj[name][:MAX_TEXT]
    if is_id(obj.get("pub")):
        out["pub"] = obj["pub"]
    if isinstance(obj.get("busy"), bool):
        out["busy"] = obj["busy"]
    if isinstance(obj.get("device"), dict):
        out["device"] = {**_clean_device(obj["device"]), **_clean_gpu(obj["device"])}
    if isinstance(obj.get("extra"), dict):
        out["extra"] = _clean_scalars(obj["extra"], MAX_EXTRA)
    if isinstance(obj.get("core"), dict):
        out["core"] = _clean_core(obj["core"])
    if isinstance(obj.get("events"), list):
        out["events"] = _clean_events(obj["events"])
    if isinstance(obj.get("acks"), list):
        out["acks"] = clean_acks(obj["acks"])
    pipeline = pipeline_step.clean(obj.get("pipeline"))
    if pipeline is not None:
        out["pipeline"] = pipeline
    return out


# Counters and sizes are 64-bit in every sender; larger ones are refused, since the rates and
# ratios made of them overflow a float (found by tests/fuzz).
_COUNT_LIMIT = 1 << 63


def _is_count(x):
    return is_int(x) and 0 <= x < _COUNT_LIMIT


def _is_num(x):
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an integer past float's range (found by tests/fuzz)
        return False


def _clean_device(dev):
    kind = dev.get("kind") if dev.get("kind") in ("cpu", "cuda") else "cpu"
    out = {"kind": kind}
    if is_int(dev.get("index")):
        out["index"] = dev["index"]
    if isinstance(dev.get("name"), str):
        out["name"] = dev["name"][:MAX_TEXT]
    for name in ("mem_used", "mem_total"):
        if _is_count(dev.get(name)):
            out[name] = dev[name]
    return out


def _clean_gpu(dev):
    """The GPU columns of a device entry (#16): nvidia-smi index, memory in use on the GPU,
    utilisation in percent, the path of the CUDA collectives."""
    out = {}
    for name in ("gpu", "dev_mem_used"):
        value = dev.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[name] = value
    util = dev.get("util")
    if isinstance(util, (int, float)) and not isinstance(util, bool) and 0 <= util <= 100:
        out["util"] = util
    if isinstance(dev.get("path"), str) and dev["path"] in GPU_PATHS:  # a list: unhashable
        out["path"] = dev["path"]
    return out


def _clean_scalars(d, limit):
    out = {}
    for k, v in d.items():
        if len(out) >= limit:
            break
        if isinstance(k, str) and (_is_num(v) or isinstance(v, (str, bool))):
            out[k[:MAX_TEXT]] = v[:MAX_TEXT] if isinstance(v, str) else v
    return out


def _counter_map(d):
    if not isinstance(d, dict):
        return {}
    return {k: v for k, v in d.items()
            if (k in OP_NAMES or k in P2P_NAMES) and _is_num(v) and 0 <= v < _COUNT_LIMIT}


def _clean_core(core):
    out = {"ops": _counter_map(core.get("ops")), "bytes": _counter_map(core.get("bytes"))}
    for name in ("fused_batches", "fused_tensors", "queue_depth"):
        if _is_count(core.get(name)):
            out[name] = core[name]
    for name in ("negotiate_s", "communicate_s", "wait_s", "idle_s"):
        if _is_num(core.get(name)) and core[name] >= 0:
            out[name] = float(core[name])
    coll = core.get("collective")
    if isinstance(coll, dict) and _is_num(coll.get("age_s")):
        missing = coll.get("missing") if isinstance(coll.get("missing"), list) else []
        out["collective"] = {
            "op": str(coll.get("op", ""))[:MAX_TEXT],
            "name": str(coll.get("name", ""))[:MAX_TEXT],
            "age_s": max(0.0, float(coll["age_s"])),
            "phase": "execute" if coll.get("phase") == "execute" else "negotiate",
            "missing": [r for r in missing[:64] if is_int(r)],
        }
    if isinstance(core.get("last_error"), str):
        out["last_error"] = core["last_error"][:1000]
    if isinstance(core.get("transport"), dict):
        out["transport"] = {str(k)[:16]: str(v)[:16] for k, v in list(core["transport"].items())[:1024]}
    if isinstance(core.get("timeline"), bool):
        out["timeline"] = core["timeline"]
    if isinstance(core.get("autotune"), dict):
        out["autotune"] = _clean_autotune(core["autotune"])
    return out


def _clean_autotune(at):
    out = {"enabled": bool(at.get("enabled", True)), "phase": str(at.get("phase", ""))[:40]}
    for name in ("sample", "samples"):
        if is_int(at.get(name)):
            out[name] = at[name]
    for name in ("current", "best"):
        if isinstance(at.get(name), dict):
            out[name] = _clean_scalars(at[name], MAX_EXTRA)
    if _is_num(at.get("best_score")):
        out["best_score"] = float(at["best_score"])
    scores = at.get("scores") if isinstance(at.get("scores"), list) else []
    out["scores"] = [[int(s[0]), float(s[1])] for s in scores[-64:]
                     if isinstance(s, list) and len(s) == 2 and is_int(s[0]) and _is_num(s[1])]
    return out


def _clean_events(events):
    """4-element events, and merged 6-element ones ``[..., count, busy_s]`` as 4 or 6."""
    out = []
    for ev in events[-MAX_EVENTS:]:
        if not (isinstance(ev, list) and len(ev) in (4, 6) and isinstance(ev[0], str)
                and isinstance(ev[1], str) and _is_num(ev[2]) and _is_num(ev[3])):
            continue
        clean = [ev[0][:40], ev[1][:MAX_TEXT], max(0.0, float(ev[2])), max(0.0, float(ev[3]))]
        if len(ev) == 6:
            if not (is_int(ev[4]) and ev[4] >= 1 and _is_num(ev[5])):
                continue
            if ev[4] > 1:
                clean += [ev[4], max(0.0, float(ev[5]))]
        out.append(clean)
    return out


def normalize_core(raw):
    """Map the core's ``metrics()`` dict onto the ``core`` field of the schema.

    Accepts what ``engine_native`` returns (see ``engine_native/csrc/runtime/metrics.h``):
    counters as lists indexed by op kind or dicts by op name, ``*_seconds`` or ``*_s``
    durations, a ``pending`` list and the executing ``current_op``/``current_name``/
    ``current_seconds`` (or a ``current`` dict ``{"op", "name", "seconds"}``), ``transports``
    as a list indexed by rank. Missing keys are left out.

    Waiting: ``handle_wait_seconds`` (or ``wait_s``) is time framework threads were blocked in
    ``wait()``. ``idle_seconds`` is the loop's idle time. A core that reports ``wait_seconds``
    without ``idle_seconds`` measures the loop's idle poll with it (the core as of this
    writing: ``BackgroundLoop::waitForWork``), so it maps to ``idle_s``; next to
    ``idle_seconds`` it means the framework wait.

    Parameters
    ----------
    raw : dict
        The core's metrics.

    Returns
    -------
    dict
        The ``core`` field (before :func:`validate`).
    """
    out = {"ops": _by_op(raw.get("ops")), "bytes": _by_op(raw.get("bytes"))}
    for op, counter in zip(P2P_NAMES, ("p2p_sent", "p2p_received")):
        if raw.get(counter):
            out["ops"][op] = int(raw[counter])
            out["bytes"][op] = int(raw.get(counter + "_bytes") or 0)
    for name in ("fused_batches", "fused_tensors", "queue_depth"):
        if raw.get(name) is not None:
            out[name] = int(raw[name])
    for short in ("negotiate", "communicate"):
        value = raw.get(short + "_s", raw.get(short + "_seconds"))
        if value is not None:
            out[short + "_s"] = float(value)
    loop_idle = "idle_seconds" not in raw and "idle_s" not in raw
    idle = raw.get("idle_s", raw.get("idle_seconds", raw.get("wait_seconds") if loop_idle else None))
    wait = raw.get("wait_s", raw.get("handle_wait_seconds",
                                     None if loop_idle else raw.get("wait_seconds")))
    for name, value in (("idle_s", idle), ("wait_s", wait)):
        if value is not None:
            out[name] = float(value)
    out["collective"] = _oldest_collective(raw)
    if raw.get("last_error") is not None:
        out["last_error"] = str(raw["last_error"])
    transports = raw.get("transport", raw.get("transports"))
    if isinstance(transports, (list, tuple)):
        out["transport"] = {str(i): str(v) for i, v in enumerate(transports) if v}
    elif isinstance(transports, dict):
        out["transport"] = {str(k): str(v) for k, v in transports.items()}
    timeline = raw.get("timeline", raw.get("timeline_active"))
    if timeline is not None:
        out["timeline"] = bool(timeline)
    if isinstance(raw.get("autotune"), dict):
        out["autotune"] = dict(raw["autotune"])
    return out


def _by_op(counters):
    if isinstance(counters, dict):
        return {str(k).lower(): v for k, v in counters.items()}
    if isinstance(counters, (list, tuple)):
        return {OP_NAMES[i]: v for i, v in enumerate(counters[:len(OP_NAMES)]) if v}
    return {}


def _oldest_collective(raw):
    """The unfinished collective that has waited longest: executing or still negotiating."""
    candidates = []
    current = raw.get("current")
    if isinstance(current, dict) and current.get("op"):
        candidates.append({"op": str(current["op"]).lower(), "name": str(current.get("name", "")),
                           "age_s": float(current.get("seconds", 0.0)), "phase": "execute",
                           "missing": []})
    if raw.get("current_op"):
        candidates.append({"op": str(raw["current_op"]).lower(), "name": str(raw.get("current_name", "")),
                           "age_s": float(raw.get("current_seconds", 0.0)), "phase": "execute",
                           "missing": []})
    for p in raw.get("pending") or ():
        if isinstance(p, dict):
            candidates.append({"op": str(p.get("op", "")).lower(), "name": str(p.get("name", "")),
                               "age_s": float(p.get("age_s", p.get("age_seconds", 0.0))),
                               "phase": "negotiate", "missing": list(p.get("missing_ranks",
                                                                           p.get("missing", [])))})
    if isinstance(raw.get("collective"), dict):
        candidates.append(dict(raw["collective"]))
    return max(candidates, key=lambda c: c["age_s"]) if candidates else None
