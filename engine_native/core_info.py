"""What the native core reports about itself: :func:`metrics`, :func:`config_table`,
:func:`timeline_events` and :func:`autotune_state`. Read-only, on any rank; they never need
the world that ``init()`` builds. Re-exported by :mod:`engine_native.basics`, which also holds
the calls that change the core (``start_timeline``, ``stop_timeline``, ``set_autotune``).
"""

from __future__ import annotations

import os

from . import _core

try:  # the core and this package ship together: a core without these was built elsewhere
    from ._core import (autotune_state as _core_autotune_state,
                        timeline_events as _core_timeline_events)
except ImportError as exc:
    raise ImportError(f"{exc}: engine_native._core does not match this engine_native package; "
                      f"rebuild it from this checkout (pip install -e ., or ./dev.sh test)"
                      ) from exc

__all__ = ["metrics", "config_table", "timeline_events", "autotune_state"]


def metrics() -> dict:
    """Snapshot of the core's counters (ops/bytes per collective, time split, pending ops).

    Time split: ``negotiate_seconds``, ``communicate_seconds`` (the background loop),
    ``idle_seconds`` (the loop waiting for work; ``wait_seconds`` is the same value under its
    earlier name) and ``handle_wait_seconds`` (framework threads blocked in ``wait()``);
    ``main_blocked_seconds`` is how long the main thread has been blocked in its current
    ``wait()`` (0 when it is not waiting: what the notebook uses to tell a rank stuck in a
    collective from one still computing);
    ``caller_driven_ops`` counts waits whose op ran on the waiting thread itself,
    ``caller_polled_ops`` those whose CUDA op the waiting thread then saw finish by polling
    its event (no host function woke the loop for it: Note [Caller waits on the device]), and
    ``caller_spin_us`` is how long such a thread polls before it sleeps (a point-to-point wait
    too, where every peer is on shared memory), ``spin_yields`` whether such polls, and the
    collectives' own short spins, yield the core between tries because this host's ranks
    outnumber its cores, ranks of one machine whose CPUs overlap its own outnumber the CPUs
    they span, or ranks pinned within its CPUs outnumber them (Note [Yielding spins]),
    ``caller_spin_extended``
    how many point-to-point waits spun past that budget because the ranks are bound to CPUs
    of their own and the host had a core free (Note [Spin while a core is free]),
    ``caller_spin_skipped`` how many driven waits did not spin
    (all of them where ``caller_spin_us`` is 0; otherwise those whose spin was backed off
    because it kept running out: Note [Spin backoff]), ``caller_passes`` how many loop passes
    those waits ran while they polled. ``loop_wakeups`` counts the background loop's waits
    that ended, and ``tick_pickups`` those of its passes that found work nothing had woken it
    for, after a whole 200 ms idle tick (Note [Tick pickups]: a missing wake-up).
    ``cpu_binding`` lists the CPUs this rank is bound to (``"0"``, ``"2,3"``; ``""``
    unbound: ``HVD_CPU_BIND``, Note [CPU binding]).
    ``p2p_sent``/``p2p_received`` count this rank's point-to-point messages,
    ``p2p_sent_bytes``/``p2p_received_bytes`` their bytes; ``p2p_split_sent``/
    ``p2p_split_received`` those copied straight between the two processes (Note [Split
    copy]: half by each side; all by the receiver, on two threads, into a posted receive's
    ``out=`` of at least 4 MiB or from a sender that could not verify it), and
    ``p2p_split_refused`` the offers answered "send it whole", either way (a peer that cannot
    be read, or a posted receive's ``out=`` under 4 MiB: those went through the ring).
    ``host_chunks`` counts the chunks of completed ops that went through the host collective
    segment (each a round of waits on the host's ranks: Note [Piece size]).
    ``helper_reads`` counts the reads the process's second reading thread ran since it
    started: halves of those point-to-point messages, and of large single-copy broadcasts read
    on two threads (``HVD_SINGLE_COPY``, Note [Two-thread reads]).
    ``one_round_ops`` counts ops agreed and moved in one round among the ranks (shared memory
    within a host, a frame to each rank beyond it), without rank 0's negotiation
    (``HVD_ONE_ROUND_BYTES``, Note [One round]).
    ``shutting_down_ranks``: on rank 0, the ranks that have begun ``shutdown()`` while others
    still run (refreshed every 200 ms; ``[]`` on other ranks).
    ``transports`` names, per global rank, the data path to it (``"self"``, ``"shm"``,
    ``"tcp"``); ``control_transports`` how negotiation messages travel to it (``"shm"``
    between a worker and rank 0 on one host, ``"tcp"`` across hosts or with
    ``HVD_TRANSPORT=tcp``, ``"none"`` where there is no control channel: a worker has one, to
    rank 0).
    Also ``timeline`` (a file is being written here), ``autotune`` (the dashboard's view of
    :func:`autotune_state`, None when tuning never ran) and ``events`` (collectives finished
    since the previous ``metrics()`` call in this process: ``{"op", "name", "start_ago_s",
    "dur_s", "error"}``).
    ``mps_pipe_directory``: the MPS daemon this process's CUDA connects to
    (``CUDA_MPS_PIPE_DIRECTORY``, set by ``hvdrun`` / ``%hvd_start`` / ``run()`` for ranks
    sharing a GPU when they use one; "" without MPS): the dashboard then labels the GPU path
    "... under MPS".
    """
    out = _core.metrics()
    out["mps_pipe_directory"] = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
    return out


def config_table() -> list:
    """Every ``HVD_*`` knob: (name, Horovod alias, type, default, doc)."""
    return _core.config_table()


def timeline_events(since_us: int = 0) -> list:
    """This rank's collectives of the last seconds, oldest first, recorded whether or not a
    file is written (``HVD_TIMELINE_LIVE``, on by default), for the dashboard's strip.

    One event per executed response: a fused batch is one event named after its first tensor
    (``"grad.0 (+199 fused)"``). Negotiation and activity detail goes to the file only.

    Returns
    -------
    list of tuple
        ``(ts_us, name, phase, op, duration_us, error)``: start in microseconds since the Unix
        epoch, tensor name, ``"op"``, the collective (``ALLREDUCE``, ``BROADCAST``, ...; ``ERROR``
        for an op that failed in negotiation), duration, error text ("" when none). Only events
        starting at or after ``since_us``.
    """
    return _core_timeline_events(int(since_us))


def autotune_state() -> dict:
    """The autotuner's state on this rank (any time, also before ``init()``).

    Rank 0 owns the tuner and reports its full state; the other ranks report the parameters
    applied last and the phase that came with them.

    Returns
    -------
    dict
        ``enabled``, ``tuner`` (True on rank 0 while it owns a tuner), ``phase`` (``"off"``,
        ``"warmup"``, ``"bayes"``, ``"categorical"``, ``"done"``; rank 0's is live and may be
        a batch ahead of ``applied_phase``, the phase that came with the parameters in force,
        on which every rank agrees after the same collective), ``trial``/``trials`` (setting
        k of n in this phase), ``planned_settings``, ``samples`` (of the current setting),
        ``applied`` (the parameters this rank runs with: ``fusion_threshold_bytes``,
        ``cycle_time_ms``, ``cache_enabled``, ``hierarchical_allreduce``), ``switches`` (every
        change applied here: ``{"responses_before", "params", "phase"}``, identical on every
        rank), and on rank 0 ``current``, ``best``, ``best_score`` (bytes/s) and ``history``
        (``{"params", "score", "phase"}`` per scored setting; the Bayesian phase ends by
        re-measuring its finalists in turn, so they appear twice).

    Example
    -------
    >>> hvd.autotune_state()["phase"]
    'bayes'
    """
    return _core_autotune_state()
