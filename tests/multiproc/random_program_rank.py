"""Rank side of the random programs: one rank process runs a batch of programs, one after
another, in the same process: init -> program -> shutdown (after an abort or a failure too)
-> init of the next.

Worlds. The harness's ranks are slots 0..np-1. A program runs on the live slots, renumbered
in order; a slot killed by a program (SIGKILL) is gone, so the next program runs on the
survivors, in the same processes, as a world one rank smaller. A stopped slot (SIGSTOP) is
resumed (SIGCONT) once every survivor has its exception, gets its own, and stays in the world;
so do the slots that aborted or raised.

Failure protocol. The victim stores in the harness's rendezvous store, before it injects, the
CLOCK_MONOTONIC time of the injection (the same clock in every process of the machine), or
"none" when its program ended before reaching the injection; every other rank reads it after
its exception, so the latency is measured on one clock. A stop is retried under a new name when
it missed the op (its outcome per attempt is stored the same way).

Hangs. A watchdog per program (a timer thread, asleep until its deadline) prints which step
this rank is at, with the seed, and ends the process with HANG_EXIT; the other ranks' programs
then fail and their watchdogs report their own steps.
"""
from __future__ import annotations

import os
import pickle
import random
import signal
import sys
import threading
import time
import traceback

import numpy as np

from multiproc import checks, faults
from multiproc import random_program as rp
from multiproc import random_program_expect as expect
from multiproc import random_program_p2p as p2p

HANG_EXIT = 86
STOP_ATTEMPTS = 5


class InjectedError(RuntimeError):
    """The exception a 'raise' victim throws in its program."""


def run_batch(seeds, size: int, work_dir: str, budget: float, api: str = "numpy") -> int:
    """Run the program of every seed in turn on the live slots, through ``api`` ("numpy":
    engine_native; "torch": engine_native.torch, random_program_torch.py). The record of each
    program goes to ``work_dir`` as it ends (record_path), where a later kill or hang leaves
    it."""
    if api == "torch":
        from multiproc import random_program_torch as hvd
    else:
        import engine_native as hvd

    slot = int(os.environ["HVD_RANK"])
    faults.write_pid(work_dir, f"slot{slot}")
    world = list(range(size))
    oob = checks.out_of_band()
    try:
        for k, seed in enumerate(seeds):
            program = rp.generate(seed, len(world))
            tag = f"{os.environ['HVD_JOB_ID']}/{k}"
            run = ProgramRun(hvd, program, world, slot, tag, oob, work_dir)
            record = run.run(budget)
            with open(record_path(work_dir, slot, k) + ".tmp", "wb") as fh:
                pickle.dump(record, fh)
            os.replace(record_path(work_dir, slot, k) + ".tmp", record_path(work_dir, slot, k))
            if run.victim_killed:
                del world[program.failure.victim]
    finally:
        oob.close()
    return len(seeds)


def record_path(work_dir: str, slot: int, program_index: int) -> str:
    return os.path.join(work_dir, f"record.{slot}.{program_index}.pkl")


class ProgramRun:
    """One program on this rank: its steps, checks, failure and record."""

    def __init__(self, hvd, program, world, slot, tag, oob, pid_dir):
        self.hvd, self.program, self.world, self.slot = hvd, program, list(world), slot
        self.me = world.index(slot)
        self.tag, self.oob, self.pid_dir = tag, oob, pid_dir
        self.failure = program.failure
        self.victim = self.failure is not None and self.failure.victim == self.me
        self.victim_killed = False
        self.sets: dict = {}
        self.pending: list = []   # (handle, step index, step) of ops submitted async
        self.step = "init"
        self.stop_attempt = None
        self.record = {"seed": program.seed, "np": program.size, "steps": len(program.steps),
                       "failure": self.failure.kind if self.failure else None,
                       "injected": False, "victim": self.victim, "error_step": None,
                       "slot": slot, "world": list(world), "pid": os.getpid(),
                       "error": None, "latency": None, "wrong": [], "unexpected": None}

    # -- the program ---------------------------------------------------------------------------

    def run(self, budget: float) -> dict:
        watchdog = threading.Timer(budget, self._hang)
        watchdog.daemon = True
        watchdog.start()
        start = time.monotonic()
        try:
            self._run_steps()
        finally:
            self.step = "shutdown"
            self.hvd.shutdown()
            self._settle_kill()
            watchdog.cancel()
        self.record["seconds"] = time.monotonic() - start
        return self.record

    def _run_steps(self) -> None:
        hvd = self.hvd
        hvd.init(rank=self.me, size=self.program.size)
        try:
            for i, step in enumerate(self.program.steps):
                self.step = i
                self._do(i, step)
        except hvd.HorovodInternalError as exc:
            self._failed(exc)
        except InjectedError:
            self.pending = []  # left to shutdown() in run(), as at a process's exit
        except Exception:  # a bug of the API or of this test: end the program on every rank
            self.record["unexpected"] = f"step {self.step}: {traceback.format_exc()}"
            hvd.abort(f"random program {self.program.seed}: rank {self.me} failed")
        finally:
            self._drain()
            if self.victim and not self.record["injected"] and self.failure.kind != "stop":
                self.oob.set(f"{self.tag}/t0", b"none")  # the survivors must not wait for it

    def _do(self, i: int, step) -> None:
        hvd = self.hvd
        if isinstance(step, rp.Collective):
            if self.me in step.members:
                self._collective(i, step)
        elif isinstance(step, rp.AddSet):
            self.sets[i] = hvd.add_process_set(list(step.ranks))
        elif isinstance(step, rp.RemoveSet):
            hvd.remove_process_set(self.sets.pop(step.set_index))
        elif isinstance(step, rp.Wait):
            self._wait_pending()
        elif isinstance(step, rp.Join):
            if self.me in step.members:
                self._join(i, step)
        elif isinstance(step, p2p.PointToPoint):
            order = random.Random(f"{self.program.seed}/{self.slot}/{i}")
            for problem in p2p.run(hvd, step, self.me, f"{self.program.seed}.{i}", order):
                self.record["wrong"].append(f"step {i} {p2p.text(step)}: {problem}")
        elif isinstance(step, rp.Inject):
            self._inject(i, step)

    def _process_set(self, step):
        return self.hvd.global_process_set if step.set_index is None else self.sets[step.set_index]

    def _collective(self, i: int, step, absent=()) -> None:
        hvd, ps = self.hvd, self._process_set(step)
        salt = f"{self.program.seed}.{i}.{step.name}"
        x = [expect.make(step, salt, self.me, t) for t in range(len(step.dtypes))]
        op = expect.reduce_op(hvd, step.op)
        kind, sync = step.kind, step.waited
        if kind == "barrier":
            hvd.barrier(process_set=ps)
            return
        if kind == "allreduce":
            call = hvd.allreduce if sync else hvd.allreduce_async
            result = call(x[0], op=op, name=step.name, prescale_factor=step.scales[0],
                          postscale_factor=step.scales[1], process_set=ps)
        elif kind == "grouped_allreduce":
            call = hvd.grouped_allreduce if sync else hvd.grouped_allreduce_async
            result = call(x, op=op, name=step.name, process_set=ps)
        elif kind == "allgather":
            call = hvd.allgather if sync else hvd.allgather_async
            result = call(x[0], name=step.name, process_set=ps)
        elif kind == "broadcast":
            call = hvd.broadcast if sync else hvd.broadcast_async
            result = call(x[0], step.root, name=step.name, process_set=ps)
        elif kind == "alltoall":
            call = hvd.alltoall if sync else hvd.alltoall_async
            splits = None if step.splits is None else step.splits[step.members.index(self.me)]
            result = call(x[0], splits=splits, name=step.name, process_set=ps)
        else:
            call = hvd.reducescatter if sync else hvd.reducescatter_async
            result = call(x[0], op=op, name=step.name, process_set=ps)
        if sync:
            self._check(i, step, salt, result, absent)
        else:
            self.pending.append((result, i, step, salt))

    def _check(self, i, step, salt, result, absent=()) -> None:
        problem = expect.mismatch(self.hvd, step, salt, self.me, result, absent)
        if problem:
            self.record["wrong"].append(f"step {i} {rp.step_text(step)}: {problem}")

    def _wait_pending(self) -> None:
        """Wait every async op in an order of this rank's own (not the submission order)."""
        order = random.Random(f"{self.program.seed}/{self.slot}/{self.step}")
        pending, self.pending = self.pending, []
        order.shuffle(pending)
        while pending:
            handle, i, step, salt = pending.pop()
            if isinstance(handle, list):  # grouped: one handle per tensor
                result = [self.hvd.synchronize(h) for h in handle]
            else:
                result = self.hvd.synchronize(handle)
            self._check(i, step, salt, result)

    def _drain(self) -> None:
        """After a failure: wait out the handles left (they fail at once), freeing names."""
        handles = [h for entry in self.pending
                   for h in (entry[0] if isinstance(entry[0], list) else [entry[0]])]
        self.pending = []
        for handle in handles:
            try:
                self.hvd.synchronize(handle)
            except Exception:  # noqa: BLE001 -- the program already failed
                pass

    def _join(self, i: int, step) -> None:
        position = step.members.index(self.me)
        for t in range(step.counts[position]):
            absent = tuple(r for r, c in zip(step.members, step.counts) if c <= t)
            self._collective(i, step.allreduces[t], absent)
        last = self.hvd.join(self._process_set(step))
        most = max(step.counts)
        allowed = [r for r, c in zip(step.members, step.counts) if c == most]
        if last not in allowed:
            self.record["wrong"].append(f"step {i} join: last rank {last}, expected one of "
                                        f"{allowed} (counts {list(step.counts)})")

    # -- failures ------------------------------------------------------------------------------

    def _inject(self, i: int, step) -> None:
        if step.kind == "stop":
            self._stop_op(i, step)
            return
        if not self.victim:
            return
        self.oob.set(f"{self.tag}/t0", repr(time.monotonic()).encode())
        self.record["injected"] = True
        if step.kind == "abort":
            self.hvd.abort(f"random program {self.program.seed}: injected abort")
            self.hvd.barrier()  # must raise: the abort failed this rank's core too
            raise AssertionError("an op succeeded after this rank aborted")
        elif step.kind == "raise":
            raise InjectedError(f"random program {self.program.seed}: injected error")
        elif step.kind == "kill":
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def _stop_op(self, i: int, step) -> None:
        """Every rank runs a large allreduce; the victim stops itself (SIGSTOP) while its
        executor runs it, and is resumed by the first survivor once every survivor failed.
        Retried under a new name when the stop missed the op."""
        hvd = self.hvd
        big = _big_input()
        for attempt in range(STOP_ATTEMPTS):
            name, key = f"s{i}.stop.{attempt}", f"{self.tag}/stop/{attempt}"
            self.stop_attempt = attempt
            if not self.victim:
                hvd.allreduce(big, op=hvd.Sum, name=name)  # raises when the stop landed
                if self.oob.get(key, timeout=60).startswith(b"stopped") and self._first_survivor():
                    self._resume_victim()  # it stopped after its last byte: the op completed
                continue
            handle = hvd.allreduce_async(big, op=hvd.Sum, name=name)
            if faults.wait_until_running(hvd, name, handle) and not hvd.poll(handle):
                self.record["injected"] = True
                self.oob.set(key, b"stopped " + repr(time.monotonic()).encode())
                os.kill(os.getpid(), signal.SIGSTOP)
            else:
                self.oob.set(key, b"missed")
            hvd.synchronize(handle)  # after a stop that landed, raises once resumed
            self.record["injected"] = False

    def _first_survivor(self) -> bool:
        return self.me == (1 if self.failure.victim == 0 else 0)

    def _resume_victim(self) -> None:
        faults.resume_by_pid_file(self.pid_dir, f"slot{self.world[self.failure.victim]}")

    def _failed(self, exc) -> None:
        """This rank's op raised HorovodInternalError: record when, against the injection."""
        now = time.monotonic()
        self.record["error_step"], self.record["error"] = self.step, str(exc)[:300]
        if self.failure is None:
            self.record["unexpected"] = f"step {self.step}: failed, nothing injected: {exc}"
            return
        kind = self.failure.kind
        if self.victim:
            if not self.record["injected"]:  # after its injection it must fail (abort, stop)
                self.record["unexpected"] = f"step {self.step}: the victim failed first: {exc}"
            return
        if kind == "stop":
            self._after_stop_failure(now)
            return
        t0 = self.oob.get(f"{self.tag}/t0", timeout=60)
        if t0 == b"none":
            self.record["unexpected"] = f"step {self.step}: failed, but nothing was injected"
        else:
            self.record["injected"] = True
            self.record["latency"] = now - float(t0)

    def _settle_kill(self) -> None:
        """Whether the next world has one rank less: the victim of a kill says before it dies
        (whatever this rank's own program went through)."""
        if self.failure is not None and self.failure.kind == "kill" and not self.victim:
            self.step = "waiting for the kill's victim to report"
            self.victim_killed = self.oob.get(f"{self.tag}/t0", timeout=60) != b"none"

    def _after_stop_failure(self, now: float) -> None:
        attempt = self.stop_attempt
        if attempt is None:
            self.record["unexpected"] = f"step {self.step}: failed before the stop op"
            return
        outcome = self.oob.get(f"{self.tag}/stop/{attempt}", timeout=60)
        if not outcome.startswith(b"stopped"):
            self.record["unexpected"] = f"stop attempt {attempt} failed, victim: {outcome!r}"
            return
        self.record["injected"] = True
        self.record["latency"] = now - float(outcome.split()[1])
        self.oob.set(f"{self.tag}/failed/{self.me}", b"1")
        if self._first_survivor():
            others = [r for r in range(self.program.size) if r != self.failure.victim]
            self.oob.wait_all([f"{self.tag}/failed/{r}" for r in others], timeout=60)
            self._resume_victim()

    def _hang(self) -> None:
        steps = self.program.steps
        where = (f"step {self.step}: {rp.step_text(steps[self.step])}"
                 if isinstance(self.step, int) else self.step)
        text = (f"HANG seed={self.program.seed} np={self.program.size} rank={self.me} "
                f"slot={self.slot} at {where}\n{rp.describe(self.program)}\n")
        for stream in (sys.stdout, sys.stderr):
            stream.write(text)
            stream.flush()
        os._exit(HANG_EXIT)


_big = []


def _big_input() -> np.ndarray:
    """The stop op's input, made once per process."""
    if not _big:
        _big.append(np.ones(rp.STOP_ELEMENTS, np.float32))
    return _big[0]
