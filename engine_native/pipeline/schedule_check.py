"""Checks a pipeline action table (schedule.py) before a step runs it, and counts what a step
of it costs. ``check`` refuses, with the reason, a table in which some stage or micro-batch is
missing or repeated, a send has no matching receive (or the reverse), an action comes before
what it needs on its rank, or the ranks would wait for each other in a cycle. ``simulate``
runs the table with given compute costs and free communication: the step's length, each
rank's idle fraction (the measured bubble to set beside ``ideal_bubble``) and the most
micro-batches whose activations a rank, and a stage, holds at once.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from engine_native.pipeline.schedule import KINDS, Action, Schedule, ScheduleError

# A send's counterpart: the receive it satisfies, on the neighbouring stage.
_RECEIVER = {"SEND_F": ("RECV_F", +1), "SEND_B": ("RECV_B", -1)}
_SENDER = {"RECV_F": ("SEND_F", -1), "RECV_B": ("SEND_B", +1)}


@dataclass(frozen=True)
class StepCost:
    makespan: float                       # the step, first action to last, any rank
    busy: tuple[float, ...]               # per rank: time computing
    idle_fraction: tuple[float, ...]      # per rank: 1 - busy / makespan (the bubble)
    peak_activations: tuple[int, ...]     # per rank: most micro-batches forwarded, not yet back
    stage_peaks: tuple[int, ...]          # per stage: the same, of that stage alone


def check(schedule: Schedule) -> None:
    """Raises ScheduleError naming the first problem; returns None for a table that runs."""
    expected = _expected_actions(schedule)
    seen: Counter = Counter()
    for rank, program in enumerate(schedule.programs):
        done = set()
        for index, action in enumerate(program):
            where = f"pipeline schedule {schedule.name}: rank {rank}, action {index} ({action})"
            _check_action(schedule, rank, action, where)
            missing = [str(need) for need in _needs(schedule, action) if need not in done]
            if missing:
                raise ScheduleError(f"{where} comes before {', '.join(missing)} on that rank")
            done.add(action)
            seen[action] += 1
    for action, count in seen.items():
        if count > 1:
            raise ScheduleError(f"pipeline schedule {schedule.name}: {action} appears {count} "
                                f"times on rank {schedule.rank_of(action.stage)}")
    absent = [a for a in expected if a not in seen]
    if absent:
        raise ScheduleError(f"pipeline schedule {schedule.name}: no rank runs {absent[0]}"
                            + (f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""))
    wanted = set(expected)  # (a list's `in` made this quadratic: 18 s at K 8, M 64, V 4)
    extra = [a for a in seen if a not in wanted]
    if extra:
        raise ScheduleError(f"pipeline schedule {schedule.name}: {extra[0]} is not part of "
                            f"this pipeline (a {'training' if schedule.training else 'forward-only'}"
                            f" schedule of {schedule.stages} stages on {schedule.ranks} ranks)")
    simulate(schedule)  # a cycle of waiting ranks is refused there


def simulate(schedule: Schedule, forward_cost: float = 1.0,
             backward_cost: float = 2.0) -> StepCost:
    """Runs the table: compute actions take their cost, sends are free and do not wait, a
    receive waits for its send. Raises ScheduleError when ranks wait for each other forever,
    naming what each waits for."""
    ranks = schedule.ranks
    pc = [0] * ranks
    clock = [0.0] * ranks
    busy = [0.0] * ranks
    held = [0] * ranks
    peak = [0] * ranks
    stage_held = [0] * schedule.stages
    stage_peak = [0] * schedule.stages
    arrivals: dict[Action, float] = {}   # receive action -> when its send happened
    moved = True
    while moved:
        moved = False
        for r in range(ranks):
            program = schedule.programs[r]
            while pc[r] < len(program):
                action = program[pc[r]]
                if action.kind in _SENDER:
                    if action not in arrivals:
                        break
                    clock[r] = max(clock[r], arrivals.pop(action))
                elif action.kind in _RECEIVER:
                    kind, step = _RECEIVER[action.kind]
                    arrivals[Action(kind, action.stage + step, action.microbatch)] = clock[r]
                else:
                    cost = forward_cost if action.kind == "F" else backward_cost
                    clock[r] += cost
                    busy[r] += cost
                    if schedule.training:
                        delta = 1 if action.kind == "F" else -1
                        held[r] += delta
                        peak[r] = max(peak[r], held[r])
                        stage_held[action.stage] += delta
                        stage_peak[action.stage] = max(stage_peak[action.stage],
                                                       stage_held[action.stage])
                pc[r] += 1
                moved = True
    blocked = [r for r in range(ranks) if pc[r] < len(schedule.programs[r])]
    if blocked:
        raise ScheduleError(f"pipeline schedule {schedule.name} never finishes: "
                            + "; ".join(_waiting(schedule, r, schedule.programs[r][pc[r]])
                                        for r in blocked))
    makespan = max(clock) if ranks else 0.0
    idle = tuple(1.0 - b / makespan if makespan > 0 else 0.0 for b in busy)
    return StepCost(makespan, tuple(busy), idle, tuple(peak), tuple(stage_peak))


def _waiting(schedule: Schedule, rank: int, action: Action) -> str:
    _, step = _SENDER[action.kind]
    source = action.stage + step
    return (f"rank {rank} waits for {action.kind.lower().replace('_', ' ')} of stage "
            f"{action.stage} mb {action.microbatch} from rank {schedule.rank_of(source)}")


def _check_action(schedule: Schedule, rank: int, action: Action, where: str) -> None:
    if not isinstance(action, Action) or action.kind not in KINDS:
        raise ScheduleError(f"{where}: not an action of {', '.join(KINDS)}")
    if not 0 <= action.stage < schedule.stages:
        raise ScheduleError(f"{where}: the pipeline has stages 0..{schedule.stages - 1}")
    if not 0 <= action.microbatch < schedule.microbatches:
        raise ScheduleError(f"{where}: the step has micro-batches "
                            f"0..{schedule.microbatches - 1}")
    if not schedule.training and action.kind in ("B", "SEND_B", "RECV_B"):
        raise ScheduleError(f"{where}: a forward-only schedule has no backward")
    if schedule.rank_of(action.stage) != rank:
        raise ScheduleError(f"{where}: stage {action.stage} lives on rank "
                            f"{schedule.rank_of(action.stage)}")


def _remote(schedule: Schedule, stage: int, neighbour: int) -> bool:
    return (0 <= neighbour < schedule.stages and
            schedule.rank_of(neighbour) != schedule.rank_of(stage))


def _needs(schedule: Schedule, action: Action) -> list[Action]:
    """What must come earlier on the same rank."""
    s, m = action.stage, action.microbatch
    if action.kind == "F":
        if _remote(schedule, s, s - 1):
            return [Action("RECV_F", s, m)]
        return [Action("F", s - 1, m)] if s > 0 else []
    if action.kind == "B":
        needs = [Action("F", s, m)]
        if _remote(schedule, s, s + 1):
            needs.append(Action("RECV_B", s, m))
        elif s + 1 < schedule.stages:
            needs.append(Action("B", s + 1, m))
        return needs
    if action.kind == "SEND_F":
        return [Action("F", s, m)]
    if action.kind == "SEND_B":
        return [Action("B", s, m)]
    return []


def _expected_actions(schedule: Schedule) -> list[Action]:
    expected = []
    for s in range(schedule.stages):
        for m in range(schedule.microbatches):
            expected.append(Action("F", s, m))
            if _remote(schedule, s, s + 1):
                expected.append(Action("SEND_F", s, m))
            if _remote(schedule, s, s - 1):
                expected.append(Action("RECV_F", s, m))
            if schedule.training:
                expected.append(Action("B", s, m))
                if _remote(schedule, s, s - 1):
                    expected.append(Action("SEND_B", s, m))
                if _remote(schedule, s, s + 1):
                    expected.append(Action("RECV_B", s, m))
    return expected
