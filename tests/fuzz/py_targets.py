"""The Python decoders of bytes from another process, as targets for :mod:`py_fuzz`.

Each target has seeds (valid encodings from the matching encoder, from a seeded RNG), a
``run(data)`` that feeds one input the way the receiving code does and returns ``"accepted"``
or ``"rejected"``, and ``errors``: the exception types the decoder documents (the receiving
code catches exactly these). Anything else raised is a failure, as is an accepted message
that does not survive re-encoding. ``json`` targets carry JSON whose signature the fuzzer
recomputes after a mutation (``sign``), so mutants reach the parser and the schema checks,
as they would from an engine that holds the key.
"""
from __future__ import annotations

import json
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

from hvd_magic.widgets import control, frames, snapshot
from hvd_magic.widgets.model import DashboardModel
from hvd_magic.widgets.sparkline import pipeline_strip

from engine_native import rendezvous_wire as W
from engine_native.rendezvous import RendezvousServer
from engine_native.rendezvous_client import RendezvousClient, RendezvousError
from engine_native.sealed_frames import FrameAuthError, SealedChannel
from hvd_magic.launch.output import LineSplitter, parse_tagged

KEY = b"metrics key of the job"


@dataclass
class Target:
    name: str
    decodes: str
    seeds: Callable  # (random.Random) -> list[bytes]
    run: Callable  # (bytes) -> "accepted" | "rejected"; raises on a bad input
    errors: tuple = ()
    sign: Callable | None = None  # payload -> frame, for JSON frames


class Broken(AssertionError):
    """A decoder accepted something it must not, or what it accepted does not re-encode."""


# --- sealed frames (the rendezvous store's and the Spark log channel's transport) ----------
_NONCES = (b"s" * 32, b"c" * 32)


def _channel(sock, is_server):
    return SealedChannel(sock, b"job secret", *_NONCES, is_server=is_server, context=b"log\0\0\0\1")


def _sealed_bytes(frames_):
    a, b = socket.socketpair()
    with a, b:
        sender = _channel(a, is_server=False)
        for op, body in frames_:
            sender.send(op, body)
        a.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := b.recv(1 << 16):
            out += chunk
        return out


def sealed_seeds(rng):
    return [_sealed_bytes([(rng.randrange(1, 5), rng.randbytes(rng.randrange(0, 60)))
                           for _ in range(rng.randrange(1, 4))]) for _ in range(16)]


def sealed_run(data):
    """Frames until the stream ends; every verified frame, sealed again, is the input's prefix."""
    a, b = socket.socketpair()
    with a, b:
        b.settimeout(5.0)
        a.sendall(data)
        a.shutdown(socket.SHUT_WR)
        receiver, got = _channel(b, is_server=True), []
        try:
            while True:
                got.append(receiver.recv(1 << 20))
        except ConnectionError as end:
            again = _sealed_bytes(got) if got else b""
            if not data.startswith(again):
                raise Broken("verified frames differ from the bytes") from None
            if isinstance(end, FrameAuthError) or len(again) != len(data):
                return "rejected"
            return "accepted"


# --- the rendezvous store's requests (server) and replies (client) -------------------------
def request_seeds(rng):
    def key():
        return W.pack_key(f"job/init0/{rng.randrange(8)}")
    seeds = []
    for _ in range(16):
        seeds.append(bytes([W.OP_SET]) + key() + rng.randbytes(rng.randrange(0, 40)))
        seeds.append(bytes([W.OP_GET]) + struct.pack("!d", rng.random()) + key())
        n = rng.randrange(1, 4)
        seeds.append(bytes([W.OP_WAIT]) + struct.pack("!dH", 0.0, n) +
                     b"".join(key() for _ in range(n)))
    return seeds


_server = RendezvousServer(b"job secret", max_total_bytes=1 << 20)
_server._stopping = True  # never started: a wait for a missing key answers at once


def request_run(data):
    """The server's request dispatch (RendezvousServer._dispatch) on op byte + body."""
    if not data:
        return "rejected"
    status, reply = _server._dispatch(data[0], data[1:])
    if status not in (W.OK, W.MISSING, W.ERROR) or not isinstance(reply, bytes):
        raise Broken(f"status {status!r}")
    return "accepted"


_client = RendezvousClient("127.0.0.1:1", b"job secret")


def reply_seeds(rng):
    seeds = []
    for _ in range(16):
        values = [rng.randbytes(rng.randrange(0, 20)) for _ in range(3)]
        seeds.append(bytes([W.OK]) + W.pack_values(values))
        seeds.append(bytes([W.MISSING]) + struct.pack("!H", 2) + W.pack_key("a/1") +
                     W.pack_key("a/2"))
        seeds.append(bytes([W.ERROR]) + b"store full")
    return seeds


def reply_run(data):
    """The client's reply parsing (RendezvousClient._wait_reply) on status byte + reply, for a
    wait on three keys."""
    if not data:
        return "rejected"
    _client._request = lambda op, body, wait: (data[0], data[1:])
    try:
        values = _client._wait_reply(W.OP_WAIT, b"", ["a/1", "a/2", "a/3"], 0.0)
    except TimeoutError:
        return "rejected"
    if data[0] != W.OK or W.pack_values(values) != data[1:]:
        raise Broken("a reply was accepted that does not re-encode to itself")
    return "accepted"


# --- dashboard frames: snapshots (engines -> hub) and commands (hub -> engines) ------------
def _snapshot_obj(rng, rank):
    ops = {op: rng.randrange(1000) for op in snapshot.OP_NAMES[:rng.randrange(8)]}
    return {
        "v": 1, "rank": rank, "t": 1000.0 + rng.random(), "seq": rng.randrange(100),
        "pub": f"{rng.randrange(1 << 64):016x}", "host": "node-a", "pid": 4242,
        "busy": rng.random() < 0.5, "cell": "train()",
        "samples": rng.randrange(10**6), "extra": {"loss": rng.random(), "phase": "warm"},
        "device": {"kind": "cuda", "index": 0, "name": "H100", "mem_used": 1 << 30,
                   "mem_total": 80 << 30, "gpu": 0, "util": 55, "path": "nccl"},
        "core": {"ops": ops, "bytes": {k: v * 4096 for k, v in ops.items()},
                 "fused_batches": 3, "fused_tensors": 12, "negotiate_s": 0.5,
                 "communicate_s": 2.0, "wait_s": 1.0, "idle_s": 3.0, "queue_depth": 2,
                 "collective": {"op": "allreduce", "name": "grad.w", "age_s": 0.7,
                                "phase": "negotiate", "missing": [1, 2]},
                 "last_error": "", "transport": {"1": "shm"}, "timeline": False,
                 "autotune": {"enabled": True, "phase": "bayes", "sample": 3, "samples": 20,
                              "current": {"fusion": 64.0}, "best": {"fusion": 32.0},
                              "best_score": 1.5, "scores": [[1, 1.0], [2, 1.5]]}},
        "events": [["allreduce", "grad.w", 0.1, 0.01], ["allgather", "x", 0.2, 0.1, 3, 0.05]],
        "acks": [[1, True, "timeline started"]],
        "pipeline": {"schedule": "1f1b", "step_s": 0.02, "bubble": rng.random(), "ideal": 0.25,
                     "actions": [["FB"[rng.randrange(2)], rng.randrange(4), i, 0.001 * i,
                                  0.001 * i + 0.0005] for i in range(rng.randrange(1, 8))],
                     "more": rng.randrange(3)},
    }


def snapshot_seeds(rng):
    return [snapshot.pack(_snapshot_obj(rng, rng.randrange(4)), KEY) for _ in range(16)]


def snapshot_run(data):
    """What the hub does with a frame (widgets/hub.py _receive): unpack, the order check
    (after a baseline from the same publisher), then the model merges it after a baseline
    snapshot of the same rank and renders rows, cluster, autotune, the timeline and a pipeline
    step's strip from it."""
    snap = snapshot.unpack(data, KEY)
    order = frames.SnapshotOrder()
    if order.admit({"rank": snap["rank"], "pub": "baseline", "seq": 0}) is not None:
        raise Broken("the order check refused a first snapshot")
    if order.admit(snap) is not None:
        return "rejected"
    model = DashboardModel(size=4)
    base = snapshot.validate(_snapshot_obj(_Fixed(), snap["rank"]))
    model.ingest(snap["rank"], base, 10.0)
    model.ingest(snap["rank"], snap, 10.5)
    rows = model.rows(11.0)
    model.cluster(11.0), model.autotune(), model.timeline(11.0)
    for row in rows:
        if row.pipeline is not None:
            pipeline_strip(row.pipeline, span_s=0.01)
    if snapshot.validate(json.loads(json.dumps(snap))) != snap:
        raise Broken("a validated snapshot does not validate to itself")
    return "accepted"


class _Fixed:
    """A stand-in for random.Random that gives the same baseline every time."""
    def randrange(self, *a):
        return 1

    def random(self):
        return 0.25


def command_seeds(rng):
    names = ["timeline", "autotune", "stop"]
    return [control.pack_command(rng.randrange(1, 100), rng.choice(names),
                                 {"path": "/tmp/t.json", "on": rng.random() < 0.5}, KEY,
                                 to=[f"{rng.randrange(1 << 64):016x}"
                                     for _ in range(rng.randrange(4))])
            for _ in range(16)]


def command_run(data):
    """What an engine's publisher decodes of a command frame (widgets/publisher.py _command),
    before its addressee and order checks (Note [Dashboard frames])."""
    command = control.unpack_command(data, KEY)
    if control.unpack_command(control.pack_command(*command[:3], KEY, to=command.to),
                              KEY) != command:
        raise Broken("a command does not survive re-encoding")
    return "accepted"


# --- the launcher's rank output: bytes from the ranks' pipes, tagged lines -----------------
def output_seeds(rng):
    seeds = []
    for _ in range(16):
        lines = [f"[{rng.randrange(8)}]<{rng.choice(['stdout', 'stderr', 'exit'])}>:"
                 f"{rng.choice(['0', '1', 'epoch 3 loss 0.25', ''])}" for _ in range(3)]
        seeds.append(("\n".join(lines) + "\n").encode())
    return seeds


def output_run(data):
    """LineSplitter fed in two pieces, then parse_tagged on every line and what MpiJob does
    with an exit line (hvd_magic/launch/mpi.py handle_line)."""
    lines = []
    splitter = LineSplitter(lines.append)
    splitter.feed(data[:len(data) // 2])
    splitter.feed(data[len(data) // 2:])
    splitter.flush()
    tagged = 0
    for line in lines:
        parsed = parse_tagged(line)
        if parsed is None:
            continue
        tagged += 1
        rank, kind, body = parsed
        if parse_tagged(f"[{rank}]<{kind}>:{body}") != parsed:
            raise Broken("a tagged line does not survive re-tagging")
        if kind == "exit":
            try:
                int(body)
            except ValueError:
                pass  # MpiJob reads it as exit code 1
    return "accepted" if tagged == len(lines) else "rejected"


def _schedule_error():
    from engine_native.pipeline import ScheduleError
    return ScheduleError


# --- a pipeline's schedule arguments, allgathered from its ranks (torch/pipelining/agree.py) --
_PIPELINE_RANKS = [0, 1, 2]


def _pipeline_frame(arguments, refusal):
    body = json.dumps({"arguments": arguments, "refusal": refusal}, sort_keys=True).encode()
    return len(body).to_bytes(8, "little") + body


def pipeline_seeds(rng):
    def one():
        arguments = {"schedule": rng.choice(["ScheduleGPipe", "Schedule1F1B"]),
                     "num_stages": 3, "n_microbatches": rng.choice([1, 4, 8]),
                     "stages_per_rank": 1, "scale_grads": rng.random() < 0.5}
        return _pipeline_frame(arguments, rng.choice([None, "no batch"]))
    return [b"".join(one() for _ in _PIPELINE_RANKS) for _ in range(8)]


def pipeline_run(data):
    """agree._decode over three ranks' frames, as same_arguments reads its allgather: every
    frame's length inside the bytes, none left over, each a dict of arguments and a refusal."""
    from engine_native.torch.pipelining import agree
    everyone = agree._decode("Schedule1F1B", data, _PIPELINE_RANKS)
    again = b"".join(_pipeline_frame(t["arguments"], t["refusal"]) for t in everyone)
    if json.loads(again[8:8 + int.from_bytes(again[:8], "little")]) != everyone[0]:
        raise Broken("a decoded frame does not re-encode")
    return "accepted"


TARGETS = [
    Target("sealed_frames", "sealed_frames.SealedChannel.recv", sealed_seeds, sealed_run,
           (FrameAuthError, ConnectionError, ValueError)),
    Target("rendezvous_request", "RendezvousServer._dispatch (op, key, timeout, value)",
           request_seeds, request_run, (ValueError, struct.error)),
    Target("rendezvous_reply", "RendezvousClient._wait_reply (status, values, missing keys)",
           reply_seeds, reply_run, (RendezvousError,)),
    Target("dashboard_snapshot", "widgets.snapshot.unpack + SnapshotOrder + DashboardModel",
           snapshot_seeds, snapshot_run, (ValueError,),
           sign=lambda p: frames.sign(p, KEY, frames.SNAPSHOT) + p),
    Target("dashboard_command", "widgets.control.unpack_command", command_seeds, command_run,
           (ValueError,), sign=lambda p: frames.sign(p, KEY, frames.COMMAND) + p),
    Target("launch_output", "launch.output.LineSplitter + parse_tagged", output_seeds,
           output_run),
    Target("pipeline_arguments", "torch.pipelining.agree._decode (every rank's schedule)",
           pipeline_seeds, pipeline_run, (_schedule_error(),)),
]
