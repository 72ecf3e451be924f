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
  groups of K to 2K - 1 per chunk (Megatron's order, groups of K when K divides M; any M >= 1,
  Note [Interleaved groups]), bubble (K - 1) / (V M + K - 1) of the step instead of
  (K - 1) / (M + K - 1) when M >= K.
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


def interleaved_groups(ranks: int, microbatches: int) -> tuple[int, ...]:
    """The sizes of interleaved 1F1B's micro-batch groups, in order (Note [Interleaved groups],
    a): max(1, M // K) groups as equal as can be, the larger first."""
    count = max(1, microbatches // ranks)
    size, larger = divmod(microbatches, count)
    return tuple(size + (g < larger) for g in range(count))


def _interleaved_order(rank, ranks, microbatches, chunks):
    """Note [Interleaved groups]: the same (stage, micro-batch) units on every rank, group by
    group; warm-up (V - 1) G + 2 (K - 1 - r) forwards, G the largest group."""
    groups = interleaved_groups(ranks, microbatches)
    forwards, backwards, first = [], [], 0
    for size in groups:
        batch = range(first, first + size)
        forwards += [(rank + c * ranks, m) for c in range(chunks) for m in batch]
        backwards += [(rank + c * ranks, m) for c in reversed(range(chunks)) for m in batch]
        first += size
    total = len(forwards)
    warmup = min((chunks - 1) * groups[0] + 2 * (ranks - 1 - rank), total)
    order = [("F", *unit) for unit in forwards[:warmup]]
    for k in range(total - warmup):
        order += [("F", *forwards[warmup + k]), ("B", *backwards[k])]
    order += [("B", *unit) for unit in backwards[total - warmup:]]
    return order


# Note [Interleaved groups]: interleaved 1F1B for any number M >= 1 of micro-batches, on K
# ranks with V stages (chunks) each, stage s on rank s % K.
# (a) The micro-batches are split, in order, into R = max(1, M // K) groups of ceil(M / R) or
#     floor(M / R), the larger first; G = ceil(M / R) is the largest. With M >= K every group
#     has K to 2K - 1 micro-batches; with M < K there is one group of M. When K divides M these
#     are Megatron's groups of K (the tables are those of when M had to be a multiple of K),
#     when R divides M torch's rounds.
# (b) Every rank runs the same sequence of units: group by group, chunks 0..V-1 forward, each
#     chunk over the group's micro-batches in order; the backwards the same with the chunks
#     reversed. A stage sees its micro-batches in increasing order both ways, so its gradient
#     sums them in the order of single-process gradient accumulation.
# (c) Rank r runs w_r = min(VM, (V - 1) G + 2 (K - 1 - r)) forwards, then a forward and a
#     backward in turn, then the remaining backwards. The last rank's first backward in a group
#     (its last chunk) comes (V - 1) G_i units after that group's first forward, hence
#     (V - 1) G; each rank before it needs two more (the forward going on, the backward coming
#     back). As w_r >= w_{r+1}, a rank has always forwarded what the next rank needs before
#     its own backward waits for that rank: the table has no cycle (schedule_check.check).
# (d) Groups of at least K: a micro-batch's chunk c + 1 on rank 0 needs its chunk c from rank
#     K - 1, K forwards later, and a group of K or more keeps rank 0 busy meanwhile with its
#     other micro-batches. A smaller group is still sound, but rank 0 idles for the difference
#     at each chunk change: hence the remainder of M / K is spread over the groups, not left
#     as a last small group, and only M < K (one group) has a larger bubble (e).
# (e) Bubble (balanced stages, free communication, ideal_bubble): (K - 1) / (VM + K - 1) for
#     M >= K. For M < K no rank ever has two units ready at once: the step is a GPipe of VK
#     stages, (VK + M - 1) units of forward and backward long, bubble 1 - VM / (VK + M - 1).
# (f) Memory: rank r holds at most min(VM, w_r + 1) stage-micro-batches (forwarded, not yet
#     backward), exactly that at its peak; rank 0, the rank of stage 0, the most:
#     min(VM, (V - 1) G + 2K - 1): min(VM, (V + 1) K - 1) when K divides M, at most V (2K - 1)
#     for any M (G <= 2K - 1), where GPipe holds VM. Stage 0 itself holds at most min(M, 2G)
#     micro-batches (the group whose backwards have begun and the next) for V <= 4; with more
#     chunks and unequal groups up to min(K - 1, V - 4) more (the warm-up, sized for the largest
#     group, runs further into a smaller one; seen for K <= 7, V <= 10, M <= 60). The rank
#     bound, and stage 0's for V <= 4, are asserted on the tables by
#     tests/unit/test_pipeline_schedule.py; the V > 4 excess was only observed. A remainder
#     costs memory: with K <= M < 2K there is one group (G = M), so rank 0 holds all V M, as
#     GPipe does, where the next multiple of K would hold (V + 1) K - 1.


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
    (K - 1) / (V M + K - 1) (GPipe's (K - 1) / (M + K - 1) at V = 1); with V > 1 and M < K,
    1 - V M / (V K + M - 1) (Note [Interleaved groups], e). One expression for both:
    1 - V M / (V max(M, K) + min(M, K) - 1)."""
    v, m, k = stages_per_rank, microbatches, ranks
    span = v * max(m, k) + min(m, k) - 1
    return (span - v * m) / span
