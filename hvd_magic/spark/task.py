"""The executor side of the Spark runner: one barrier task = one rank.

Runs inside a PySpark worker on an executor. Steps, in every task of the barrier stage:

A. ``BarrierTaskContext.allGather(host)``: every task learns where every rank runs (so local
   and cross ranks are known before the rank starts) and no rank starts before all tasks are
   scheduled together, which is what barrier mode guarantees.
B. Connect to the driver's log channel and say hello.
C. Start the rank as a child process (``python -m hvd_magic.launch.task``) with the bootstrap
   environment pointing at the driver's rendezvous store; forward each of its output lines
   and finally its exit code to the driver. The rank pins a GPU of its host by its local
   rank; when Spark's GPU scheduling gave this task GPUs, it gets those instead.
D. Return the rank's exit code, also when it failed: the driver already knows (step C) and
   cancels the job group, which kills the other tasks (their ranks die with their worker,
   PR_SET_PDEATHSIG). Raising instead would make Spark retry the whole barrier stage, i.e.
   rerun the training, before the driver's cancel lands.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
from dataclasses import dataclass, field

from .. import gpu_pinning
from ..launch import config
from ..launch.hosts import slots_of
from ..launch.output import RankOutput
from ..launch.procs import ProcessJob, spawn
from .logchannel import EXIT, HELLO, STDERR, STDOUT, LogClient


@dataclass(frozen=True)
class TaskSpec:
    """What the driver ships to every task (inside the Spark closure)."""
    size: int
    store: str          # host:port of the driver's rendezvous store
    logs: str           # host:port of the driver's log channel
    secret_hex: str
    key: str            # job key in the store
    env: dict = field(default_factory=dict)
    executable: str = ""
    start_timeout: float = 600.0


class _Forward(ProcessJob):
    """Supervises the one rank of this task and forwards its output to the driver."""

    def __init__(self, channel: LogClient):
        super().__init__(RankOutput(prefix=False))
        self.channel = channel

    def handle_line(self, key, stream: str, text: str) -> None:
        try:
            self.channel.send(STDOUT if stream == "stdout" else STDERR, text)
        except OSError:  # the driver went away: the rank's output has nowhere to go
            self.stop("lost the driver")

    def handle_exit(self, key, code: int) -> None:
        self.result.codes[key] = code
        try:
            self.channel.send(EXIT, str(code))
        except OSError:
            pass


def assigned_gpus(resources, env: dict, local_rank: int) -> dict | None:
    """When Spark assigned this task GPUs (``spark.task.resource.gpu.amount``; ``resources`` is
    ``TaskContext.resources()``), the rank uses those, not a round-robin share of its host's:
    ``CUDA_VISIBLE_DEVICES`` = their addresses, pinned (as one rank alone on them) to the
    first. Returns the pin, or None (no assignment, or GPUs hidden with ``gpus="none"``)."""
    info = (resources or {}).get("gpu")
    addresses = [str(a) for a in getattr(info, "addresses", None) or ()]
    if not addresses or env.get("CUDA_VISIBLE_DEVICES") == "":
        return None
    env["CUDA_VISIBLE_DEVICES"] = ",".join(addresses)
    return gpu_pinning.pin(0, 1, environ=env, set_device_rank=local_rank)


def barrier_task(_partition, spec: TaskSpec):
    """mapPartitions function of the barrier stage (a generator, as Spark expects)."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    host = socket.gethostname()
    gathered = [json.loads(m) for m in ctx.allGather(json.dumps([host, secrets.token_hex(6)]))]
    hosts = [h for h, _ in gathered]  # step A
    slot = slots_of(hosts)[rank]
    secret = bytes.fromhex(spec.secret_hex)
    env = config.clean_env()
    env.update({k: v for k, v in spec.env.items() if k != "PYTHONPATH"})
    # What this task can import, the rank can: the driver's paths, this worker's PYTHONPATH,
    # and its sys.path additions (e.g. files shipped with SparkContext.addPyFile).
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (spec.env.get("PYTHONPATH", ""), env.get("PYTHONPATH", "")) if p)
    env = config.with_caller_path(env)
    # Task 0's token scopes the bootstrap: a retried stage attempt must not read the
    # addresses its predecessor published.
    job_id = f"{spec.key}-{gathered[0][1]}"
    env = config.rank_env(env, slot, spec.size, rendezvous=spec.store,
                          secret_hex=spec.secret_hex, job_id=job_id, set_hostname=False)
    config.share_threads(env, slot.local_size)
    assigned_gpus(ctx.resources(), env, slot.local_rank)
    env.update(HVD_RUN_STORE=spec.store, HVD_RUN_KEY=spec.key,
               HVD_START_TIMEOUT=env.get("HVD_START_TIMEOUT", f"{spec.start_timeout:g}"))
    with LogClient(spec.logs, secret, rank, connect_timeout=spec.start_timeout) as channel:
        channel.send(HELLO, f"{host} pid {os.getpid()}")  # step B
        job = _Forward(channel)
        job.add(rank, spawn([spec.executable or sys.executable, "-m", "hvd_magic.launch.task"],
                            env))  # step C
        code = job.run().codes.get(rank)
    yield rank, code  # step D
