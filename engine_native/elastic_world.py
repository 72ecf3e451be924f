"""Elastic generations, worker side: which world this process joins after a reset.

A worker started by ``hvdrun --min-np/--max-np`` (the elastic driver,
``hvd_magic.launch.elastic_driver``) has a stable worker id (``HVD_ELASTIC_WORKER``) but no
fixed rank: ranks and size belong to a *generation* that the driver publishes in the
rendezvous store whenever the job re-forms (a worker died, hosts were added or removed, or
every worker asked for a reset). Keys, all under ``<job>/elastic/``:

- ``gen<g>``: JSON ``{"gen": g, "size": n, "ranks": {worker: rank}, "hosts": {worker: host}}``;
  generations are numbered 1, 2, ... without gaps;
- ``latest``: the newest ``g`` (overwritten);
- ``gen<g>/reset/<worker>``: a worker of generation ``g`` asks for a new one (after a failed
  collective that no death explains, e.g. ``abort()``); when every worker of ``g`` asked,
  the driver publishes ``g + 1`` with the same workers.

Note [Joining a generation]
A. The worker waits for ``gen<want>`` (``want`` = one past the generation it was in, or the
   generation it was started for), then reads ``latest`` and joins that one: a worker that
   was slow to notice a change skips generations nobody else is in.
B. It publishes its address under ``<job>/gen<g>/<rank>`` and waits for its peers'. While it
   waits it checks ``latest``: a newer generation means a peer of ``g`` is gone (it died
   before publishing), so it abandons ``g`` and goes back to A. Nobody waits on a dead world.
C. A worker absent from the newest generation (its host was removed or blacklisted) stops
   with an error; the driver has already stopped it or is about to. A generation with an
   ``error`` (the notebook's driver: too few ranks left, hvd_magic.elastic) raises that error
   on every worker at once.
"""
from __future__ import annotations

import json
import os
import threading
import time

__all__ = [
    "Superseded",
    "generation",
    "join",
    "managed",
    "newer_generation_published",
    "request_reset",
]

_lock = threading.Lock()
_client = None
_generation = 0  # the generation this process joined last (0: none yet)


class Superseded(Exception):
    """The generation being joined was replaced by a newer one before everybody arrived."""


def managed() -> bool:
    """True when an elastic driver started this process (ranks come from generations)."""
    return bool(os.environ.get("HVD_ELASTIC_WORKER"))


def worker_id() -> str:
    return os.environ["HVD_ELASTIC_WORKER"]


def generation() -> int:
    return _generation


def _job() -> str:
    return os.environ.get("HVD_JOB_ID") or "job"


def _store():
    global _client
    with _lock:
        if _client is None:
            from .rendezvous import RendezvousClient
            address, secret = os.environ.get("HVD_RENDEZVOUS"), os.environ.get("HVD_SECRET")
            if not address or not secret:
                raise RuntimeError("elastic worker: HVD_RENDEZVOUS and HVD_SECRET are not set; "
                                   "start elastic jobs with hvdrun --min-np/--max-np")
            _client = RendezvousClient(address, bytes.fromhex(secret))
        return _client


def latest() -> int:
    return int(_store().get(f"{_job()}/elastic/latest", timeout=30.0))


def newer_generation_published() -> bool:
    """True when the driver published a generation newer than the one this process is in
    (hosts were added or removed): the job must re-form at the next commit."""
    return managed() and _generation > 0 and latest() > _generation


def request_reset() -> None:
    """Ask the driver for a new generation (every worker of the current one must ask)."""
    if managed() and _generation > 0:
        _store().set(f"{_job()}/elastic/gen{_generation}/reset/{worker_id()}", b"1")


def _deadline() -> float:
    value = os.environ.get("HVD_ELASTIC_TIMEOUT") or os.environ.get("HOROVOD_ELASTIC_TIMEOUT")
    return time.monotonic() + float(value or "600")


def join(connect) -> object:
    """Join the newest generation (Note [Joining a generation]); ``connect(rank, size, scope,
    abandon)`` bootstraps the core into it and returns the World."""
    global _generation
    store, job = _store(), _job()
    want = max(_generation + 1, int(os.environ.get("HVD_ELASTIC_GENERATION", "1")))
    deadline = _deadline()
    while True:
        try:
            store.wait_all([f"{job}/elastic/gen{want}"],
                           timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise TimeoutError(
                f"elastic worker {worker_id()}: the driver published no generation {want} within "
                "HVD_ELASTIC_TIMEOUT (hvdrun --elastic-timeout); it forms one when a worker dies, "
                "the hosts change or every worker asks for a reset") from None
        gen = max(want, latest())  # ``latest`` is written after ``gen<g>``: it may lag
        world = json.loads(store.get(f"{job}/elastic/gen{gen}", timeout=30.0))
        if world.get("error"):  # the world cannot re-form (too few workers left): say why
            _generation = gen
            raise RuntimeError(f"elastic worker {worker_id()}: {world['error']}")
        rank: int | None = world["ranks"].get(worker_id())
        if rank is None:
            raise RuntimeError(f"elastic worker {worker_id()} is not part of generation {gen} "
                               "(its host was removed or blacklisted): stopping")
        try:
            result = connect(rank, world["size"], f"{job}/gen{gen}", lambda g=gen: latest() > g)
        except Superseded:
            want = gen + 1
            continue
        _generation = gen
        return result
