"""``%hvd_scale -n N``: grow or shrink a running cluster without losing the ranks' state.

Called by the magic on the notebook's main thread, between cells. The first resize makes the
cluster elastic (hvd_magic.elastic): from then on its ranks belong to generations. Protocol:

A. Check: a launcher that can add single engines (``local``), a core on the engines,
   ``min_np <= N``. Ranks whose engine died are dropped (they are in no generation).
B. Grow: start ``N - size`` engines as a new engine set of the same ipyparallel cluster, wait
   for them to register and ``describe()`` them. Shrink: the highest ranks go.
C. Publish generation g + 1: the kept ranks in their order, then the new engines.
D. All at once (joining is collective): kept engines ``rejoin`` (core shut down and initialised
   into g + 1; their namespaces stay), new engines ``init_engine`` (GPU pinned for their local
   rank, core joined into g + 1, ``hvd`` and ``torch`` in the namespace), removed engines shut
   their core down.
E. Removed engines are stopped; ``cluster.ranks`` is the new world.
"""

from __future__ import annotations

import time

from . import engine_side
from .elastic import Departure, ElasticWorld
from .errors import HvdError
from .rankinfo import RankInfo
from .ranks import format_ranks

SCALABLE_LAUNCHERS = ("local",)
STOP_WAIT = 10.0  # s for removed engines to leave the controller


def check(cluster, n: int, min_np: int | None) -> None:
    """Step A's user errors (HvdError with the fix)."""
    if n < 1:
        raise HvdError(f"-n {n}: a cluster needs at least one rank")
    if cluster.launcher not in SCALABLE_LAUNCHERS:
        raise HvdError(
            f"the {cluster.launcher} launcher cannot add or remove single engines (mpiexec "
            f"starts one fixed world and ends all of it when one rank dies). Fix: %hvd_stop, "
            f"then %hvd_start -n {cluster.size} --launcher local to get a cluster that scales")
    if not any(r.core for r in cluster.ranks):
        raise HvdError("the core is not running on the ranks, so they cannot re-form; "
                       "build it (pip install -e .) and %hvd_restart")
    floor = min_np if min_np is not None else \
        (cluster.elastic.min_np if cluster.elastic is not None else 1)
    if n < floor:
        raise HvdError(f"-n {n} is below --min-np {floor}; lower --min-np to shrink further")


def scale(cluster, n: int, min_np: int | None = None, progress=None) -> list[str]:
    """Steps A-E; returns notes to print. Raises HvdError (cluster unchanged where possible)."""
    check(cluster, n, min_np)
    t0 = time.perf_counter()
    if cluster.elastic is None:
        cluster.set_elastic(ElasticWorld(cluster, min_np or 1))
    elif min_np is not None:
        cluster.elastic.min_np = min_np
    ew = cluster.elastic
    dead = cluster.dead_ranks()
    keep = [r for r in cluster.ranks if r.rank not in dead]
    old_size = cluster.size
    ew.departed.extend(Departure(r.rank, r.engine_id, r.pid, r.host, why, ew.generation + 1)
                       for r, why in ((cluster.ranks[k], w) for k, w in sorted(dead.items())))
    if n == len(keep) and not dead and ew.generation > 0:
        return [f"the cluster already has {n} rank(s) (--min-np {ew.min_np})"]
    new = _start_engines(cluster, n - len(keep), progress) if n > len(keep) else []
    removed = keep[n:]
    ranks = _renumber(keep[:n] + new)
    assign_pin_slots(ranks)
    why = (f"%hvd_scale -n {n}" + (f" (rank(s) {format_ranks(dead)} had died)" if dead else ""))
    ew.publish([r.engine_id for r in ranks], {r.engine_id: r.pid for r in ranks}, why)
    failed = _join(cluster, ranks, new, removed)
    cluster.set_ranks(ranks)
    if removed:
        _stop(cluster, removed)
        ew.departed.extend(Departure(r.rank, r.engine_id, r.pid, r.host, "removed by %hvd_scale",
                                     ew.generation) for r in removed)
    cluster.update_reaper()
    if failed:
        first = failed[min(failed)]
        raise HvdError(f"ranks {format_ranks(failed)} could not join the new world of {n} "
                       f"ranks: {first}. Fix: %hvd_restart")
    took = f"{time.perf_counter() - t0:.1f} s"
    if old_size == n and not dead:
        return [f"the {n} ranks are elastic (generation {ew.generation}, --min-np "
                f"{ew.min_np}) after {took}"]
    return [f"scaled from {old_size} to {n} ranks (generation {ew.generation}) in {took}; "
            f"the ranks' variables are kept" +
            ("; new ranks start with an empty namespace" if new else "")]


def _start_engines(cluster, count: int, progress) -> list[RankInfo]:
    """Step B (grow): ``count`` engines of a new engine set, described."""
    c = cluster
    before = set(c.client.ids)
    set_id = c._loop.run(c.ipp.start_engines(count, environment=c.setup.launch_env), c.timeout)
    c.update_reaper()
    ids = c._wait_for_engines(progress, before, count=count, engine_set=c.ipp.engines[set_id])
    try:
        infos = c.client[ids].apply_async(engine_side.describe).get(c.timeout)
    except Exception as exc:
        raise HvdError(f"new engines registered but did not answer: {exc}") from None
    return [RankInfo(rank=-1, engine_id=e, host=i["host"], pid=i["pid"])
            for e, i in zip(ids, infos)]


def _renumber(ranks: list[RankInfo]) -> list[RankInfo]:
    """Ranks in order; local ranks count ranks per host in that order (what the core does)."""
    from dataclasses import replace

    out, seen = [], {}
    for rank, info in enumerate(ranks):
        out.append(replace(info, rank=rank, local_rank=seen.get(info.host, 0)))
        seen[info.host] = seen.get(info.host, 0) + 1
    return out


def assign_pin_slots(ranks: list[RankInfo]) -> None:
    """A new rank's GPU: the lowest pin slot (local rank at pinning time) that no other rank
    on its host holds. Kept ranks keep their GPU (pinned when their process started) while
    their local rank may change after a death, so a replacement takes the dead rank's GPU
    instead of doubling up on one that a survivor holds."""
    taken: dict[str, set] = {}
    for r in ranks:
        if r.pin_slot is not None:
            taken.setdefault(r.host, set()).add(r.pin_slot)
    for r in ranks:
        if r.pin_slot is None:
            used = taken.setdefault(r.host, set())
            r.pin_slot = next(s for s in range(len(used) + 1) if s not in used)
            used.add(r.pin_slot)


def _join(cluster, ranks, new, removed) -> dict[int, str]:
    """Step D; returns {rank: error} of ranks that did not join."""
    c, ew = cluster, cluster.elastic
    fresh = {r.engine_id for r in new}
    local_sizes: dict[str, int] = {}
    for r in ranks:
        local_sizes[r.host] = local_sizes.get(r.host, 0) + 1
    pending = {}
    for r in ranks:
        env = ew.engine_env(r.engine_id)
        if r.engine_id in fresh:
            # The cluster's MPS daemon, if it has one: a new rank must be a client of the same
            # server as the ranks whose buffers it maps (Note [MPS by default]).
            env = dict(env, **c.mps.rank_env(r))
            call = (engine_side.init_engine, r.rank, env, c.gpus, r.pin_slot,
                    c.setup.with_core, max(local_sizes[r.host], r.pin_slot + 1), c.framework)
        else:
            call = (engine_side.rejoin, env)
        pending[r.rank] = c.client[r.engine_id].apply_async(*call)
    leaving = [c.client[r.engine_id].apply_async(engine_side.shutdown_core) for r in removed]
    deadline = time.monotonic() + c.timeout
    failed = {}
    for rank, ar in pending.items():
        try:
            out = ar.get(max(0.0, deadline - time.monotonic()))
        except Exception as exc:
            failed[rank] = f"{getattr(exc, 'ename', type(exc).__name__)}: {exc}"
            continue
        err = out.get("error") or out.get("core_error")
        if err:
            failed[rank] = err
            continue
        info = ranks[rank]
        if info.engine_id in fresh:
            info.device, info.device_name = out["device"], out.get("device_name", "")
            info.device_memory = out.get("device_memory")
            info.core, info.core_error = out["core"], out["core_error"]
        if out.get("core_rank") != rank:
            failed[rank] = f"the core says it is rank {out.get('core_rank')}"
    for ar in leaving:
        try:
            ar.get(max(0.0, deadline - time.monotonic()))
        except Exception:  # it is stopped below all the same
            pass
    return failed


def _stop(cluster, removed) -> None:
    """Step E: the removed engines exit; wait until the controller lets them go."""
    c = cluster
    ids = [r.engine_id for r in removed]
    try:
        c.client.shutdown(targets=ids, block=True)
    except Exception:  # already gone
        pass
    deadline = time.monotonic() + STOP_WAIT
    while set(ids) & set(c.client.ids) and time.monotonic() < deadline:
        time.sleep(0.05)
