"""Point-to-point steps of the random programs (random_program.py): a few messages between
random pairs of the world's ranks, sent and received by each rank in an order of its own, and
each received message checked bit for bit against what its sender made.

Modes: "async" (isend/irecv, then every request waited in an order of the rank's own),
"batch" (batch_isend_irecv, every receive into an ``out``), "blocking" (every send, then every
receive, each waiting at once: the API says a send never waits for its receive, so this must
not hang). A rank keeps, for each (peer, tag), the program's order of its messages, so the
k-th receive of a (source, tag) must get that source's k-th send of the tag; messages of
different tags, or from different ranks, are received in any order. Sizes reach past 1 MiB (the
split copy between ranks of one host) and 4 MiB (an ``out`` read by the receiver's two
threads).
"""
from __future__ import annotations

import dataclasses
import random

import numpy as np

from multiproc import checks
from multiproc import random_program_expect as expect

MODES = ("async", "batch", "blocking")
_TAGS = (0, 0, 1, 2, 7, 1 << 33)
_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
           "float64", "bool")
_SHAPES = ((), (0,), (1,), (3,), (7, 3), (1001,), (16, 2, 3), (0, 4))
_LARGE_BYTES = ((1 << 20) + 24, (5 << 20) + 40)  # the split copy; an out= read on two threads


@dataclasses.dataclass(frozen=True)
class Message:
    src: int
    dst: int
    tag: int
    dtype: str
    shape: tuple
    out: bool  # received into an ``out`` array (always in "batch")


@dataclasses.dataclass(frozen=True)
class PointToPoint:
    mode: str
    messages: tuple


def generate(rng: random.Random, size: int) -> PointToPoint:
    """A step of 1-6 messages between random pairs (a pair may carry several, in both
    directions, of one tag or of several)."""
    mode = rng.choice(MODES)
    messages, keys = [], set()
    for _ in range(rng.randint(1, 6)):
        src, dst = rng.sample(range(size), 2)
        tag = rng.choice(_TAGS)
        dtype = rng.choice(_DTYPES)
        shape = rng.choice(_SHAPES)
        if rng.random() < 0.08:
            itemsize = expect.dtype_of(dtype).itemsize
            shape = (rng.choice(_LARGE_BYTES) // itemsize,)
        elif (src, dst, tag) in keys and int(np.prod(shape)) < 16:
            shape = (16,)  # values tell two messages of one (src, dst, tag) apart
        keys.add((src, dst, tag))
        messages.append(Message(src, dst, tag, dtype, shape,
                                out=mode == "batch" or rng.random() < 0.4))
    return PointToPoint(mode, tuple(messages))


def text(step: PointToPoint) -> str:
    parts = [f"{m.src}->{m.dst} tag={m.tag} {m.dtype}{list(m.shape)}{' out' if m.out else ''}"
             for m in step.messages]
    return f"p2p {step.mode}: " + ", ".join(parts)


def payload(message: Message, index: int, salt: str) -> np.ndarray:
    """What the sender of message ``index`` sends (every rank can make it)."""
    return checks.make_input(expect.dtype_of(message.dtype), message.shape, message.src,
                             f"{salt}.m{index}")


def run(hvd, step: PointToPoint, me: int, salt: str, order: random.Random) -> list:
    """This rank's sends and receives of ``step``; what was received wrong (empty: all right).
    A failure of the core raises from here (HorovodInternalError)."""
    sends = [(i, m) for i, m in enumerate(step.messages) if m.src == me]
    recvs = [(i, m) for i, m in enumerate(step.messages) if m.dst == me]
    sends = _keyed_shuffle(sends, lambda m: (m.dst, m.tag), order)
    recvs = _keyed_shuffle(recvs, lambda m: (m.src, m.tag), order)
    outs = {i: np.empty(m.shape, expect.dtype_of(m.dtype)) for i, m in recvs if m.out}
    arrays = {i: payload(m, i, salt) for i, m in sends}
    received, problems = {}, []
    if step.mode == "blocking":
        for i, m in sends:
            hvd.send(arrays[i], m.dst, m.tag)
        for i, m in recvs:
            received[i] = hvd.recv(m.src, m.tag, out=outs.get(i))
    else:
        if step.mode == "batch":
            ops = [(i, hvd.P2POp(hvd.isend, arrays[i], m.dst, m.tag) if m.src == me else
                    hvd.P2POp(hvd.irecv, outs[i], m.src, m.tag))
                   for i, m in _interleave(sends, recvs, order)]
            requests = hvd.batch_isend_irecv([op for _, op in ops])
            by_index = {i: request for (i, _), request in zip(ops, requests)}
        else:
            by_index = {}
            for i, m in _interleave(sends, recvs, order):
                by_index[i] = (hvd.isend(arrays[i], m.dst, m.tag) if m.src == me
                               else hvd.irecv(m.src, m.tag, out=outs.get(i)))
        waits = list(by_index.items())
        order.shuffle(waits)
        for i, request in waits:  # every one, so no receive is left posted for a later step
            result = request.wait()
            if step.messages[i].dst == me:
                received[i] = result
            elif result is not None:
                problems.append(f"message {i}: a send's wait returned {type(result).__name__}")
    return problems + [f"message {i} ({text_of(step.messages[i])}): {problem}"
                       for i, m in recvs
                       if (problem := _mismatch(received[i], outs.get(i), payload(m, i, salt)))]


def text_of(message: Message) -> str:
    return text(PointToPoint("", (message,)))[len("p2p : "):]


def _mismatch(got, out, expected: np.ndarray):
    if out is not None and got is not out:
        return "the receive into out= returned another array"
    if not isinstance(got, np.ndarray):
        return f"received {type(got).__name__}, not an array"
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return f"received {got.dtype}{list(got.shape)}, sent {expected.dtype}" \
               f"{list(expected.shape)}"
    if got.tobytes() != expected.tobytes():
        bad = np.flatnonzero(got.reshape(-1).view(np.uint8) !=
                             expected.reshape(-1).view(np.uint8))
        return f"{bad.size} bytes differ, the first at byte {bad[0]}"
    return None


def _keyed_shuffle(items: list, key, rng: random.Random) -> list:
    """``items`` in a random order that keeps the program's order within each key."""
    queues: dict = {}
    for item in items:
        queues.setdefault(key(item[1]), []).append(item)
    out = []
    while queues:
        k = rng.choice(sorted(queues, key=repr))
        out.append(queues[k].pop(0))
        if not queues[k]:
            del queues[k]
    return out


def _interleave(a: list, b: list, rng: random.Random) -> list:
    """``a`` and ``b`` merged at random, each in its own order."""
    a, b, out = list(a), list(b), []
    while a or b:
        out.append((a if a and (not b or rng.random() < 0.5) else b).pop(0))
    return out
