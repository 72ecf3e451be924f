"""Run a benchmark's rank function in ``size`` freshly spawned processes of one job, and the
per-step statistics of what they time. Used by bench_jax.py, bench_keras.py and
bench_tensorflow.py (each compares a framework binding with engine_native.torch).

The ranks rendezvous with a server in this process (engine_native.rendezvous); each runs
``target(rank, *args)`` and its return value (or its traceback) comes back through a queue.
"""
import multiprocessing as mp
import os
import secrets
import statistics
import traceback
import uuid


class RankFailed(Exception):
    """A rank raised; the message is its traceback."""


def _child(target, rank, env, args, queue):
    os.environ.update(env)
    try:
        queue.put((rank, target(rank, *args), None))
    except Exception:  # reported to the parent, which raises RankFailed
        queue.put((rank, None, traceback.format_exc()))


def run_ranks(target, size: int, args=(), env=None, timeout: float = 600) -> list:
    """``target(rank, *args)``'s results in rank order. ``env`` is added to each rank's
    environment (with the rendezvous variables and OMP_NUM_THREADS=1). Raises RankFailed with
    the first failed rank's traceback, queue.Empty when a rank has not answered in
    ``timeout`` seconds."""
    from engine_native.rendezvous import RendezvousServer
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    secret = secrets.token_bytes(32)
    with RendezvousServer(secret) as server:
        host, port = server.address
        shared = dict(HVD_SIZE=str(size), HVD_RENDEZVOUS=f"{host}:{port}",
                      HVD_SECRET=secret.hex(), HVD_JOB_ID=uuid.uuid4().hex[:12],
                      OMP_NUM_THREADS="1", **(env or {}))
        procs = [ctx.Process(target=_child, args=(target, r, dict(shared, HVD_RANK=str(r)),
                                                  args, queue)) for r in range(size)]
        try:
            for p in procs:
                p.start()
            results = sorted(queue.get(timeout=timeout) for _ in procs)
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    errors = [err for _, _, err in results if err]
    if errors:
        raise RankFailed(errors[0])
    return [result for _, result, _ in results]


def step_stats(rank_times) -> tuple:
    """(median, p90, fastest) step time of per-rank lists of step times, a step being as slow
    as its slowest rank. The fastest step is the least disturbed by other load."""
    per_step = sorted(max(ts) for ts in zip(*rank_times))
    return statistics.median(per_step), per_step[int(0.9 * (len(per_step) - 1))], per_step[0]
