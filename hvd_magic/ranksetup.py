"""Who is which rank, and the core on every rank: bootstrap, GPU pinning, abort + re-init.

Called by :class:`hvd_magic.cluster.HvdCluster` once engines registered, on the notebook's
main thread. Protocol for a fresh engine set:

A. ``describe()`` on every engine: host, pid, MPI rank/size when started by mpiexec.
B. Ranks: the MPI rank under the MPI launcher (checked to be one world of n), else engine-id
   order. Local ranks count engines per host in rank order (what the core computes too).
C. Without MPI, the driver runs a ``RendezvousServer`` (``engine_native.rendezvous``) with a
   fresh secret; each engine gets ``HVD_RANK``, ``HVD_SIZE``, ``HVD_RENDEZVOUS``,
   ``HVD_SECRET`` (hex) and ``HVD_JOB_ID`` before ``hvd.init()``. Under MPI the core
   bootstraps through mpi4py by itself.
   Unless ``--no-mps``, the cluster's MPS daemon starts here when this machine's ranks share GPUs
   (:mod:`hvd_magic.cluster_mps`) and its variables join those ranks' environments.
D. ``init_engine()`` on all engines at once (init is collective): pin GPU, init the core,
   put ``hvd`` and ``torch`` in the namespace.

Recovery (:meth:`RankSetup.reset_cores`) runs ``abort`` + ``shutdown`` + ``init`` on every rank
at once, so all ranks start a new core epoch together.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import site
import time
import uuid

from . import engine_side, gpu_pinning, preflight, ssh_engines
from .errors import StartError
from .launch import config
from .launch import hosts as hostlib
from .rankinfo import RankInfo
from .ranks import format_ranks


def binding_note(bound: dict) -> str | None:
    """One line for the driver when the core bound ranks to CPUs (HVD_CPU_BIND: by default only
    where ranks outnumber the CPUs they may use by a whole multiple); None when none was."""
    if not bound:
        return None
    by_cpus: dict[str, list[int]] = {}
    for rank, cpus in sorted(bound.items()):
        by_cpus.setdefault(cpus, []).append(rank)
    where = "; ".join(f"CPUs {cpus}: ranks {format_ranks(ranks)}"
                      for cpus, ranks in by_cpus.items())
    return (f"ranks bound to CPUs by the core ({where}; HVD_CPU_BIND). "
            f"--env HVD_CPU_BIND=none leaves them to the scheduler")


def engine_env(cluster) -> dict:
    """Environment for the engine launcher: the user's ``--env``, our package importable on
    the engines, GPUs hidden with ``--gpus none``, one OpenMP thread share per rank."""
    env = {}
    here = os.path.dirname(os.path.dirname(os.path.abspath(engine_side.__file__)))
    installed = {os.path.abspath(p) for p in site.getsitepackages() + [site.getusersitepackages()]}
    if here not in installed:  # a source checkout: let the engines import hvd_magic too
        path = os.environ.get("PYTHONPATH", "")
        env["PYTHONPATH"] = here + (os.pathsep + path if path else "")
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(config.threads_per_rank(cluster.n))
    if cluster.gpus == "none":
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(cluster.env)
    return env


def core_available() -> bool:
    """Whether the native core is built in this environment (the engines share it)."""
    try:
        return importlib.util.find_spec("engine_native._core") is not None
    except (ImportError, ValueError):
        return False


class RankSetup:
    """Rank mapping and core bootstrap for one engine set of ``cluster``."""

    def __init__(self, cluster, launch_env: dict):
        self.cluster = cluster
        self.launch_env = launch_env
        self.rendezvous = None
        self.with_core = core_available()
        self.core_note = "" if self.with_core else (
            "engine_native is not built in this environment, so cells run without `hvd`. "
            "Fix: `pip install -e .` in the repository (or install hvd-magic), then %hvd_restart")

    def setup_ranks(self, engine_ids: list[int]):
        """Steps A-D; returns (ranks, notes). Raises StartError on a broken world."""
        c = self.cluster
        try:
            infos = c.client[engine_ids].apply_async(engine_side.describe).get(c.timeout)
        except Exception as exc:  # an engine died or hung right after registering
            raise StartError(f"engines registered but did not answer: {exc}. Fix: check the "
                             f"engines' output with %hvd_start --timeout 120, or "
                             f"--launcher local") from None
        by_engine = dict(zip(engine_ids, infos))
        if c.launcher == "mpi":
            preflight.check_mpi_world(infos, c.n)
            order = sorted(engine_ids, key=lambda e: by_engine[e]["mpi_rank"])
        elif c.slots is not None:
            order = ssh_engines.rank_order(engine_ids, by_engine, c.slots)
        else:
            order = sorted(engine_ids)
        ranks = [RankInfo(rank=r, engine_id=e, host=by_engine[e]["host"],
                          pid=by_engine[e]["pid"]) for r, e in enumerate(order)]
        seen: dict[str, int] = {}
        for info in ranks:
            info.local_rank = info.pin_slot = seen.get(info.host, 0)
            seen[info.host] = info.local_rank + 1
        c.set_ranks(ranks)
        mps_notes = c.mps.prepare(ranks, self.launch_env)  # before any rank touches CUDA
        c.update_reaper()
        notes = self._init_engines(ranks, mpi=c.launcher == "mpi", local_sizes=seen)
        return ranks, mps_notes + notes

    def _rank_env(self, mpi: bool) -> list[dict]:
        n = len(self.cluster.ranks)
        if mpi or not self.with_core:
            return [{} for _ in range(n)]
        from engine_native.rendezvous import RendezvousServer

        secret = secrets.token_bytes(32)
        # engines on other hosts reach the rendezvous at the address toward them (an
        # address of this machine's hostname may be 127.0.1.1, or an uplink they cannot reach)
        host = ("127.0.0.1" if self.cluster.launcher == "local" else
                hostlib.address_toward([r.host for r in self.cluster.ranks]))
        self.rendezvous = RendezvousServer(secret, host=host)
        bound, port = self.rendezvous.start()
        job = f"hvd-{uuid.uuid4().hex[:12]}"
        return [{"HVD_RANK": str(r), "HVD_SIZE": str(n), "HVD_RENDEZVOUS": f"{bound}:{port}",
                 "HVD_SECRET": secret.hex(), "HVD_JOB_ID": job} for r in range(n)]

    def _init_engines(self, ranks, mpi: bool, local_sizes: dict) -> list[str]:
        c = self.cluster
        envs = [dict(e, **c.mps.rank_env(r)) for e, r in zip(self._rank_env(mpi), ranks)]
        pending = [c.client[r.engine_id].apply_async(engine_side.init_engine, r.rank, envs[r.rank],
                                                     c.gpus, r.local_rank, self.with_core,
                                                     local_sizes[r.host], c.framework)
                   for r in ranks]
        deadline = time.monotonic() + c.timeout
        for ar in pending:
            ar.wait(max(0.0, deadline - time.monotonic()))
        late = [r.rank for r, ar in zip(ranks, pending) if not ar.ready()]
        if late:
            c.signal_ranks(late)
            raise StartError(f"hvd.init() did not finish within {c.timeout:g} s on ranks "
                             f"{format_ranks(late)}. Fix: check that the ranks can reach each "
                             f"other (HVD_IFACE_ADDRESS, firewalls), or raise --timeout")
        notes = [self.core_note] if self.core_note else []
        pins = []  # (host, GPU pin) per rank: ranks sharing GPUs are said once (#16)
        bound = {}  # rank -> the CPUs the core bound it to (HVD_CPU_BIND)
        for info, ar in zip(ranks, pending):
            try:
                out = ar.get()
            except Exception as exc:  # the engine died during set-up
                raise StartError(f"rank {info.rank} failed while setting up: {exc}") from None
            info.device, info.device_name = out["device"], out.get("device_name", "")
            info.device_memory = out.get("device_memory")
            pins.append((info.host, out.get("gpu") or {}))
            info.core, info.core_error = out["core"], out["core_error"]
            if out.get("cpu_binding"):
                bound[info.rank] = out["cpu_binding"]
            if out.get("core_rank") not in (None, info.rank):
                notes.append(f"rank {info.rank}: the core says it is rank {out['core_rank']}")
        notes += filter(None, [gpu_pinning.sharing_note(pins), binding_note(bound)])
        errors = {r.rank: r.core_error for r in ranks if r.core_error}
        if errors and self.with_core:
            first = next(iter(errors.values()))
            notes.append(f"the core did not initialise on ranks {format_ranks(errors)}: {first}; "
                         f"cells run without `hvd`")
        return notes

    def reset_cores(self, reason: str, timeout: float) -> dict[int, dict]:
        """Abort in-flight collectives and re-initialise the core on every rank, all at once.
        Returns each rank's new core state; ranks that did not answer in time are missing."""
        c = self.cluster
        if not any(r.core for r in c.ranks):
            return {}
        if c.elastic is not None:  # an elastic core's init() joins the next generation
            c.elastic.publish([r.engine_id for r in c.ranks], {}, reason)
        pending = {r.rank: c.client[r.engine_id].apply_async(engine_side.reset_core, reason)
                   for r in c.ranks}
        deadline = time.monotonic() + timeout
        done = {}
        for rank, ar in pending.items():
            try:
                done[rank] = ar.get(max(0.0, deadline - time.monotonic()))
            except Exception:  # no answer in time (or the engine died): reported as missing
                pass
        return done

    def shutdown_cores(self, timeout: float) -> None:
        c = self.cluster
        if any(r.core for r in c.ranks) and not c.busy_ranks():
            c.view().apply_async(engine_side.shutdown_core).wait(timeout)

    def close(self) -> None:
        if self.rendezvous is not None:
            self.rendezvous.stop()
            self.rendezvous = None
