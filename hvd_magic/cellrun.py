"""One ``%%hvd`` cell: submit to the ranks, stream output, watch, interrupt, recover, report.

:class:`CellRun` is a small state machine stepped on the notebook's main thread: ``running``
→ (``interrupting``) → ``draining`` → ``done``. The ipyparallel client's IO thread only feeds
output and wakes the stepper. Two drivers step it: :meth:`CellRun.run_async` awaits between
steps (the notebook stays responsive to widget events: ipykernel ≥ 7.4 handles comm messages
while an awaiting cell runs) and :meth:`CellRun.run_sync` blocks on an event.

Protocol for an interrupted cell (Ctrl-C, Stop, --timeout, a failed or dead peer):

A. SIGINT to every rank still running, through ipyparallel's nanny (``Client.send_signal``);
   the core's wait checks signals every 50 ms and raises KeyboardInterrupt, leaving the op
   pending in the core.
B. Still running after ``RESEND_AFTER`` s: SIGINT again. After ``GIVE_UP_AFTER`` s the rest
   count as unresponsive (stuck in code that ignores signals) and ``%hvd_restart`` is advised.
C. The core's state on every rank (pending collectives) is read for the report, then
   ``abort`` + ``shutdown`` + ``init`` run on all ranks at once: the next cell gets a clean core
   on the same engines (hvd_magic.recovery).

While the cell runs, ranks in a collective publish their pending ops (engine_side._Watch);
that is how a rank that died, or raised while its peers wait in a collective, gets the
others interrupted ("fail fast") instead of leaving the cell hanging.

The stall policy (when a cell that can never finish ends by itself, and the hint before it)
is in hvd_magic.stall: Note [A cell that can never finish], Note [Stall hint before the stall
end].
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from contextlib import contextmanager

from . import engine_side, interrupts, stall
from .errors import CellInterrupted, Failure, RankError, RanksDead, died
from .interrupts import op_label
from .output import RankOutput, render_text, split_runs
from .ranks import format_ranks, rank_label
from .stall import (STALL_GRACE, STALL_GRACE_ENV, STALL_WARN_AFTER,  # noqa: F401 (re-exported)
                    STALL_WARN_SHARE, default_stall_grace)

RESEND_AFTER = 2.0      # s after the first SIGINT (sooner hits ranks still formatting tracebacks)
GIVE_UP_AFTER = 3.5     # s after the first SIGINT
OUTPUT_GRACE = 1.0      # s to wait for a finished rank's last output
FAILFAST_AFTER = 1.0    # s a peer may wait in a collective after a rank failed
TICK = 0.1              # s between steps without news


class CellRun:
    """Run ``code`` on ``ranks`` of ``cluster``.

    Parameters
    ----------
    timeout : float, optional
        Interrupt the cell after this many seconds.
    stream : bool
        Show output while the cell runs (else all at the end).
    value_ranks : list of int, optional
        Ranks that send their last expression's value back (None: all).
    window : float
        Collapsing window, see Note [Collapsing] in hvd_magic.output.
    stall_grace : float, optional
        End the cell this many seconds after it can no longer finish (Note [A cell that can
        never finish]); 0 never ends it. None: ``$HVD_STALL_GRACE``, else ``STALL_GRACE``.
    """

    def __init__(self, cluster, code: str, ranks: list[int], timeout: float | None = None,
                 stream: bool = True, value_ranks=None, window: float = 0.5,
                 stall_grace: float | None = None):
        self.cluster, self.code, self.ranks = cluster, code, list(ranks)
        self.timeout, self.stream, self.value_ranks = timeout, stream, value_ranks
        self.stall_grace = default_stall_grace() if stall_grace is None else stall_grace
        if self.stall_grace < 0:
            raise ValueError(f"--stall-grace must be >= 0 seconds (0 turns it off), got "
                             f"{self.stall_grace:g}")
        self.output = RankOutput(self.ranks, window)
        self.state = "new"
        self.reason: str | None = None
        self._requests: list[str] = []  # Note [Interrupt requests]; the first one wins
        self._wake = lambda: None
        self._futures: dict[int, object] = {}
        self._done_at: dict[int, float] = {}
        self._stall_warned = False
        self._quiet_since: float | None = None  # (a)+(b) seen without a break since then

    # -- thread-safe entry points -----------------------------------------------------------

    # Note [Interrupt requests]: request_interrupt runs in the SIGINT handler, i.e. on the main
    # thread between any two bytecodes of step(), or on another thread (the dashboard's Stop).
    # It only appends to ``_requests``, and step() only appends its own reasons (timeout,
    # failfast, stalled) when there is none, so no request is ever overwritten. (step() used to
    # assign one field after checking it was empty: a Ctrl-C that landed while it decided
    # whether to fail fast was replaced by "no reason", and the cell ran on, until
    # --stall-grace ended it or forever with --stall-grace 0.)
    def request_interrupt(self, reason: str = "interrupt") -> None:
        self._requests.append(reason)  # one operation: Note [Interrupt requests]
        self._wake()

    def _on_iopub(self, rank: int, msg: dict) -> None:
        kind, content, now = msg["header"]["msg_type"], msg["content"], time.monotonic()
        if kind == "stream":
            self.output.feed_text(rank, content["name"], content["text"], now)
        elif kind == "display_data":
            self.output.feed_display(rank, content, now)
        else:
            return
        self._wake()

    # -- submit / step ----------------------------------------------------------------------

    def submit(self) -> None:
        self.token = uuid.uuid4().hex
        ar = self.cluster.view(self.ranks).apply_async(engine_side.run_cell, self.code,
                                                       self.value_ranks, self.token)
        self.t0 = time.monotonic()
        for rank, fut in zip(self.ranks, ar._children):
            self._futures[rank] = fut
            md = fut.output.metadata
            for name in ("stdout", "stderr"):  # output that arrived before the callback
                if md[name]:
                    self.output.feed_text(rank, name, md[name], self.t0)
            fut.iopub_callbacks.append(lambda msg, rank=rank: self._on_iopub(rank, msg))
            fut.add_done_callback(lambda _f: self._wake())
            fut.output.add_done_callback(lambda _f: self._wake())  # the rank's last output
        self.state = "running"

    def _running(self) -> list[int]:
        return [r for r, f in self._futures.items() if not f.done()]

    def step(self) -> bool:
        """Advance; returns True when the cell is over (call :meth:`finish` then)."""
        now = time.monotonic()
        for r, f in self._futures.items():
            if f.done() and r not in self._done_at:
                self._done_at[r] = now
        if self.state == "running":
            self._step_running(now)
        if self.state == "interrupting":
            self._step_interrupting(now)
        if self.state == "draining":
            for r, t in self._done_at.items():
                f = self._futures[r]
                if f.output.done() or now - t >= OUTPUT_GRACE:
                    self.output.finish(r, now)
            waiting = [r for r in self._done_at if not self._futures[r].output.done()
                       and now - self._done_at[r] < OUTPUT_GRACE]
            if not waiting:
                self._show(self.output.drain(now, final=True))
                self.state = "done"
                return True
        elif self.stream:
            for r, t in self._done_at.items():
                if self._futures[r].output.done():
                    self.output.finish(r, now)
            self._show(self.output.drain(now))
        return False

    def _step_running(self, now: float) -> None:
        if not self._requests:
            own = self._own_reason(now)
            if own is not None:
                self._requests.append(own)
        if self._requests:
            self.reason = self._requests[0]
            self._interrupt_at = now
            self._resent = False
            self.cluster.signal_ranks(self._running())
            self.state = "interrupting"
        elif not self._running():
            self.state = "draining"

    def _own_reason(self, now: float) -> str | None:
        """Why the cell interrupts itself now (--timeout, fail fast, stalled), if it does."""
        if self.timeout and now - self.t0 >= self.timeout:
            return "timeout"
        reason = self._failfast_reason(now)
        if reason is None:
            self._maybe_warn_stall(now)  # first: Note [Stall hint before the stall end]
            if self._never_finishes(now):
                reason = "stalled"
        return reason

    def _step_interrupting(self, now: float) -> None:
        running = self._running()
        if not running:
            self.state = "draining"
        elif not self._resent and now - self._interrupt_at >= RESEND_AFTER:
            self._resent = True
            self.cluster.signal_ranks(running)
        elif now - self._interrupt_at >= GIVE_UP_AFTER:
            self.state = "draining"

    def _live_state(self, rank: int) -> dict:
        """What the rank last published about its core during this cell ({} if nothing)."""
        data = (self._futures[rank].output.metadata.get("data") or {}).get("hvd_core") or {}
        return data if data.get("cell") == self.token else {}

    def _live_pending(self, rank: int) -> list[dict]:
        return list(self._live_state(rank).get("pending") or [])

    def _never_finishes(self, now: float) -> bool:
        """Note [A cell that can never finish]: (a)-(c) hold for ``stall_grace`` seconds."""
        grace = self.stall_grace
        running = self._running()
        if not grace or not self._done_at or not running or not stall.all_blocked(
                self._live_state(r) for r in running):
            self._quiet_since = None
            return False
        if self._quiet_since is None:
            self._quiet_since = now
        if now - self._quiet_since < grace:  # (b) held throughout, not just now
            return False
        if now - max(self._done_at.values()) < grace:  # (c)
            return False
        return all(float(self._live_state(r).get("blocked_seconds") or 0.0) >= grace
                   for r in running)  # (a), for the whole grace

    def _failfast_reason(self, now: float) -> str | None:
        """Interrupt the others when a rank died, or failed while peers wait in collectives."""
        failed = [r for r in self._done_at if self._failed(r)]
        if not failed or not self._running():
            return None
        if now - min(self._done_at[r] for r in failed) < FAILFAST_AFTER:
            return None
        if any(self._died(r) for r in failed):
            # an elastic world re-forms without the dead (Note [Rank lost in a cell])
            return None if self.cluster.elastic is not None else "failfast"
        waiting = [r for r in self._running() if self._live_pending(r)]
        return "failfast" if waiting else None

    def _maybe_warn_stall(self, now: float) -> None:
        if self._stall_warned or not self._done_at:
            return
        stuck = {r: p for r in self._running() if (p := self._live_pending(r))}
        ages = [float(op.get("age_seconds") or 0) for p in stuck.values() for op in p]
        after = stall.warn_after(self.stall_grace)
        if ages and max(ages) >= after:
            self._stall_warned = True
            ops = sorted({op_label(op.get("op", "?"), op.get("name", "?"))
                          for p in stuck.values() for op in p})
            sys.stderr.write(
                f"hvd: {rank_label(stuck, self.ranks)} waiting {after:g}+ s in "
                f"{', '.join(ops)}; rank(s) {format_ranks(self._done_at)} already finished "
                f"the cell. {stall.hint(self.stall_grace)}\n")

    # -- results ----------------------------------------------------------------------------

    def _record(self, rank: int):
        f = self._futures[rank]
        if not f.done():
            return None
        outcome = f.exception() or f.result()  # ipyparallel delivers remote errors as results
        if not isinstance(outcome, BaseException):
            return outcome
        tb = getattr(outcome, "traceback", None) or []  # RemoteError keeps it as one string
        return {"status": "error",
                "ename": getattr(outcome, "ename", None) or type(outcome).__name__,
                "evalue": getattr(outcome, "evalue", None) or str(outcome),
                "traceback": [tb] if isinstance(tb, str) else list(tb)}

    def _failed(self, rank: int) -> bool:
        rec = self._record(rank)
        return rec is not None and rec.get("status") != "ok"

    def _died(self, rank: int) -> bool:
        rec = self._record(rank)
        return rec is not None and rec.get("ename") == "EngineError"

    def failures(self) -> list[Failure]:
        out = []
        dead = self.cluster.dead_ranks()
        for r in self.ranks:
            rec = self._record(r)
            if rec is None:
                out.append(Failure(r, "no answer", "ignored the interrupt", kind="unresponsive"))
            elif r in dead or rec.get("ename") == "EngineError":
                out.append(died(self.cluster, r, dead.get(r, "exited (status unknown)")))
            elif rec.get("status") != "ok":
                out.append(Failure(r, rec["ename"], rec.get("evalue", ""),
                                   rec.get("traceback") or []))
        return out

    def values(self) -> dict[int, object]:
        return {r: rec["value"] for r in self.ranks
                if (rec := self._record(r)) is not None and rec.get("status") == "ok"}

    def finish(self):
        """Recover if needed and return ``{rank: value}``; raise RankError on failures."""
        from .elastic import absorb_deaths
        from .recovery import recover

        failures = self.failures()
        if self.reason is None and not failures:
            return self.values()
        note = absorb_deaths(self, failures)
        if note:
            print(note)
            return self.values()
        header, notes, stuck = recover(self, failures)
        if any(f.kind == "died" for f in failures):
            raise RanksDead(failures, self.ranks, header, notes)
        if self.reason is not None:
            raise CellInterrupted(failures, self.ranks, self.reason, header, notes, stuck)
        raise RankError(failures, self.ranks, header, notes)

    # -- drivers ----------------------------------------------------------------------------

    def _show(self, emissions) -> None:
        if not emissions:
            return
        for kind, run in split_runs(emissions):
            if kind == "text":
                for stream, text in render_text(run, self.ranks, rank_label).items():
                    (sys.stderr if stream == "stderr" else sys.stdout).write(text)
            else:
                from IPython.display import publish_display_data
                sys.stdout.write(f"[{rank_label(run.ranks, self.ranks)}]\n")
                sys.stdout.flush()
                publish_display_data(run.item.display.get("data", {}),
                                     run.item.display.get("metadata", {}))
        sys.stdout.flush()
        sys.stderr.flush()

    def run_sync(self):
        """Step until done, blocking between steps; returns :meth:`finish`'s values."""
        event = threading.Event()
        self._wake = event.set

        def wait():
            event.wait(TICK)
            event.clear()

        with self._running_as_current():
            while not self.step():
                try:
                    wait()
                except KeyboardInterrupt:  # SIGINT arrived before our handler was installed
                    self.request_interrupt("interrupt")
        return self.finish()

    async def run_async(self):
        """Step until done, awaiting between steps (the notebook keeps handling comm
        messages, e.g. the dashboard's Stop button); returns :meth:`finish`'s values."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        self._wake = lambda: loop.call_soon_threadsafe(event.set)
        with self._running_as_current():
            while not self.step():
                try:
                    await asyncio.wait_for(event.wait(), TICK)
                except asyncio.TimeoutError:
                    pass
                except asyncio.CancelledError:  # ipykernel's own Ctrl-C handling, if active
                    task = asyncio.current_task()
                    if task is not None and hasattr(task, "uncancel"):
                        task.uncancel()
                    self.request_interrupt("interrupt")
                event.clear()
        return self.finish()

    @contextmanager
    def _running_as_current(self):
        """Submit; while the cell runs, it is what interrupt_running_cell() and SIGINT stop."""
        interrupts.set_current(self)
        try:
            self.submit()
            with interrupts.sigint_to(lambda: self.request_interrupt("interrupt")):
                yield
        finally:
            interrupts.clear_current(self)
