"""``hvdrun --min-np N --max-np M [--host-discovery-script S] [--slots-per-host K]``: the elastic
driver (Horovod's ``horovodrun`` elastic mode on this project's rendezvous).

It starts one worker per slot (up to ``--max-np``; ``-np`` caps the first generation), watches
them, and re-forms the job as a new *generation* when a worker dies, when the discovery
script's output changes (polled every second), or when every worker asked for a reset. Workers
have stable ids (``host[slot]``, also their output prefix); ranks belong to generations, which
the driver publishes through the rendezvous store (engine_native.elastic_world). A worker's
``hvd.elastic.run`` joins the newest generation when it resets.

Note [Elastic job rules]
A. A worker exiting non-zero (signal included) fails: its host is blacklisted (elastic_hosts),
   the survivors keep their order, free slots fill up to ``--max-np``, and generation g + 1 is
   published before the new workers start.
B. Fewer than ``--min-np`` workers left, or more re-formings than ``--reset-limit`` (or none able to start within ``--elastic-timeout`` at
   the beginning): every worker is stopped and hvdrun exits 1 naming the count. Nobody waits on
   a world that cannot form: survivors blocked in a collective fail on the dead peer and are
   then stopped.
C. The first worker to exit 0 means training finished: no more generations. hvdrun exits 0
   when every worker of the last generation exited 0, else with the first failure's status.
D. All generation changes happen on the loop thread; the discovery thread and the store's
   ``on_set`` hook only post events and wake the loop.

Note [Elastic jobs across machines]
A discovered host that is not this machine gets its workers over ssh (remote.py, with -p/-i).
Ranks find each other at the address their rendezvous address routes through (Note
[Advertised address] in engine_native/bootstrap.py), so when the first discovery names another
machine, every worker — this machine's too — is given the store's address on the network that
reaches those machines, and the store listens there (else on loopback only). A job whose first discovery
names only this machine keeps loopback; another machine discovered later is left out, with a
note (its workers could not reach the ones listening on loopback).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import threading
import time
import uuid

from . import config, elastic_hosts
from . import hosts as hostlib
from .elastic_hosts import DiscoveryError, HostBook, Worker
from .procs import ProcessJob, describe_exit, exit_status, spawn
from .remote import spawn_remote

__all__ = ["ElasticJob", "check_args", "run_elastic"]

_POLL_SECONDS = 1.0


def check_args(args) -> None:
    """Validate the elastic flags (ValueError with the fix)."""
    if args.min_np is None and args.max_np is None and args.host_discovery_script is None:
        if getattr(args, "blacklist_cooldown_range", None):
            raise ValueError("--blacklist-cooldown-range is for elastic jobs (--min-np/--max-np/"
                             "--host-discovery-script)")
        return
    if args.max_np is None and args.host_discovery_script is None:
        raise ValueError("elastic mode needs --max-np (slots on this machine) or "
                         "--host-discovery-script")
    if args.min_np is None:
        args.min_np = args.np if args.np is not None else 1
    if args.max_np is None:
        args.max_np = 1 << 20
    if args.reset_limit is not None and args.reset_limit < 0:
        raise ValueError(f"--reset-limit must be >= 0, got {args.reset_limit}")
    if args.min_np < 1 or args.max_np < args.min_np:
        raise ValueError(f"need 1 <= --min-np <= --max-np, got --min-np {args.min_np} "
                         f"--max-np {args.max_np}")
    if args.np is not None and not args.min_np <= args.np <= args.max_np:
        raise ValueError(f"-np {args.np} must lie between --min-np {args.min_np} and "
                         f"--max-np {args.max_np}")
    if args.hosts or args.hostfile:
        raise ValueError("elastic mode takes its hosts from --host-discovery-script (or "
                         "localhost with --max-np slots), not -H/-hostfile")
    cooldown = getattr(args, "blacklist_cooldown_range", None)
    if cooldown:
        low, high = cooldown
        lo_limit, hi_limit = elastic_hosts.COOLDOWN_LIMITS
        if not lo_limit <= low <= high <= hi_limit:
            raise ValueError(f"--blacklist-cooldown-range needs {lo_limit} <= MIN <= MAX <= "
                             f"{hi_limit} seconds, got {low} {high}")
        if not args.host_discovery_script:
            raise ValueError("--blacklist-cooldown-range applies to hosts a "
                             "--host-discovery-script lists; without one, a failed worker's "
                             "slot on this machine is retired, not blacklisted")


class ElasticJob(ProcessJob):
    """The driver's loop (Note [Elastic job rules]); run() returns when every worker is gone."""

    def __init__(self, output, *, command, env, book: HostBook, min_np, max_np, first_np,
                 publish, secret_hex, job_id, address, reset_limit=None, ssh_port=None,
                 ssh_identity=None, spans_machines=False, user_env_names=frozenset()):
        super().__init__(output)
        self.command, self.env, self.book = command, env, book
        self.min_np, self.max_np, self.first_np = min_np, max_np, first_np
        self.reset_limit = reset_limit
        self.publish = publish            # (key, bytes) -> None, into the rendezvous store
        self.secret_hex, self.job_id, self.address = secret_hex, job_id, address
        self.ssh_port, self.ssh_identity = ssh_port, ssh_identity
        self.user_env_names = user_env_names  # forwarded to remote workers (remote.py)
        self.spans_machines = spans_machines  # Note [Elastic jobs across machines]
        self._refused_hosts: set = set()
        self._keep: dict = {}             # wid -> fd keeping a remote worker alive (remote.py)
        self.workers: dict = {}
        self.generation = 0
        self.generation_times: list = []  # (generation, monotonic time published, size)
        self._events: list = []
        self._reset_asks: set = set()
        self._stopped: set = set()        # workers the driver removed (exits are not failures)
        self._finishing = False

    # -- events from other threads (rule D) ---------------------------------------------------
    def post(self, kind: str, payload) -> None:
        with self._lock:
            self._events.append((kind, payload))
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def on_store_set(self, key: str) -> None:
        m = re.fullmatch(re.escape(self.job_id) + r"/elastic/gen(\d+)/reset/(.+)", key)
        if m:
            self.post("reset", (int(m.group(1)), m.group(2)))

    def _dispatch(self, key) -> None:
        super()._dispatch(key)
        if key.data[0] == "wake":
            with self._lock:
                events, self._events = self._events, []
            for kind, payload in events:
                if self.result.failed is None and not self.result.interrupted:
                    self._on_event(kind, payload)

    def _on_event(self, kind, payload) -> None:
        if kind == "tick":
            back = self.book.resurrect()
            if back and not self._finishing:
                self.reform(f"{', '.join(back)} left the blacklist (cooldown over)",
                            only_if_changed=True)
        elif kind == "hosts" and self.book.update(self._reachable(payload)) \
                and not self._finishing:
            self.reform("the discovered hosts changed: " +
                        ",".join(f"{h}:{n}" for h, n in payload.items()), only_if_changed=True)
        elif kind == "reset":
            gen, wid = payload
            if gen == self.generation and not self._finishing:
                self._reset_asks.add(wid)
                ranked = {w.wid for w in self.workers.values() if w.running and w.rank is not None}
                if ranked <= self._reset_asks:
                    self.reform("every worker asked for a reset")
        elif kind == "note":
            self.output.note(payload)

    def _reachable(self, found: dict) -> dict:
        """Note [Elastic jobs across machines]: another machine's host, discovered only after a
        start on this machine alone, is left out (said once per host)."""
        if self.spans_machines:
            return found
        kept = {}
        for host, slots in found.items():
            if hostlib.is_local(host):
                kept[host] = slots
            elif host not in self._refused_hosts:
                self._refused_hosts.add(host)
                self.output.note(f"hvdrun: host {host} is another machine, but this elastic job "
                                 "started on this machine's hosts only (its workers listen on "
                                 "loopback), so it is left out; list a remote host in the "
                                 "discovery script's output from the start to span machines")
        return kept

    # -- ProcessJob hooks ---------------------------------------------------------------------
    def handle_line(self, key, stream: str, text: str) -> None:
        self.output.line(key, stream, text)

    def handle_exit(self, key, code: int) -> None:
        self._let_go(key)
        worker = self.workers[key]
        worker.running, worker.code = False, code
        if key in self._stopped or self.result.failed is not None or self.result.interrupted:
            return
        if code == 0:
            self._finishing = True  # rule C
            return
        self.output.note(f"hvdrun: worker {key} (rank {worker.rank} of generation "
                         f"{self.generation}) {describe_exit(code)}")
        self.book.failed(worker)
        if self._finishing:
            self.result.codes[key] = code
            return
        self.reform(f"worker {key} {describe_exit(code)}")

    # -- generations --------------------------------------------------------------------------
    def start_first(self) -> bool:
        cap = min(self.first_np or self.max_np, self.max_np)
        return self.reform("start", cap=cap)

    def reform(self, why: str, *, cap: int | None = None, only_if_changed=False) -> bool:
        plan = self.book.plan(list(self.workers.values()), cap or self.max_np)
        if only_if_changed and not plan.start and not plan.stop:
            return True
        size = len(plan.ranked) + len(plan.start)
        if size < self.min_np:
            self._fail(why, len(plan.ranked), size)
            return False
        if self.reset_limit is not None and self.generation > self.reset_limit:
            self._fail_reason(f"elastic job failed after {why}: it re-formed {self.reset_limit} "
                              f"time(s) already, the --reset-limit")
            return False
        for worker in plan.stop:
            self._stop_worker(worker)
        new = [Worker(f"{host}[{slot}]", host, slot) for host, slot in plan.start]
        ranked = plan.ranked + new
        self.generation += 1
        self._reset_asks = set()
        for worker in self.workers.values():
            worker.rank = None
        for rank, worker in enumerate(ranked):
            worker.rank = rank
        world = {"gen": self.generation, "size": size,
                 "ranks": {w.wid: w.rank for w in ranked}, "hosts": {w.wid: w.host for w in ranked}}
        self.publish(f"{self.job_id}/elastic/gen{self.generation}", json.dumps(world).encode())
        self.publish(f"{self.job_id}/elastic/latest", str(self.generation).encode())
        self.generation_times.append((self.generation, time.monotonic(), size))
        self.output.note(f"hvdrun: generation {self.generation}: {size} worker(s) "
                         f"({', '.join(w.wid for w in ranked)}) after {why}")
        for worker in new:
            if not self._start_worker(worker):
                return False
        return True

    def _fail(self, why: str, survivors: int, size: int) -> None:
        blacklisted = f"; blacklisted: {', '.join(sorted(self.book.blacklist))}" \
            if self.book.blacklist else ""
        self._fail_reason(f"elastic job failed after {why}: only {size} worker(s) could form "
                          f"the next generation ({survivors} still running), fewer than "
                          f"--min-np {self.min_np}{blacklisted}; add hosts or slots, or lower "
                          "--min-np")

    def _fail_reason(self, reason: str) -> None:
        self.result.failed = next((w.wid for w in self.workers.values()
                                   if w.code not in (None, 0)), "driver")
        self.result.reason = reason
        self._terminate_all()

    def _let_go(self, wid) -> None:
        """A remote worker's keep-alive pipe closes: its wrapper ends it (remote.py)."""
        fd = self._keep.pop(wid, None)
        if fd is not None:
            os.close(fd)

    def let_go_all(self) -> None:
        for wid in list(self._keep):
            self._let_go(wid)

    def _stop_worker(self, worker: Worker) -> None:
        self._stopped.add(worker.wid)
        self._let_go(worker.wid)
        child = self._children.get(worker.wid)
        if child is not None and not child.exited:
            try:
                os.killpg(child.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass

    def _start_worker(self, worker: Worker) -> bool:
        env = dict(self.env)
        local = hostlib.is_local(worker.host)
        port = self.address.rsplit(":", 1)[1]
        rendezvous = self.address if local else \
            f"{hostlib.address_toward([worker.host])}:{port}"  # where that host reaches us
        env.update(HVD_RENDEZVOUS=rendezvous, HVD_SECRET=self.secret_hex,
                   HVD_JOB_ID=self.job_id, HVD_ELASTIC_WORKER=worker.wid,
                   HVD_ELASTIC_GENERATION=str(self.generation), HVD_HOSTNAME=worker.host,
                   HOROVOD_HOSTNAME=worker.host, HVD_ELASTIC="1", HOROVOD_ELASTIC="1",
                   PYTHONUNBUFFERED="1")
        self.workers[worker.wid] = worker
        try:
            if local:
                config.share_threads(env, self._slots_here())
                self.add(worker.wid, spawn(self.command, env))
            else:
                proc, self._keep[worker.wid] = spawn_remote(
                    worker.host, self.command, env, os.getcwd(), self.ssh_port,
                    self.ssh_identity, self.user_env_names)
                self.add(worker.wid, proc)
        except OSError as exc:
            worker.running = False
            self.result.failed, self.result.reason = worker.wid, \
                f"cannot start {self.command[0]!r} for worker {worker.wid}: {exc}"
            self._terminate_all()
            return False
        return True

    def _slots_here(self) -> int:
        """Workers this machine may run at once: its hosts' discovered slots, up to max_np."""
        here = sum(n for host, n in self.book.slots.items() if hostlib.is_local(host))
        return min(self.max_np, max(1, here))

    def exit_code(self) -> int:
        if self.result.failed is not None:
            worker = self.workers.get(self.result.failed)
            code = worker.code if worker is not None else None
            return exit_status(code) if code not in (None, 0) else 1
        if self.result.interrupted:
            return 143 if "SIGTERM" in self.result.reason else 130
        last = [w for w in self.workers.values() if w.rank is not None and w.code != 0]
        return exit_status(last[0].code) if last else 0


def _discovery_loop(job: ElasticJob, script: str, slots_per_host, stop: threading.Event):
    last, reported = None, None
    while not stop.wait(_POLL_SECONDS):
        job.post("tick", None)  # blacklist cooldowns are checked on the loop thread (rule D)
        try:
            found = elastic_hosts.run_discovery(script, slots_per_host)
        except DiscoveryError as exc:
            if str(exc) != reported:
                job.post("note", f"hvdrun: {exc} (keeping the previous hosts)")
                reported = str(exc)
            continue
        reported = None
        if found != last:
            last = found
            job.post("hosts", found)


def _initial_hosts(args, output) -> dict | None:
    """Hosts to start with; waits (polling the script) for --min-np slots, at most
    --elastic-timeout seconds."""
    if not args.host_discovery_script:
        return {"localhost": args.max_np}
    deadline = time.monotonic() + args.elastic_timeout
    while True:
        try:
            found = elastic_hosts.run_discovery(args.host_discovery_script, args.slots_per_host)
            if sum(found.values()) >= args.min_np:
                return found
            why = f"{sum(found.values())} slot(s) discovered, --min-np is {args.min_np}"
        except DiscoveryError as exc:
            why = str(exc)
        if time.monotonic() >= deadline:
            output.note(f"hvdrun: elastic job could not start within --elastic-timeout "
                        f"{args.elastic_timeout:g} s: {why}")
            return None
        time.sleep(_POLL_SECONDS)


def run_elastic(args, command, env, output, install_signals) -> int:
    """Run ``command`` as an elastic job (Note [Elastic job rules]); returns the exit status."""
    from engine_native.rendezvous import RendezvousClient, RendezvousServer

    hosts = _initial_hosts(args, output)
    if hosts is None:
        return 1
    secret, job_id = secrets.token_bytes(32), uuid.uuid4().hex[:12]
    book = HostBook(slots=hosts, blacklisting=bool(args.host_discovery_script),
                    cooldown=tuple(getattr(args, "blacklist_cooldown_range", None) or ()) or None)
    holder: list = []
    # Note [Elastic jobs across machines]: the store listens where the other machines reach
    # it, or on loopback only when the job stays on this machine.
    spans = any(not hostlib.is_local(h) for h in hosts)
    local_ip = hostlib.address_toward(list(hosts)) if spans else "127.0.0.1"
    server = RendezvousServer(secret, host=local_ip,
                              on_set=lambda key: holder and holder[0].on_store_set(key))
    stop = threading.Event()
    with server:
        address = f"{local_ip}:{server.address[1]}"
        client = RendezvousClient(address, secret)
        job = ElasticJob(output, command=command, env=env, book=book, min_np=args.min_np,
                         max_np=args.max_np, first_np=args.np, publish=client.set,
                         secret_hex=secret.hex(), job_id=job_id, address=address,
                         reset_limit=args.reset_limit,
                         ssh_port=getattr(args, "ssh_port", None),
                         ssh_identity=getattr(args, "ssh_identity_file", None),
                         spans_machines=spans,
                         user_env_names=frozenset(config.parse_env_pairs(args.env)))
        holder.append(job)
        install_signals(job)
        if args.host_discovery_script:
            threading.Thread(target=_discovery_loop, daemon=True, name="hvd-elastic-discovery",
                             args=(job, args.host_discovery_script, args.slots_per_host,
                                   stop)).start()
        try:
            job.start_first()
            job.run()
        finally:
            stop.set()
            job.let_go_all()
            client.close()
    if job.result.failed is not None or job.result.interrupted:
        output.note(f"hvdrun: {job.result.reason}.")
    return job.exit_code()
