"""Elastic ranks in the notebook, driver side: the generations of a cluster's world.

The notebook plays the part ``hvdrun --min-np/--max-np`` plays for scripts
(hvd_magic.launch.elastic_driver): the engines are elastic workers (``HVD_ELASTIC_WORKER`` =
``engine<id>``) and their ranks belong to *generations* that :class:`ElasticWorld` publishes
in its own rendezvous store, with the keys and the joining protocol of
engine_native.elastic_world (Note [Joining a generation]). So ``hvd.init()`` on an engine, and
``@hvd.elastic.run``'s reset, join the newest generation: one protocol for scripts and cells.

Created by ``%hvd_scale`` (hvd_magic.scale) the first time a cluster is resized; from then on
the cluster is elastic. Who publishes a generation:

- ``%hvd_scale`` (main thread), when engines are added or removed;
- the recovery after an interrupted cell (ranksetup.reset_cores), the same workers again;
- the watch thread here, Note [Rank lost in a cell].

Note [Rank lost in a cell]
A. A rank dies during a cell (SIGKILL, OOM...). Its peers' collectives fail
   (HorovodInternalError); ``@hvd.elastic.run`` restores the last commit, asks for a reset
   (``gen<g>/reset/<worker>``) and waits for generation g + 1.
B. The store's ``on_set`` hook wakes the watch thread. Once every worker of g that still lives
   asked (an engine process gone, or a zombie, does not live), it publishes g + 1: the asking
   workers in their old rank order, so the lowest survivor is rank 0 and everybody gets its
   state. It re-checks every ``RECHECK_S`` while asks are pending (a peer may still be about
   to ask), and sleeps otherwise.
C. Fewer survivors than ``min_np``: g + 1 is published with no ranks and an ``error``, so every
   survivor's ``hvd.init()`` raises it at once (nobody waits on a world that cannot form) and
   the cell fails with the reason and the fix.
D. The driver's rank table (``cluster.ranks``) is renumbered from the newest generation only
   when the cell is over (:func:`settle`), on the main thread: the cell's output and reports
   name the ranks the cell started with.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field

import psutil

from .ranks import format_ranks

RECHECK_S = 0.2  # s between liveness checks while some workers asked for a reset


def worker_id(engine_id: int) -> str:
    return f"engine{engine_id}"


@dataclass
class Departure:
    """A rank that left the world: shown on the dashboard and in %hvd_status."""
    rank: int
    engine_id: int
    pid: int
    host: str
    why: str
    generation: int  # the first generation without it


@dataclass
class Generation:
    number: int
    engines: list[int]  # engine ids in rank order
    why: str
    at: float = field(default_factory=time.time)


class ElasticWorld:
    """Generations of one cluster (Note [Rank lost in a cell]); ``min_np`` below which the
    world may not shrink."""

    def __init__(self, cluster, min_np: int = 1):
        from engine_native.rendezvous import RendezvousClient, RendezvousServer

        self.cluster, self.min_np = cluster, min_np
        secret = secrets.token_bytes(32)
        self.job = f"hvd-elastic-{uuid.uuid4().hex[:12]}"
        self.server = RendezvousServer(secret, host="127.0.0.1", on_set=self._on_set)
        bound, port = self.server.start()
        self.address, self.secret_hex = f"{bound}:{port}", secret.hex()
        self._store = RendezvousClient(self.address, secret)
        self.generations: list[Generation] = []
        self.departed: list[Departure] = []
        self._pids: dict[int, int] = {}
        self._asks: set[int] = set()
        self._cond = threading.Condition()
        self._closed = False
        self._reset_key = re.compile(re.escape(self.job) + r"/elastic/gen(\d+)/reset/engine(\d+)")
        threading.Thread(target=self._watch, name="hvd-elastic-watch", daemon=True).start()

    # -- what engines need -----------------------------------------------------------------

    def engine_env(self, engine_id: int) -> dict:
        """Environment that makes an engine's ``hvd.init()`` join the newest generation."""
        return {"HVD_ELASTIC_WORKER": worker_id(engine_id), "HVD_RENDEZVOUS": self.address,
                "HVD_SECRET": self.secret_hex, "HVD_JOB_ID": self.job, "HVD_ELASTIC": "1",
                "HOROVOD_ELASTIC": "1", "HVD_ELASTIC_GENERATION": str(self.generation)}

    @property
    def generation(self) -> int:
        return self.generations[-1].number if self.generations else 0

    @property
    def engines(self) -> list[int]:
        return list(self.generations[-1].engines) if self.generations else []

    # -- publishing ------------------------------------------------------------------------

    def publish(self, engines: list[int], pids: dict[int, int], why: str) -> Generation:
        """Publish the next generation: ``engines`` in rank order (any thread)."""
        with self._cond:
            self._pids.update(pids)
            gen = Generation(self.generation + 1, list(engines), why)
            self._write(gen, _world(gen))
            return gen

    def _write(self, gen: Generation, world: dict) -> None:
        self._store.set(f"{self.job}/elastic/gen{gen.number}", json.dumps(world).encode())
        self._store.set(f"{self.job}/elastic/latest", str(gen.number).encode())
        self.generations.append(gen)
        self._asks = set()

    def _fail(self, survivors: list[int], why: str) -> None:
        """Rule C: a generation nobody is part of, carrying the reason."""
        error = (f"the cluster cannot re-form after {why}: {len(survivors)} rank(s) left, fewer "
                 f"than --min-np {self.min_np}. Fix: %hvd_scale -n {self.min_np} to add "
                 f"ranks (or %hvd_restart), or %hvd_scale --min-np {max(1, len(survivors))}")
        gen = Generation(self.generation + 1, [], why)
        self._write(gen, {"gen": gen.number, "size": 0, "ranks": {}, "hosts": {},
                          "error": error})

    # -- the watch (Note [Rank lost in a cell] B) ------------------------------------------

    def _on_set(self, key: str) -> None:  # the store's server thread
        m = self._reset_key.fullmatch(key)
        if m is None:
            return
        with self._cond:
            if int(m.group(1)) == self.generation:
                self._asks.add(int(m.group(2)))
                self._cond.notify()

    def alive(self, engine_id: int) -> bool:
        pid = self._pids.get(engine_id)
        if pid is None:
            return True
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                self._cond.wait(RECHECK_S if self._asks else None)
                if self._closed or not self._asks:
                    continue
                members = self.engines
                living = [e for e in members if self.alive(e)]
                if not set(living) <= self._asks:
                    continue
                lost = [members.index(e) for e in members if e not in living]
                why = (f"rank(s) {format_ranks(lost)} died" if lost
                       else "every rank asked for a reset")
                if len(living) < self.min_np:
                    self._fail(living, why)
                else:
                    gen = Generation(self.generation + 1, living, why)
                    self._write(gen, _world(gen))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._store.close()
        self.server.stop()


def _world(gen: Generation) -> dict:
    """The store's record of a generation (engine_native.elastic_world's keys)."""
    return {"gen": gen.number, "size": len(gen.engines),
            "ranks": {worker_id(e): r for r, e in enumerate(gen.engines)},
            "hosts": {worker_id(e): "" for e in gen.engines}}


def settle(cluster) -> list[Departure]:
    """Rule D: renumber ``cluster.ranks`` from the newest generation (main thread, between
    cells); returns the ranks that left. A failed generation (rule C) changes nothing: the
    dead ranks stay dead until %hvd_scale or %hvd_restart."""
    from dataclasses import replace

    from . import engine_side

    ew = cluster.elastic
    if ew is None or not ew.engines:
        return []
    engines, current = ew.engines, [r.engine_id for r in cluster.ranks]
    if engines == current:
        return []
    dead = cluster.dead_ranks()
    gone = [Departure(r.rank, r.engine_id, r.pid, r.host,
                      dead.get(r.rank, "removed by %hvd_scale"), ew.generation)
            for r in cluster.ranks if r.engine_id not in engines]
    ew.departed.extend(gone)
    by_engine = {r.engine_id: r for r in cluster.ranks}
    ranks, seen = [], {}
    for rank, engine in enumerate(e for e in engines if e in by_engine):
        info = by_engine[engine]
        ranks.append(replace(info, rank=rank, local_rank=seen.get(info.host, 0)))
        seen[info.host] = seen.get(info.host, 0) + 1
    cluster.set_ranks(ranks)
    for info in ranks:  # the engines' own idea of their rank (cell values, publishers)
        cluster.client[info.engine_id].apply_async(engine_side.set_rank, info.rank).get(10)
    return gone


def absorb_deaths(run, failures) -> str | None:
    """After a cell in which ranks died: when the survivors re-formed without them and
    finished the cell, renumber the ranks (rule D) and return what to tell the user; None
    when the usual error report applies (a survivor failed too, or no world formed)."""
    from . import status

    c, ew = run.cluster, run.cluster.elastic
    if ew is None or run.reason is not None or not failures:
        return None
    if any(f.kind != "died" for f in failures):
        return None
    dead = {c.ranks[f.rank].engine_id for f in failures}
    if not ew.engines or dead & set(ew.engines):
        return None
    what = "; ".join(f"rank {f.rank} died ({f.evalue})" for f in failures)
    gone = settle(c)
    status.emit("scaled", c, departed=gone)
    size = len(ew.engines)
    return (f"hvd: {what} during the cell; the other {size} rank(s) re-formed as generation "
            f"{ew.generation} (now ranks 0-{size - 1}) and finished it. %hvd_scale -n "
            f"{size + len(dead)} adds replacements.")
