"""Random multi-rank programs (issue #35 item 6): from (seed, world size) every rank derives the
same program, a list of steps it runs in order, skipping the steps of process sets it is not
in.

Steps: collectives (allreduce with every reduce op its dtype allows, grouped allreduce,
allgather with a first dimension per rank, broadcast from a random root, alltoall with random
splits, reducescatter, barrier) over random dtypes and shapes (empty and odd ones included),
waited at once or submitted async and waited later in an order of each rank's own; process
sets added and removed on the way; join blocks (members leave after different numbers of
allreduces, the others keep reducing); point-to-point steps (random_program_p2p.py: messages
between random pairs, drawn from a second generator, so a seed's other steps are those it had
before they came); and at most one injected failure: a rank aborts, raises
(and shuts its core down, as a process leaving on an exception would), is killed (SIGKILL) or
is stopped (SIGSTOP) inside a large allreduce. The last step is a global allreduce, so every
live rank has an op that needs the victim after any failure.

Expected results: random_program_expect.py. Running programs in long-lived ranks:
random_program_rank.py. ``describe(program)`` is the replayable listing printed on a failure.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Optional

from multiproc import random_program_p2p as p2p

FAILURE_KINDS = ("abort", "raise", "kill", "stop")
DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
          "float64", "bool")
REDUCE_OPS = ("sum", "avg", "min", "max", "prod")
STOP_ELEMENTS = 16 << 20  # float32: 64 MiB, so the victim can be stopped inside the op
_KIND_WEIGHTS = {"allreduce": 30, "grouped_allreduce": 8, "allgather": 12, "broadcast": 12,
                 "alltoall": 10, "reducescatter": 10, "barrier": 6}
_FIRST_DIMS = (0, 1, 1, 2, 3, 5, 7, 16, 33, 100, 1001)
_TRAILING = ((), (), (1,), (3,), (2, 3))


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str                  # a key of _KIND_WEIGHTS
    set_index: Optional[int]   # None: the global set; else the index of an AddSet step's set
    members: tuple             # global ranks taking part, ascending
    dtypes: tuple              # one per tensor (grouped_allreduce has several)
    shapes: tuple              # shapes[member position][tensor]
    op: str = "sum"
    root: int = 0              # broadcast: a global rank of the set
    splits: Optional[tuple] = None  # alltoall: splits[member position] (None: even split)
    waited: bool = True        # False: submitted async, waited by a later Wait
    name: Optional[str] = None  # None: an unnamed op (the API's per-set counter names it)
    scales: tuple = (1.0, 1.0)  # allreduce prescale, postscale


@dataclasses.dataclass(frozen=True)
class AddSet:
    ranks: tuple


@dataclasses.dataclass(frozen=True)
class RemoveSet:
    set_index: int


@dataclasses.dataclass(frozen=True)
class Wait:
    """Wait for every op this rank submitted async, in an order of its own."""


@dataclasses.dataclass(frozen=True)
class Join:
    set_index: Optional[int]
    members: tuple
    counts: tuple              # allreduces run before joining, per member position
    allreduces: tuple          # Collective allreduces; number t runs on the members with count > t


@dataclasses.dataclass(frozen=True)
class Inject:
    kind: str                  # FAILURE_KINDS
    victim: int                # global rank in this program's world


@dataclasses.dataclass(frozen=True)
class Program:
    seed: int
    size: int
    steps: tuple
    failure: Optional[Inject]


def generate(seed: int, size: int) -> Program:
    """The program of ``seed`` in a world of ``size`` ranks; the same on every rank."""
    rng = random.Random(f"random-program/{seed}/{size}")  # str seeds hash the same everywhere
    p2p_rng = random.Random(f"random-program-p2p/{seed}/{size}")
    count = rng.randint(5, 30)
    failure = None
    if size > 1 and rng.random() < 0.6:
        failure = Inject(rng.choice(FAILURE_KINDS), rng.randrange(size))
    fail_at = rng.randint(0, count)
    sets: dict = {}          # set index -> members, for the sets added and not removed
    steps: list = []
    pending = False          # some async op not waited yet
    for i in range(count):
        if failure is not None and i == fail_at:
            steps.append(failure)
        if size > 1 and p2p_rng.random() < 0.15:
            steps.append(p2p.generate(p2p_rng, size))
        weights = {"collective": 75, "add": 6 if len(sets) < 3 else 0,
                   "remove": 4 if sets else 0, "wait": 9 if pending else 0, "join": 6}
        action = rng.choices(list(weights), weights=list(weights.values()))[0]
        if action != "collective":  # sets change and joins start with no op in flight
            pending = _wait_first(steps, pending)
        if action == "add":
            ranks = tuple(sorted(rng.sample(range(size), rng.randint(1, size))))
            if ranks not in sets.values():  # a second set of the same ranks is refused
                steps.append(AddSet(ranks))
                sets[len(steps) - 1] = ranks
        elif action == "remove":
            index = rng.choice(sorted(sets))
            steps.append(RemoveSet(index))
            del sets[index]
        elif action in ("join", "collective"):
            set_index, members = _pick_set(rng, sets, size)
            if action == "join":
                steps.append(_join(rng, f"s{i}", set_index, members))
            else:
                steps.append(_collective(rng, f"s{i}", set_index, members))
                pending = pending or not steps[-1].waited
    if failure is not None and fail_at == count:
        steps.append(failure)
    _wait_first(steps, pending)
    steps.append(Collective("allreduce", None, tuple(range(size)), ("int64",),
                            tuple(((1,),) for _ in range(size)), name="end"))
    return Program(seed, size, tuple(steps), failure)


def _wait_first(steps: list, pending: bool) -> bool:
    if pending:
        steps.append(Wait())
    return False


def _pick_set(rng: random.Random, sets: dict, size: int) -> tuple:
    if sets and rng.random() < 0.4:
        index = rng.choice(sorted(sets))
        return index, sets[index]
    return None, tuple(range(size))


def _shape(rng: random.Random, first: Optional[int] = None) -> tuple:
    dim0 = rng.choice(_FIRST_DIMS) if first is None else first
    if rng.random() < 0.03:
        dim0 = 70001  # past the 256 KiB pieces of the shm pipeline for every dtype
    return (dim0,) + rng.choice(_TRAILING)


def _reduce_op(rng: random.Random, dtypes: tuple, allowed=REDUCE_OPS) -> str:
    if "bool" in dtypes:  # bool reduces by Min (and) and Max (or) only
        allowed = tuple(op for op in allowed if op in ("min", "max"))
    return rng.choice(allowed)


def _collective(rng: random.Random, name: str, set_index, members: tuple) -> Collective:
    kind = rng.choices(list(_KIND_WEIGHTS), weights=list(_KIND_WEIGHTS.values()))[0]
    k = len(members)
    dtype = rng.choice(DTYPES if kind != "reducescatter" else DTYPES[:-1])
    common = dict(set_index=set_index, members=members, dtypes=(dtype,),
                  waited=kind == "barrier" or rng.random() < 0.6,
                  name=name if rng.random() < 0.7 else None)
    if kind == "barrier":
        return Collective(kind, shapes=(((),),) * k, **common)
    if kind == "allgather":
        rest = rng.choice(_TRAILING)
        shapes = tuple(((rng.choice(_FIRST_DIMS),) + rest,) for _ in members)
        return Collective(kind, shapes=shapes, **common)
    if kind == "alltoall":
        rest = rng.choice(_TRAILING)
        if rng.random() < 0.3:  # no splits: dimension 0 divides evenly
            shape = (k * rng.choice((0, 1, 3)),) + rest
            return Collective(kind, shapes=((shape,),) * k, **common)
        splits = tuple(tuple(rng.choice((0, 0, 1, 2, 3, 7)) for _ in members) for _ in members)
        shapes = tuple(((sum(row),) + rest,) for row in splits)
        return Collective(kind, shapes=shapes, splits=splits, **common)
    if kind == "grouped_allreduce":
        dtypes = tuple(rng.choice(DTYPES) for _ in range(rng.randint(1, 4)))
        shape_list = tuple(_shape(rng) for _ in dtypes)
        common["dtypes"] = dtypes
        return Collective(kind, shapes=(shape_list,) * k, op=_reduce_op(rng, dtypes), **common)
    shape = _shape(rng) if kind == "reducescatter" or rng.random() < 0.9 else ()
    if kind == "broadcast":
        return Collective(kind, shapes=((shape,),) * k, root=rng.choice(members), **common)
    if kind == "reducescatter":
        return Collective(kind, shapes=((shape,),) * k, op=rng.choice(("sum", "avg")), **common)
    op = _reduce_op(rng, (dtype,))
    scales = (1.0, 1.0)
    if dtype.startswith("float") and op in ("sum", "avg") and rng.random() < 0.2:
        scales = (rng.choice((0.5, 2.0)), rng.choice((0.5, 1.0, 2.0)))  # exact in binary
    return Collective(kind, shapes=((shape,),) * k, op=op, scales=scales, **common)


def _join(rng: random.Random, name: str, set_index, members: tuple) -> Join:
    counts = tuple(rng.randint(0, 3) for _ in members)
    allreduces = []
    for t in range(max(counts)):
        dtype = rng.choice(DTYPES)
        shape = _shape(rng)
        allreduces.append(Collective("allreduce", set_index, members, (dtype,),
                                     ((shape,),) * len(members), op=_reduce_op(rng, (dtype,)),
                                     name=f"{name}.j{t}"))
    return Join(set_index, members, counts, tuple(allreduces))


def describe(program: Program) -> str:
    """The replayable listing: seed, size and one line per step."""
    lines = [f"program seed={program.seed} np={program.size} failure={program.failure}"]
    for i, step in enumerate(program.steps):
        lines.append(f"  {i:2d} {step_text(step)}")
    return "\n".join(lines)


def step_text(step) -> str:
    if isinstance(step, Collective):
        where = "global" if step.set_index is None else f"set@{step.set_index}{list(step.members)}"
        shapes = [s for s in step.shapes[0]] if len({*step.shapes}) == 1 else list(step.shapes)
        extra = {"broadcast": f" root={step.root}", "alltoall": f" splits={step.splits}"}
        return (f"{step.kind}({step.name or 'unnamed'}) {where} {'/'.join(step.dtypes)} "
                f"{shapes} op={step.op}{extra.get(step.kind, '')}"
                f"{'' if step.waited else ' async'}"
                f"{'' if step.scales == (1.0, 1.0) else f' scales={step.scales}'}")
    if isinstance(step, Join):
        where = "global" if step.set_index is None else f"set@{step.set_index}"
        ops = ", ".join(f"{a.dtypes[0]}{list(a.shapes[0][0])} {a.op}" for a in step.allreduces)
        return f"join {where} members={list(step.members)} counts={list(step.counts)} [{ops}]"
    if isinstance(step, p2p.PointToPoint):
        return p2p.text(step)
    return repr(step)
