"""The dashboard's data model: snapshots in, rows out. Plain Python, no Jupyter.

The driver's hub thread calls :meth:`DashboardModel.ingest` for every snapshot an engine sends
and the view/text renderers read :meth:`~DashboardModel.rows`, :meth:`~DashboardModel.cluster`,
:meth:`~DashboardModel.autotune` and :meth:`~DashboardModel.timeline`; the magics call
:meth:`~DashboardModel.mark_dead`, :meth:`~DashboardModel.expect` and
:meth:`~DashboardModel.forget` from the notebook thread. One lock guards everything.

Every method takes ``now``: the driver's ``time.monotonic()``. Rates use the engines' own clocks
(see :mod:`.rates`), ages use the driver's, and no two machines' clocks are ever compared.
The rows it hands out are the dataclasses of :mod:`.rows`, importable from here too.
"""

import signal as _signal
import threading
from collections import deque

from .rates import CounterHistory, Series, fusion_ratio, straggler, time_split
from .rows import (BYTES, SAMPLES, AutotunePanel,  # noqa: F401 (re-exported)
                   ClusterRow, Lane, PipelineStep, RankRow, WorldChange)
from .snapshot import MAX_BAR_S, MERGE_GAP_S

_PROGRESS_KEYS = ("samples", "ops_total", "bytes_total")


class _Rank:
    """Everything kept about one rank (internal)."""

    def __init__(self, rate_window_s, spark_span_s):
        self.snap = None
        self.received_at = None
        self.last_progress_at = None
        self.dead = None  # (exit_code, signal, reason)
        self.history = CounterHistory(rate_window_s)
        self.series = Series(spark_span_s)
        self.series_unit = None
        # [op, first name, start, duration, count, busy seconds] in driver time; neighbours of
        # one op less than the model's merge_gap_s apart are one entry (see ingest)
        self.events = deque(maxlen=4000)


class DashboardModel:
    """Merge per-rank snapshots into dashboard rows.

    Parameters
    ----------
    size : int, optional
        Number of ranks expected; they show as "starting" until their first snapshot.
    stall_after_s : float
        A rank in a collective with no progress (ops, bytes, samples) for this long is stalled.
    stale_after_s : float
        A rank that sent nothing for this long is flagged "no data for N s".
    collective_after_s : float
        A collective shows in the state column only once it has lasted this long, so a
        training loop does not flicker between "running" and "in allreduce".
    rate_window_s, spark_span_s, timeline_span_s : float
        Rate averaging window, sparkline history, timeline history kept.
    merge_gap_s, max_bar_s : float
        Timeline events of one op less than ``merge_gap_s`` apart are kept as one bar (with their
        count and busy time) up to ``max_bar_s`` long; ``max_bar_s=0`` keeps every event.
    """

    def __init__(self, size=None, stall_after_s=10.0, stale_after_s=3.0, collective_after_s=0.5,
                 rate_window_s=2.0, spark_span_s=60.0, timeline_span_s=10.0,
                 merge_gap_s=MERGE_GAP_S, max_bar_s=MAX_BAR_S):
        self.stall_after_s = stall_after_s
        self.stale_after_s = stale_after_s
        self.collective_after_s = collective_after_s
        self.rate_window_s = rate_window_s
        self.spark_span_s = spark_span_s
        self.timeline_span_s = timeline_span_s
        self.merge_gap_s = merge_gap_s
        self.max_bar_s = max_bar_s
        self._lock = threading.Lock()
        self._ranks = {}
        self._world = ()
        self._cluster_series = Series(spark_span_s)
        self._cluster_unit = None
        self._scores = {}
        self._last_sample = None
        self._autotune_rank = None
        if size:
            self.expect(range(size))

    def _get(self, rank):
        if rank not in self._ranks:
            self._ranks[rank] = _Rank(self.rate_window_s, self.spark_span_s)
        return self._ranks[rank]

    # ---------------------------------------------------------------- writers
    def expect(self, ranks):
        """Declare ranks that should appear (shown as "starting" until they report)."""
        with self._lock:
            for r in ranks:
                self._get(int(r))

    def forget(self, ranks=None):
        """Drop all state for ``ranks`` (all when None), e.g. after ``%hvd_restart``."""
        with self._lock:
            for r in list(self._ranks) if ranks is None else ranks:
                self._ranks.pop(r, None)
            if ranks is None:
                self._cluster_series.clear()
                self._scores.clear()
                self._last_sample = self._autotune_rank = None

    def record_world(self, change, keep=3):
        """Remember that the world re-formed (a :class:`WorldChange`); the last ``keep``
        changes are shown with the cluster row."""
        with self._lock:
            self._world = (self._world + (change,))[-keep:]

    def mark_dead(self, rank, exit_code=None, signal=None, reason=None):
        """Mark a rank dead (the driver saw its engine exit, ``reason`` says how when known,
        e.g. "killed by SIGKILL"); it stays dead until a snapshot from a different pid (a
        restarted engine) arrives or it is forgotten."""
        with self._lock:
            self._get(rank).dead = (exit_code, signal, reason)

    def ingest(self, rank, snapshot, now):
        """Merge one snapshot (schema in :mod:`.snapshot`) received at driver time ``now``."""
        with self._lock:
            st = self._get(rank)
            prev = st.snap
            if prev is not None and snapshot.get("pid") == prev.get("pid"):
                if st.dead is not None or snapshot.get("t", 0) < prev.get("t", 0):
                    return  # late message from a dead engine, or out of order
            elif prev is not None:
                st.dead = None  # a new engine process took this rank
                st.history = CounterHistory(self.rate_window_s)
                st.series.clear()
            counters = _counters(snapshot)
            old = st.history.latest
            reset = any(counters[k] < old(k, 0) for k in _PROGRESS_KEYS)
            progressed = prev is None or reset or any(counters[k] > old(k, 0) for k in _PROGRESS_KEYS)
            st.history.add(snapshot["t"], counters)
            st.snap, st.received_at = snapshot, now
            if progressed:
                st.last_progress_at = now
            self._add_events(st.events, snapshot.get("events", ()), now)
            unit, rate = self._primary(st)
            if unit != st.series_unit:
                st.series.clear()
                st.series_unit = unit
            st.series.offer(now, rate)
            self._merge_autotune(rank, snapshot)
            self._sample_cluster(now)

    def _add_events(self, events, new, now):
        """Append a snapshot's events, merging each into the previous entry when it is the same
        op and starts within ``merge_gap_s`` of its end (a training loop's back-to-back
        collectives; far below a pixel of the strip, which merges them again when drawing) as
        long as the entry stays shorter than ``max_bar_s``. The strip then reads tens of
        entries per second instead of every collective, five times a second."""
        gap, longest = self.merge_gap_s, self.max_bar_s
        last = events[-1] if events else None
        for ev in new:
            op, name, start_ago, dur = ev[:4]
            count, busy = (ev[4], ev[5]) if len(ev) > 4 else (1, dur)
            start = now - start_ago
            if (last is not None and last[0] == op and last[2] <= start <= last[2] + last[3] + gap
                    and start + dur - last[2] <= longest):
                last[3] = max(last[3], start + dur - last[2])
                last[4] += count
                last[5] += busy
            else:
                last = [op, name, start, dur, count, busy]
                events.append(last)
        horizon = now - self.timeline_span_s
        while events and events[0][2] + events[0][3] < horizon:
            events.popleft()

    def _merge_autotune(self, rank, snapshot):
        """Score history from one rank only (the lowest live one reporting an autotuner), so
        ranks that lag each other by a sample never look like a restarted tuning run."""
        at = (snapshot.get("core") or {}).get("autotune")
        owner = self._autotune_rank
        if not at or (owner is not None and owner < rank and owner in self._ranks
                      and self._ranks[owner].dead is None):
            return
        self._autotune_rank = rank
        sample = at.get("sample")
        if sample is not None and self._last_sample is not None and sample < self._last_sample:
            self._scores.clear()  # a new tuning run started
        self._last_sample = sample if sample is not None else self._last_sample
        for s, score in at.get("scores", ()):
            self._scores[s] = score
        while len(self._scores) > 500:
            del self._scores[min(self._scores)]

    def _sample_cluster(self, now):
        unit, total, _ = self._throughputs()
        if unit != self._cluster_unit:
            self._cluster_series.clear()
            self._cluster_unit = unit
        self._cluster_series.offer(now, total)

    # ---------------------------------------------------------------- readers
    def ranks(self):
        """Known ranks, ascending."""
        with self._lock:
            return sorted(self._ranks)

    def rows(self, now):
        """One :class:`RankRow` per known rank, ascending by rank."""
        with self._lock:
            return [self._row(r, self._ranks[r], now) for r in sorted(self._ranks)]

    def _row(self, rank, st, now):
        snap = st.snap or {}
        dev = snap.get("device") or {}
        core = snap.get("core") or {}
        unit, rate = self._primary(st)
        device = dev.get("kind", "")
        if device == "cuda":
            device = f"cuda:{dev.get('index', 0)}"
        stale = None
        if st.received_at is not None and now - st.received_at >= self.stale_after_s:
            stale = now - st.received_at
        state, detail = self._state(st, now)
        return RankRow(
            rank=rank, host=snap.get("host", ""), pid=snap.get("pid"), device=device,
            gpu_name=dev.get("name", ""), gpu_mem_used=dev.get("mem_used"),
            gpu_mem_total=dev.get("mem_total"), gpu_index=dev.get("gpu"),
            gpu_util=dev.get("util"), gpu_dev_mem_used=dev.get("dev_mem_used"),
            gpu_path=dev.get("path", ""), state=state, detail=detail, stale_s=stale,
            unit=unit, rate=rate, ops_rate=st.history.rate("ar_ops"),
            samples=snap.get("samples", 0),
            spark=tuple(st.series.values()), extra=dict(snap.get("extra") or {}),
            last_error=core.get("last_error", ""), pipeline=_pipeline(snap.get("pipeline")))

    def _state(self, st, now):
        if st.dead is not None:
            return "dead", _dead_text(*st.dead)
        if st.snap is None:
            return "starting", "waiting for the first snapshot"
        coll = (st.snap.get("core") or {}).get("collective")
        if coll:
            age = coll["age_s"] + (now - st.received_at)
            quiet = now - st.last_progress_at
            what = f"{coll['op']} '{coll['name']}'" if coll.get("name") else coll["op"]
            missing = coll.get("missing") or []
            waiting = f", waiting for rank{'s' if len(missing) > 1 else ''} " \
                      f"{', '.join(map(str, missing))}" if missing else ""
            if age >= self.stall_after_s and quiet >= self.stall_after_s:
                return "stalled", f"stalled in {what} for {int(age)} s{waiting}"
            if age >= self.collective_after_s:
                return "collective", f"in {what} for {_age(age)}{waiting}"
        if st.snap.get("busy"):
            cell = st.snap.get("cell")
            return "running", f"running cell {cell}" if cell else "running cell"
        return "idle", "idle"

    def _primary(self, st):
        """(unit, rate): samples/s once the rank reported samples, else the bytes/s it sends:
        allreduce plus point-to-point (a pipeline stage's activations and gradients)."""
        if st.history.latest("samples") > 0:
            return SAMPLES, st.history.rate("samples")
        return BYTES, st.history.rate("sent_bytes")

    def _throughputs(self):
        live = [(r, st) for r, st in self._ranks.items() if st.dead is None and st.snap]
        unit = SAMPLES if any(self._primary(st)[0] == SAMPLES for _, st in live) else BYTES
        rates = [(r, self._primary(st)[1]) for r, st in live if self._primary(st)[0] == unit]
        rates = [(r, v) for r, v in rates if v is not None]
        total = sum(v for _, v in rates) if rates else None
        return unit, total, rates

    def cluster(self, now):
        """The :class:`ClusterRow`: totals, straggler spread, fusion ratio and time split."""
        with self._lock:
            counts = {}
            for st in self._ranks.values():
                state = self._state(st, now)[0]
                counts[state] = counts.get(state, 0) + 1
            unit, total, rates = self._throughputs()
            slowest = fastest = spread = None
            if rates:
                slowest, fastest = min(rates, key=lambda x: x[1]), max(rates, key=lambda x: x[1])
                spread = (fastest[1] - slowest[1]) / fastest[1] if fastest[1] > 0 else None
            hists = [(r, st.history) for r, st in self._ranks.items()
                     if st.dead is None and st.snap]
            split = time_split(h for _, h in hists)
            if split and not any(counts.get(s) for s in ("running", "collective", "stalled")):
                split.pop("compute", None)  # time outside wait() is not compute between cells
            return ClusterRow(
                ranks=len(self._ranks), counts=counts, unit=unit, total_rate=total,
                spark=tuple(self._cluster_series.values()), slowest=slowest, fastest=fastest,
                spread=spread, fusion=fusion_ratio(h for _, h in hists), split=split,
                straggler=straggler(hists), world=self._world)

    def autotune(self):
        """The :class:`AutotunePanel`, or None when no rank reports an autotuner."""
        with self._lock:
            for r in sorted(self._ranks):
                st = self._ranks[r]
                at = ((st.snap or {}).get("core") or {}).get("autotune")
                if at and st.dead is None:
                    return AutotunePanel(
                        enabled=at.get("enabled", True), phase=at.get("phase", ""),
                        sample=at.get("sample"), samples=at.get("samples"),
                        current=dict(at.get("current") or {}), best=dict(at.get("best") or {}),
                        best_score=at.get("best_score"), scores=tuple(sorted(self._scores.items())))
            return None

    def timeline(self, now, span_s=5.0):
        """One :class:`Lane` per rank with data: the collectives of the last ``span_s``."""
        with self._lock:
            lanes = []
            for r in sorted(self._ranks):
                st = self._ranks[r]
                if st.snap is None:
                    continue
                lo = now - span_s
                bars = [(op, name, start - now, dur, False) if count == 1 else
                        (op, name, start - now, dur, False, count, busy)
                        for op, name, start, dur, count, busy in st.events
                        if start + dur >= lo and start <= now]
                coll = (st.snap.get("core") or {}).get("collective")
                if coll and st.dead is None:
                    age = coll["age_s"] + (now - st.received_at)
                    bars.append((coll["op"], coll["name"], -age, age, True))
                lanes.append(Lane(rank=r, bars=tuple(bars)))
            return lanes

    def timeline_active(self):
        """Whether any live rank reports a timeline being recorded (None when unknown)."""
        with self._lock:
            flags = [((st.snap or {}).get("core") or {}).get("timeline")
                     for st in self._ranks.values() if st.dead is None]
            flags = [f for f in flags if f is not None]
            return any(flags) if flags else None


def _counters(snap):
    core = snap.get("core") or {}
    ops, byts = core.get("ops") or {}, core.get("bytes") or {}
    return {
        "samples": snap.get("samples", 0),
        "ar_ops": ops.get("allreduce", 0),
        "sent_bytes": byts.get("allreduce", 0) + byts.get("send", 0),
        "ops_total": sum(ops.values()), "bytes_total": sum(byts.values()),
        "fused_batches": core.get("fused_batches", 0), "fused_tensors": core.get("fused_tensors", 0),
        "negotiate_s": core.get("negotiate_s", 0.0), "communicate_s": core.get("communicate_s", 0.0),
        "wait_s": core.get("wait_s"), "idle_s": core.get("idle_s"),
    }


def _pipeline(step):
    if not step:
        return None
    return PipelineStep(schedule=step["schedule"], step_s=step["step_s"], bubble=step["bubble"],
                        ideal=step["ideal"], actions=tuple(map(tuple, step["actions"])),
                        more=step["more"])


def _age(seconds):
    return f"{seconds:.1f} s" if seconds < 10 else f"{int(seconds)} s"


def _dead_text(exit_code, sig, reason=None):
    if reason:
        return f"dead ({reason})"
    if sig is not None:
        try:
            return f"dead (signal {sig}, {_signal.Signals(sig).name})"
        except ValueError:
            return f"dead (signal {sig})"
    return f"dead (exit code {exit_code})" if exit_code is not None else "dead"
