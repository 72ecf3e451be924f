"""Parent side of the random programs: run a batch of seeds in one set of long-lived rank
processes (random_program_rank.run_batch), and turn every rank's records into one outcome per
program: its problems (wrong results, hangs, a live rank without an exception, an exception
later than HVD_TIMEOUT + 1 s after the injection, an exception nobody injected) and figures.

Every problem names the seed and world size and carries the program's listing; replay one
with ``python benchmarks/random_programs.py --seed S --np N``.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import re
import shutil
import signal
import tempfile
from typing import Optional, Sequence

from multiproc import random_program as rp
from multiproc import random_program_rank as rank_side
from multiproc.harness import run_ranks

LATENCY_SLACK = 1.0  # an injected failure must reach every live rank within HVD_TIMEOUT + this


@dataclasses.dataclass
class Outcome:
    seed: int
    np: int
    steps: int
    failure: Optional[str]    # the kind injected; None when none was (or a stop missed)
    planned: Optional[str]    # the kind the program planned
    latency: Optional[float]  # the slowest live rank's exception after the injection
    seconds: float
    wrong: int = 0
    problems: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class BatchResult:
    outcomes: list
    problems: list            # every problem of the batch, each with seed and listing
    hangs: list               # (np, text) per hang


def plan_seeds(size: int, kinds: Sequence[Optional[str]], first: int = 0) -> list:
    """The first seeds (from ``first``) whose programs inject ``kinds`` in this order (None:
    no failure), following the world as kills shrink it: a deterministic CI selection."""
    seeds, seed = [], first
    for kind in kinds:
        while True:
            failure = rp.generate(seed, size).failure
            seed += 1
            if (failure.kind if failure else None) == kind:
                seeds.append(seed - 1)
                break
        size -= kind == "kill"
    return seeds


def run_seeds(seeds: Sequence[int], size: int, hvd_timeout: float = 3.0,
              budget: Optional[float] = None, hosts: int = 1,
              api: str = "numpy") -> BatchResult:
    """Run the programs of ``seeds`` one after another on ``size`` ranks, over ``hosts`` fake
    hosts in blocks (HVD_HOSTNAME: shared memory within one, TCP between them), through
    ``api`` (random_program_rank.run_batch)."""
    budget = budget or 30 + 3 * hvd_timeout
    rank_env = {r: {"HVD_HOSTNAME": f"randhost{r * hosts // size}"}
                for r in range(size)} if hosts > 1 else None
    work_dir = tempfile.mkdtemp(prefix="hvd-randprog-")
    try:
        results = run_ranks(rank_side.run_batch, size,
                            args=(list(seeds), size, work_dir, budget, api),
                            timeout=len(seeds) * budget + 60, check=False,
                            env={"HVD_TIMEOUT": str(hvd_timeout)}, rank_env=rank_env)
        records = _records(work_dir, size, len(seeds))
    except AssertionError as exc:  # the harness's own time limit: every watchdog missed it
        return BatchResult([], [f"np {size} seeds {list(seeds)}: {exc}"[:20000]], [(size, "")])
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return _merge(results, records, hvd_timeout)


def _records(work_dir: str, size: int, count: int) -> dict:
    """program index -> the records of the slots that finished it."""
    records: dict = {}
    for k in range(count):
        for slot in range(size):
            path = rank_side.record_path(work_dir, slot, k)
            if os.path.exists(path):
                with open(path, "rb") as fh:
                    records.setdefault(k, []).append(pickle.load(fh))
    return records


def _merge(results: list, records: dict, hvd_timeout: float) -> BatchResult:
    problems, hangs, killed = [], [], set()
    for r in results:
        if r.returncode == rank_side.HANG_EXIT:
            line = next((x for x in r.stdout.splitlines() if x.startswith("HANG")), "HANG ?")
            hangs.append((int(re.search(r"np=(\d+)", line + " np=0").group(1)), line))
        elif r.returncode == -signal.SIGKILL:
            killed.add(r.rank)
        elif not (r.ok and r.returncode == 0):
            problems.append(f"slot {r.rank} failed outside a program:\n{r.describe()}")
    if hangs:  # each hung rank's line, then the program's listing (after the first line)
        text = next(r.stdout for r in results if r.returncode == rank_side.HANG_EXIT)
        listing = text[text.index("HANG"):].split("\n", 1)[1]
        problems.append("HANG:\n" + "\n".join(line for _, line in hangs) + "\n" + listing[:6000])
    outcomes = [_outcome(records[k], hvd_timeout, killed) for k in sorted(records)]
    pids: dict = {}  # slot -> the processes its programs ran in: one, or a rank was replaced
    for k in records:
        for rec in records[k]:
            pids.setdefault(rec["slot"], set()).add(rec["pid"])
    problems += [f"slot {slot} ran its programs in processes {sorted(p)}, not one"
                 for slot, p in pids.items() if len(p) > 1]
    for outcome in outcomes:
        if outcome.problems:
            listing = rp.describe(rp.generate(outcome.seed, outcome.np))
            problems.append(f"seed {outcome.seed} np {outcome.np} (replay: --seed "
                            f"{outcome.seed} --np {outcome.np}):\n  "
                            + "\n  ".join(outcome.problems) + "\n" + listing)
    return BatchResult(outcomes, problems, hangs)


def _outcome(records: list, hvd_timeout: float, killed: set) -> Outcome:
    first = records[0]
    planned = first["failure"]
    injected = any(rec["injected"] for rec in records)
    outcome = Outcome(first["seed"], first["np"], first["steps"],
                      planned if injected else None, planned, None,
                      max(rec["seconds"] for rec in records))
    ran = {rec["slot"] for rec in records}
    world = first["world"]
    victim_slot = None
    for rec in records:
        outcome.wrong += len(rec["wrong"])
        outcome.problems += [f"slot {rec['slot']}: wrong result: {w}" for w in rec["wrong"]]
        if rec["unexpected"]:
            outcome.problems.append(f"slot {rec['slot']}: {rec['unexpected']}")
        if rec["victim"]:
            victim_slot = rec["slot"]
    missing = [s for s in world if s not in ran]
    if planned == "kill" and injected and len(missing) == 1 and missing[0] in killed:
        victim_slot = missing[0]
    elif missing:
        outcome.problems.append(f"slots {missing} left no record of this program")
    if not injected:
        return outcome
    bound = hvd_timeout + LATENCY_SLACK
    for rec in records:
        if rec["slot"] == victim_slot:
            if planned == "stop" and rec["error_step"] is None:
                outcome.problems.append(f"slot {rec['slot']}: resumed after its stop, no error")
            continue
        if rec["error_step"] is None:
            outcome.problems.append(f"slot {rec['slot']}: no exception after the {planned}")
        elif rec["latency"] is not None:
            outcome.latency = max(outcome.latency or 0.0, rec["latency"])
            if not 0 <= rec["latency"] <= bound:
                outcome.problems.append(
                    f"slot {rec['slot']}: exception {rec['latency']:.2f} s after the {planned} "
                    f"(bound {bound:g} s), at step {rec['error_step']}: {rec['error']}")
    return outcome


def table(outcomes: list, hangs: list) -> str:
    """np | programs | steps | injected failures by kind | hangs | wrong results | max
    failure-to-exception latency | seconds (the programs' own, init to shutdown)."""
    rows = ["| np | programs | steps | injected: abort / raise / kill / stop (stops missed) "
            "| hangs | wrong results | max latency (s) | seconds |", "|" + "---|" * 8]
    for n in sorted({o.np for o in outcomes} | {m for m, _ in hangs}) + ["all"]:
        mine = [o for o in outcomes if n == "all" or o.np == n]
        kinds = " / ".join(str(sum(o.failure == k for o in mine)) for k in rp.FAILURE_KINDS)
        missed = sum(o.planned == "stop" and o.failure is None for o in mine)
        latencies = [o.latency for o in mine if o.latency is not None]
        latency = f"{max(latencies):.2f}" if latencies else "-"
        hung = sum(1 for m, _ in hangs if n == "all" or m == n)
        rows.append(f"| {n} | {len(mine)} | {sum(o.steps for o in mine)} | {kinds} ({missed}) "
                    f"| {hung} | {sum(o.wrong for o in mine)} | {latency} "
                    f"| {sum(o.seconds for o in mine):.0f} |")
    return "\n".join(rows)


def latency_by_kind(outcomes: list) -> str:
    """The slowest failure-to-exception latency of each failure kind."""
    parts = []
    for kind in rp.FAILURE_KINDS:
        latencies = [o.latency for o in outcomes if o.failure == kind and o.latency is not None]
        parts.append(f"{kind} {max(latencies):.2f}" if latencies else f"{kind} -")
    return "max latency by kind (s): " + ", ".join(parts)
