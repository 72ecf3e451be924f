"""Environment of rank processes: launcher flags as ``HVD_*`` variables, and the bootstrap set.

Horovod's horovodrun turns its tunable flags into ``HOROVOD_*`` variables; ours become the
``HVD_*`` names of the core's env table (engine_native.config_table()), which also accepts the
Horovod names. :func:`rank_env` adds what one rank needs to find its peers through the
launcher's rendezvous store: ``HVD_RANK``, ``HVD_SIZE``, ``HVD_RENDEZVOUS``, ``HVD_SECRET``,
``HVD_JOB_ID``, plus local/cross ranks and the same values under Horovod's names, which
scripts read before ``hvd.init()`` (e.g. to pick a GPU).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterable, Mapping

# Inherited values of these must never reach a rank: a launcher started from inside an MPI
# job (a notebook engine, an mpiexec'd script) would otherwise hand its own rank to children.
_BOOTSTRAP_VARS = frozenset({
    "HVD_RANK", "HVD_SIZE", "HVD_LOCAL_RANK", "HVD_LOCAL_SIZE", "HVD_CROSS_RANK",
    "HVD_CROSS_SIZE", "HVD_RENDEZVOUS", "HVD_SECRET", "HVD_JOB_ID", "HVD_HOSTNAME",
    "HVD_IFACE_ADDRESS", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "HVD_GPU_PIN",  # a pinned process's own GPU (hvd_magic.gpu_pinning): never a child rank's
    "HVD_ELASTIC_WORKER", "HVD_ELASTIC_GENERATION",  # an elastic worker's identity
})
_BOOTSTRAP_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "HYDI_", "HYDRA_", "MPIR_")

_LOG_LEVELS = {"trace": "trace", "debug": "debug", "info": "info", "warning": "warning",
               "warn": "warning", "error": "error", "fatal": "error"}


def clean_env(base: Mapping[str, str] | None = None) -> dict:
    """``base`` (default os.environ) without inherited rank/bootstrap variables."""
    base = os.environ if base is None else base
    return {k: v for k, v in base.items()
            if k not in _BOOTSTRAP_VARS and not k.startswith(_BOOTSTRAP_PREFIXES)}


def parse_env_pairs(pairs: Iterable[str] | None) -> dict:
    """``["K=V", "X=1"]`` → ``{"K": "V", "X": "1"}`` (``--env`` flags)."""
    out = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key or "\0" in pair:
            raise ValueError(f"--env expects KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def tunables_env(*, fusion_threshold_mb: float | None = None,
                 cycle_time_ms: float | None = None, cache_capacity: int | None = None,
                 hierarchical_allreduce: bool | None = None,
                 timeline_filename: str | None = None, timeline_mark_cycles: bool = False,
                 autotune: bool = False, autotune_log_file: str | None = None,
                 log_level: str | None = None, no_stall_check: bool = False,
                 stall_check_warning_time_seconds: float | None = None,
                 stall_check_shutdown_time_seconds: float | None = None,
                 tcp: bool = False, start_timeout: float | None = None,
                 bind_to: str | None = None, **_ignored) -> dict:
    """horovodrun's tunable flags → the ``HVD_*`` variables the core reads."""
    env = {}
    if fusion_threshold_mb is not None:
        if fusion_threshold_mb < 0:
            raise ValueError(f"--fusion-threshold-mb must be >= 0, got {fusion_threshold_mb}")
        env["HVD_FUSION_THRESHOLD"] = str(int(fusion_threshold_mb * 1024 * 1024))
    if cycle_time_ms is not None:
        if cycle_time_ms < 0:
            raise ValueError(f"--cycle-time-ms must be >= 0, got {cycle_time_ms}")
        env["HVD_CYCLE_TIME_MS"] = f"{cycle_time_ms:g}"
    if cache_capacity is not None:
        if cache_capacity < 0:
            raise ValueError(f"--cache-capacity must be >= 0, got {cache_capacity}")
        env["HVD_CACHE_CAPACITY"] = str(cache_capacity)
    if hierarchical_allreduce is not None:
        env["HVD_HIERARCHICAL_ALLREDUCE"] = "1" if hierarchical_allreduce else "0"
    if timeline_filename:
        env["HVD_TIMELINE"] = os.path.abspath(timeline_filename)
    if timeline_mark_cycles:
        env["HVD_TIMELINE_MARK_CYCLES"] = "1"
    if autotune:
        env["HVD_AUTOTUNE"] = "1"
    if autotune_log_file:
        env["HVD_AUTOTUNE_LOG"] = os.path.abspath(autotune_log_file)
    if log_level:
        level = _LOG_LEVELS.get(log_level.lower())
        if level is None:
            raise ValueError(f"--log-level {log_level!r}: choose one of "
                             "TRACE, DEBUG, INFO, WARNING, ERROR, FATAL")
        env["HVD_LOG"] = level
    if no_stall_check:
        env["HVD_STALL_CHECK_DISABLE"] = "1"
    if stall_check_warning_time_seconds is not None:
        env["HVD_STALL_CHECK_TIME"] = f"{stall_check_warning_time_seconds:g}"
    if stall_check_shutdown_time_seconds is not None:
        env["HVD_STALL_SHUTDOWN_TIME"] = f"{stall_check_shutdown_time_seconds:g}"
    if tcp:
        env["HVD_TRANSPORT"] = "tcp"
    if start_timeout is not None:
        env["HVD_START_TIMEOUT"] = f"{start_timeout:g}"
    if bind_to is not None:
        env["HVD_CPU_BIND"] = bind_to
    return env


def rank_env(base: Mapping[str, str], slot, size: int, *, rendezvous: str | None,
             secret_hex: str | None, job_id: str, set_hostname: bool) -> dict:
    """The full environment of one rank process started by the launcher (not by mpiexec)."""
    env = dict(base)
    values = {"RANK": slot.rank, "SIZE": size, "LOCAL_RANK": slot.local_rank,
              "LOCAL_SIZE": slot.local_size, "CROSS_RANK": slot.cross_rank,
              "CROSS_SIZE": slot.cross_size}
    for key, value in values.items():
        env["HVD_" + key] = str(value)
        env["HOROVOD_" + key] = str(value)
    if rendezvous:
        env["HVD_RENDEZVOUS"] = rendezvous
    if secret_hex:
        env["HVD_SECRET"] = secret_hex
    env["HVD_JOB_ID"] = job_id
    if set_hostname:
        env["HVD_HOSTNAME"] = env["HOROVOD_HOSTNAME"] = slot.host
    env["PYTHONUNBUFFERED"] = "1"  # line-by-line output through the launcher's pipes
    return env


def threads_per_rank(ranks_here: int) -> int:
    """This machine's cores (those this process may use) shared by its ``ranks_here`` ranks."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, ranks_here))


def share_threads(env: dict, ranks_here: int) -> dict:
    """``OMP_NUM_THREADS`` for a rank on this machine, unless the user set it: torch's default,
    a thread per core in every rank, oversubscribes the cores as soon as two ranks share them
    (torchrun sets 1 for the same reason)."""
    env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(ranks_here)))
    return env


def with_caller_path(env: dict) -> dict:
    """Let ranks import what the caller can: its non-installed ``sys.path`` entries go first on
    ``PYTHONPATH`` (a notebook's folder, a test's package), so functions pickled by reference
    load in the ranks too."""
    installed = {os.path.realpath(p) for p in (sysconfig.get_paths().get(k) for k in
                 ("stdlib", "platstdlib", "purelib", "platlib")) if p}
    prefixes = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix})
    extra = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if (os.path.isdir(path) and path not in installed and not path.startswith(prefixes)
                and path not in extra):
            extra.append(path)
    old = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in extra]
    env["PYTHONPATH"] = os.pathsep.join(extra + old)
    return env
