"""Every rank of a pipeline must run the same schedule: the same class, stages, micro-batches,
stages per rank and loss scaling. Each rank builds its action table from its own arguments,
so a rank given other ones runs another table, and its peers wait for messages it never sends
(until HVD_TIMEOUT). ``same_arguments`` compares them across the pipeline's ranks once, in one
allgather over the pipeline's process set, before a schedule's first step or eval, and
refuses a mismatch on every rank, naming the argument, the ranks and their values (as
torch.distributed.pipelining's stages agree on shapes in their first step).

Each rank sends its arguments as JSON, behind its length (8 bytes, little-endian), so one
allgather of variable-length uint8 arrays carries them all.
"""
from __future__ import annotations

import json

import numpy as np

from engine_native import numpy_ops
from engine_native.pipeline import ScheduleError

_LENGTH = 8  # bytes of each rank's length prefix


def same_arguments(owner: str, arguments: dict, ranks: list[int], process_set,
                   refusal: str | None = None) -> None:
    """Raises ScheduleError on every rank of ``process_set`` (whose global ranks are ``ranks``)
    when some rank's ``arguments`` (name -> a JSON value) differ from another's, naming the
    first argument that differs and every rank's value of it; or when some rank refused its
    own call (``refusal``: why), naming that rank and its reason. A rank that refused alone,
    without this allgather, would leave the others waiting in it."""
    mine = json.dumps({"arguments": arguments, "refusal": refusal}, sort_keys=True).encode()
    frame = np.frombuffer(len(mine).to_bytes(_LENGTH, "little") + mine, dtype=np.uint8)
    gathered = numpy_ops.allgather(frame, f"pipeline.arguments.{'-'.join(map(str, ranks))}",
                                   process_set).tobytes()
    everyone = _decode(owner, gathered, ranks)
    refused = [(rank, theirs["refusal"]) for rank, theirs in zip(ranks, everyone)
               if theirs["refusal"] is not None]
    if refusal is not None:
        raise ScheduleError(refusal)
    if refused:
        rank, why = refused[0]
        raise ScheduleError(f"{owner}: rank {rank} refused its call, so no rank of the pipeline "
                            f"runs it: {why}")
    for name in sorted({key for theirs in everyone for key in theirs["arguments"]}):
        values = [theirs["arguments"].get(name) for theirs in everyone]
        if any(v != values[0] for v in values):
            raise ScheduleError(f"{owner}: {name} differs across the pipeline's ranks: "
                                f"{_by_value(values, ranks)}; every rank must build the same "
                                "schedule")


def _decode(owner: str, gathered: bytes, ranks: list[int]) -> list[dict]:
    """Each rank's frame of the allgather, checked: a length that runs past the end, bytes
    left over or a frame that is not this module's JSON is refused naming the rank."""
    everyone, offset = [], 0
    for rank in ranks:
        length = int.from_bytes(gathered[offset:offset + _LENGTH], "little")
        offset += _LENGTH
        try:
            if offset + length > len(gathered):
                raise ValueError("its length runs past the gathered bytes")
            theirs = json.loads(gathered[offset:offset + length])
            if not isinstance(theirs, dict) or not isinstance(theirs.get("arguments"), dict) \
                    or "refusal" not in theirs:
                raise ValueError("it is not a pipeline's arguments")
        except (ValueError, RecursionError) as exc:  # json: ValueErrors, or nesting too deep
            raise ScheduleError(f"{owner}: rank {rank}'s schedule arguments could not be read "
                                f"({exc}); every rank must run the same engine_native") from None
        everyone.append(theirs)
        offset += length
    if offset != len(gathered):
        raise ScheduleError(f"{owner}: {len(gathered) - offset} bytes after the ranks' schedule "
                            "arguments; every rank must run the same engine_native")
    return everyone


def _by_value(values: list, ranks: list[int]) -> str:
    """"rank 0 has 4, rank 1 has 8", ranks that agree together ("ranks 0 and 2 have 4")."""
    groups: dict[str, list[int]] = {}
    for value, rank in zip(values, ranks):
        groups.setdefault(json.dumps(value), []).append(rank)
    parts = []
    for value, members in groups.items():
        if len(members) == 1:
            parts.append(f"rank {members[0]} has {_shown(value)}")
        else:
            who = ", ".join(map(str, members[:-1])) + f" and {members[-1]}"
            parts.append(f"ranks {who} have {_shown(value)}")
    return ", ".join(parts)


def _shown(encoded: str) -> str:
    value = json.loads(encoded)
    return "(not set)" if value is None else str(value)
