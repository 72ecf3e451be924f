"""Pipeline schedules as data (issue #36): every rank builds the same action table, so a
schedule can be checked (``schedule_check.check``) and its idle time and memory counted
(``schedule_check.simulate``) before any rank runs a step of it.

A pipeline of ``stages`` stages runs ``microbatches`` micro-batches through ``ranks`` ranks.
Stage ``s`` lives on rank ``s % ranks`` (one stage per rank, or ``stages_per_rank`` stages
placed round-robin, as Megatron's interleaved schedule and torch's ``ScheduleInterleaved1F1B``
place them). Each rank's program is a list of actions, run in order:

- ``F`` / ``B``: the forward / backward of one micro-batch through one stage;
- ``SEND_F`` / ``RECV_F``: a stage's output to the next stage's rank, and its receipt there;
- ``SEND_B`` / ``RECV_B``: a stage's input gradient to the previous stage's rank, and its
  receipt there.

Sends do not wait for their receiver (they are ``isend``s); a receive waits for its send. A
hop between two stages of one rank (one rank alone) is a local hand-off with no action.

Schedules (their names are ``torch.distributed.pipelining``'s):

- ``gpipe``: every micro-batch forward, then every backward (GPipe; peak activations M).
- ``1f1b``: rank r runs ``min(K - 1 - r, M)`` forwards, then alternates one forward and one
  backward, then the remaining backwards (PipeDream-flush; peak activations K - r).
- ``interleaved_1f1b``: 1F1B over ``stages_per_rank`` = V > 1 chunks per rank, micro-batches in
  groups of K per chunk (Megatron's order; needs M to be a multiple of K), bubble
  (K - 1) / (V M + K - 1) of the step instead of (K - 1) / (M + K - 1).
- ``forward_only`` (inference): the forwards of ``gpipe``, no backward (with
  ``stages_per_rank`` > 1, a rank's stages one after the other).
"""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B")
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "forward_only")


class ScheduleError(ValueError):
    """A schedule that cannot run: the reason names the rank, action and what is wrong."""


@dataclass(frozen=True)
class Action:
    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind} stage {self.stage} mb {self.microbatch}"


@dataclass(frozen=True)
class Schedule:
    name: str
    ranks: int
    stages: int
    microbatches: int
    programs: tuple[tuple[Action, ...], ...]   # programs[r]: rank r's actions, in order

    def rank_of(self, stage: int) -> int:
        return stage % self.ranks

    @property
    def training(self) -> bool:
        return self.name != "forward_only"


def build(name: str, ranks: int, microbatches: int, stages_per_rank: int = 1) -> Schedule:
    """The action table of schedule ``name`` (one of SCHEDULES); identical on every rank.

    Raises ScheduleError when the combination cannot run, with what to change."""
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown pipeline schedule {name!r}; use one of "
                            f"{', '.join(SCHEDULES)}")
    for what, value in (("ranks", ranks), ("microbatches", microbatches),
                        ("stages_per_rank", stages_per_rank)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError(f"pipeline schedule {name}: {what} must be a positive integer, "
                                f"got {value!r}")
    if name == "interleaved_1f1b":
        if stages_per_rank < 2:
            raise ScheduleError("interleaved_1f1b needs stages_per_rank >= 2 (with one stage "
                                "per rank it is 1f1b; use schedule='1f1b')")
        if microbatches % ranks:
            raise ScheduleError(f"interleaved_1f1b runs micro-batches in groups of the pipeline's "
                                f"{ranks} ranks: microbatches={microbatches} is not a multiple "
                                f"of {ranks}; use {(microbatches // ranks + 1) * ranks} "
                                f"micro-batches, or schedule='1f1b'")
    elif stages_per_rank != 1 and name != "forward_only":
        raise ScheduleError(f"{name} places one stage per rank; stages_per_rank="
                            f"{stages_per_rank} needs schedule='interleaved_1f1b'")
    stages = ranks * stages_per_rank
    orders = {"gpipe": _gpipe_order, "forward_only": _forward_only_order,
              "1f1b": _one_f_one_b_order, "interleaved_1f1b": _interleaved_order}[name]
    programs = tuple(tuple(_with_communication(orders(r, ranks, microbatches, stages_per_rank),
                                               ranks, stages))
                     for r in range(ranks))
    return Schedule(name, ranks, stages, microbatches, programs)


# ---- compute orders: (kind, stage, microbatch) per rank, communication added after ----------

def _gpipe_order(rank, ranks, microbatches, _v):
    return ([("F", rank, m) for m in range(microbatches)] +
            [("B", rank, m) for m in range(microbatches)])


def _forward_only_order(rank, ranks, microbatches, chunks):
    return [("F", rank + c * ranks, m) for c in range(chunks) for m in range(microbatches)]


def _one_f_one_b_order(rank, ranks, microbatches, _v):
    warmup = min(ranks - 1 - rank, microbatches)
    order = [("F", rank, m) for m in range(warmup)]
    for k in range(microbatches - warmup):
        order += [("F", rank, warmup + k), ("B", rank, k)]
    order += [("B", rank, m) for m in range(microbatches - warmup, microbatches)]
    return order


def _interleaved_order(rank, ranks, microbatches, chunks):
    """Megatron's interleaved 1F1B: the k-th forward of a rank takes chunk (k // K) % V of
    micro-batch (k // (K V)) K + k % K; backwards walk the chunks in reverse. Warm-up:
    2 (K - 1 - r) + (V - 1) K forwards."""
    total = microbatches * chunks

    def unit(k: int, forward: bool):
        chunk = (k // ranks) % chunks
        if not forward:
            chunk = chunks - 1 - chunk
        return rank + chunk * ranks, (k // (ranks * chunks)) * ranks + k % ranks

    warmup = min(2 * (ranks - 1 - rank) + (chunks - 1) * ranks, total)
    order = [("F", *unit(k, True)) for k in range(warmup)]
    for k in range(total - warmup):
        order += [("F", *unit(warmup + k, True)), ("B", *unit(k, False))]
    order += [("B", *unit(k, False)) for k in range(total - warmup, total)]
    return order


def _with_communication(order, ranks: int, stages: int) -> list[Action]:
    """Each compute action with the receive it needs just before it and the send it makes just
    after it (no action for a hop inside one rank)."""
    program: list[Action] = []
    for kind, stage, mb in order:
        forward = kind == "F"
        source = stage - 1 if forward else stage + 1       # the stage that feeds this one
        target = stage + 1 if forward else stage - 1       # the stage this one feeds
        if 0 <= source < stages and source % ranks != stage % ranks:
            program.append(Action("RECV_F" if forward else "RECV_B", stage, mb))
        program.append(Action(kind, stage, mb))
        if 0 <= target < stages and target % ranks != stage % ranks:
            program.append(Action("SEND_F" if forward else "SEND_B", stage, mb))
    return program


def ideal_bubble(ranks: int, microbatches: int, stages_per_rank: int = 1) -> float:
    """The idle fraction of a step with balanced stages and free communication:
    (K - 1) / (V M + K - 1) (GPipe's (K - 1) / (M + K - 1) at V = 1)."""
    return (ranks - 1) / (stages_per_rank * microbatches + ranks - 1)
