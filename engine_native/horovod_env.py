"""Horovod's environment variables: the ones this package reads (each under its ``HVD_*`` name
too, docs/pages/configuration.md) and a warning, once per process, naming any other
``HOROVOD_*`` variable set, since Horovod would have acted on it and this package will not
(e.g. ``HOROVOD_GPU_OPERATIONS`` or ``HOROVOD_NUM_NCCL_STREAMS``, left from a Horovod set-up).
tests/unit/test_horovod_env.py keeps ``READ`` equal to the names the sources read."""
import os
import warnings

READ = frozenset({
    # bootstrap: a rank's place in the world (engine_native/bootstrap.py, hvd_magic.launch)
    "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT",
    # the core's settings (engine_native/csrc/common/config.cc)
    "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY",
    "HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_STALL_CHECK_DISABLE",
    "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
    "HOROVOD_TIMELINE", "HOROVOD_TIMELINE_MARK_CYCLES", "HOROVOD_LOG_LEVEL",
    "HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
    # elastic and Spark
    "HOROVOD_ELASTIC", "HOROVOD_ELASTIC_TIMEOUT", "HOROVOD_SPARK_START_TIMEOUT",
})

_warned = False


def unread(environ=os.environ) -> list:
    """The ``HOROVOD_*`` names set in ``environ`` that nothing here reads, sorted."""
    return sorted(n for n in environ if n.startswith("HOROVOD_") and n not in READ)


def warn_unread_once(environ=os.environ) -> None:
    """Warn (once per process) about ``HOROVOD_*`` variables that have no effect here."""
    global _warned
    names = unread(environ)
    if _warned or not names:
        return
    _warned = True
    warnings.warn(f"engine_native ignores {', '.join(names)}: Horovod reads "
                  f"{'them' if len(names) > 1 else 'it'}, this package does not (its settings "
                  "and their HOROVOD_* names: docs/pages/configuration.md)", RuntimeWarning,
                  stacklevel=3)
