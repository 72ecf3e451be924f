"""The driver side of the Spark runner: one barrier stage whose tasks are the ranks.

A. Pickle ``(fn, args, kwargs)`` (naming any unpicklable part) and put it in a rendezvous
   store (engine_native.rendezvous) that this driver serves; start the log channel.
B. In a background thread, run ``parallelize(range(np), np).barrier().mapPartitions(task)``
   under a job group (hvd_magic.spark.task: each task starts one rank that bootstraps through
   the store, forwards its output here, and stores its result).
C. Wait, streaming output, until every rank has exited and the job is over. The first rank
   that fails cancels the job group after a short grace (Spark kills the other tasks); tasks
   that do not all start within ``start_timeout`` (too few free slots) cancel it too; Ctrl-C
   cancels it and re-raises. Never a hang.
D. Return the results in rank order, or raise the failing rank's error with its traceback.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import threading
import time
import uuid

from ..launch import config
from ..launch import hosts as hostlib
from ..launch.output import RankOutput
from ..launch.pickling import dumps_call
from ..launch.procs import JobResult
from ..launch.runfn import STORE_MAX_TOTAL, STORE_MAX_VALUE, collect_results, failure_error
from .logchannel import LogServer
from .task import TaskSpec, barrier_task

_FAIL_GRACE = 3.0     # seconds other ranks get to report before the job group is cancelled
_CLOSE_GRACE = 3.0    # seconds to wait for log channels to finish after the Spark job ended


def active_context():
    """The active SparkContext, or a clear error saying how to get one."""
    try:
        from pyspark import SparkContext
    except ImportError:
        raise RuntimeError("this needs pyspark (pip install pyspark) and an active Spark "
                           "session; to run on this machine only use HorovodRunner(np=-N) or "
                           "hvd_magic.run(fn, np=N)") from None
    sc = SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("no active Spark session: create one first (SparkSession.builder"
                           "...getOrCreate()), or run on this machine only with "
                           "HorovodRunner(np=-N) / hvd_magic.run(fn, np=N)")
    return sc


def local_slots(master: str) -> int | None:
    """Task slots of a ``local[...]`` master (None for a cluster)."""
    if master == "local":
        return 1
    m = re.fullmatch(r"local\[(\*|\d+)(?:,\s*\d+)?\]", master)
    if not m:
        return None
    return os.cpu_count() or 1 if m.group(1) == "*" else int(m.group(1))


class _Watch:
    """What the log channel and the job thread report, under one condition variable."""

    def __init__(self, output: RankOutput):
        self.output = output
        self.cond = threading.Condition()
        self.started: set = set()
        self.open: set = set()
        self.codes: dict = {}
        self.failed: int | None = None
        self.failed_at = 0.0
        self.spark_done = False
        self.spark_error: BaseException | None = None

    def on_message(self, rank: int, kind: str, text: str) -> None:
        if kind in ("stdout", "stderr"):
            self.output.line(rank, kind, text)
            return
        with self.cond:
            if kind == "hello":
                self.started.add(rank)
                self.open.add(rank)
            elif kind == "exit":
                code = int(text) if text.lstrip("-").isdigit() else 1
                self.codes[rank] = code
                if code != 0 and self.failed is None:
                    self.failed, self.failed_at = rank, time.monotonic()
            elif kind == "closed":
                self.open.discard(rank)
            self.cond.notify_all()

    def job_finished(self, error: BaseException | None) -> None:
        with self.cond:
            self.spark_done, self.spark_error = True, error
            self.cond.notify_all()


def _spark_summary(exc: BaseException) -> str:
    """The Python error inside a Py4JJavaError, without the JVM stack."""
    text = str(exc)
    start = text.find("Traceback (most recent call last)")
    if start >= 0:
        body = text[start:].split("\n\tat ")[0]
        return body.strip()
    first = [line for line in text.splitlines() if line.strip()][:3]
    return " / ".join(first)[:800]


def _run_job(sc, group: str, size: int, task, watch: _Watch, what: str) -> None:
    error = None
    try:
        sc.setJobGroup(group, f"hvd_magic: {what}", interruptOnCancel=True)
        sc.parallelize(range(size), size).barrier().mapPartitions(task).collect()
    except BaseException as exc:  # reported to the waiting caller
        error = exc
    finally:
        watch.job_finished(error)


def _wait(sc, group: str, watch: _Watch, size: int, start_timeout: float) -> str:
    """Step C. Returns "" when the job ended, or why it was cancelled."""
    start_deadline = time.monotonic() + start_timeout
    cancelled, closing_deadline = "", None
    with watch.cond:
        while True:
            now = time.monotonic()
            if watch.spark_done:
                closing_deadline = closing_deadline or now + _CLOSE_GRACE
                if not watch.open or now >= closing_deadline:
                    return cancelled
            elif not cancelled:
                if watch.failed is not None and now >= watch.failed_at + _FAIL_GRACE:
                    cancelled = f"rank {watch.failed} failed"
                elif len(watch.started) < size and now >= start_deadline:
                    cancelled = "start timeout"
                if cancelled:
                    sc.cancelJobGroup(group)
            watch.cond.wait(0.5)  # woken at once by every report; the tick checks deadlines


def listen_host(conf, local: bool) -> str:
    """Where the store and log servers listen: loopback for a local master, else the address
    executors reach the driver at (Spark's ``spark.driver.host``); never every interface."""
    if local:
        return "127.0.0.1"
    return conf.get("spark.driver.host") or hostlib.address_toward([])


def run_on_spark(fn, args=(), kwargs=None, num_proc: int | None = None,
                 start_timeout: float | None = None, env: dict | None = None,
                 stdout=None, stderr=None, prefix_output_with_timestamp: bool = False,
                 executable: str | None = None, verbose: int = 1, what: str = "",
                 only_ranks=None) -> list:
    """Run ``fn`` on ``num_proc`` barrier tasks of the active Spark session (steps A-D)."""
    from engine_native.rendezvous import RendezvousClient, RendezvousServer

    sc = active_context()
    size = num_proc or sc.defaultParallelism
    what = what or f"hvd_magic.spark.run({getattr(fn, '__name__', 'fn')})"
    slots = local_slots(sc.master)
    if slots is not None and size > slots:
        raise ValueError(f"{what}: {size} ranks need {size} task slots at once (barrier mode), "
                         f"but master {sc.master} has {slots}; lower np or use local[{size}]")
    if start_timeout is None:
        start_timeout = float(os.environ.get("HOROVOD_SPARK_START_TIMEOUT", "600"))
    payload = dumps_call(fn, tuple(args), dict(kwargs or {}), what)  # step A
    host = listen_host(sc.getConf(), local=slots is not None)
    secret, key = secrets.token_bytes(32), "spark-" + uuid.uuid4().hex[:12]
    output = RankOutput(stdout, stderr, timestamp=prefix_output_with_timestamp,
                        only_ranks=only_ranks)
    watch = _Watch(output)
    server = RendezvousServer(secret, host=host, max_value_bytes=STORE_MAX_VALUE,
                              max_total_bytes=STORE_MAX_TOTAL)
    server.start()
    logs = LogServer(secret, watch.on_message, host=host)
    try:
        store = "%s:%d" % server.address
        with RendezvousClient(store, secret) as client:
            client.set(f"{key}/payload", payload)
            rank_env = config.with_caller_path(dict(env or {}))
            rank_env.update(config.tunables_env(start_timeout=start_timeout))
            spec = TaskSpec(size=size, store=store, logs="%s:%d" % logs.address,
                            secret_hex=secret.hex(), key=key, env=rank_env,
                            executable=executable or "", start_timeout=start_timeout)
            if verbose and verbose > 1:
                output.note(f"{what}: {size} barrier task(s) on {sc.master}, store {store}")
            group = f"hvd-magic-{key}"
            thread = threading.Thread(target=_run_job, name="hvd-spark-job", daemon=True,
                                      args=(sc, group, size,
                                            functools.partial(barrier_task, spec=spec),
                                            watch, what))
            thread.start()
            try:
                cancelled = _wait(sc, group, watch, size, start_timeout)  # step C
            except KeyboardInterrupt:
                sc.cancelJobGroup(group)
                thread.join(30)
                raise
            thread.join(30)
            results = collect_results(client, key, size)
    finally:
        logs.stop()
        server.stop()
        output.close()
    return _outcome(watch, results, size, output, what, cancelled, start_timeout, sc)


def _outcome(watch: _Watch, results: dict, size: int, output: RankOutput, what: str,
             cancelled: str, start_timeout: float, sc) -> list:
    """Step D."""
    if cancelled == "start timeout":
        raise TimeoutError(
            f"{what}: only {len(watch.started)} of {size} Spark tasks started within "
            f"{start_timeout:g} s; barrier mode needs {size} free task slots at once "
            f"(default parallelism here: {sc.defaultParallelism}): lower np or free slots")
    job = JobResult(codes=dict(watch.codes), failed=watch.failed)
    if watch.failed is None and watch.spark_error is not None and not results:
        raise RuntimeError(f"{what}: the Spark job failed before the ranks ran: "
                           f"{_spark_summary(watch.spark_error)}") from None
    error = failure_error(job, results, size, output, what)
    if error is not None:
        raise error
    if watch.spark_error is not None:
        raise RuntimeError(f"{what}: the Spark job failed: {_spark_summary(watch.spark_error)}")
    return [results[r]["value"] for r in range(size)]
