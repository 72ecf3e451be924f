"""Hosts of an elastic job (``hvdrun --min-np/--max-np``): discovery, blacklist, and the plan of
the next generation. Plain data and functions, used by the driver's loop thread
(``elastic_driver``) and its discovery thread.

Horovod's meaning, kept here:

- ``--host-discovery-script S``: an executable printing one ``host`` or ``host:slots`` per line;
  ``host`` alone has ``--slots-per-host`` slots. Its output is the current set of hosts; a host
  that disappears is removed (its workers stop), a new host or new slots are added.
- Without a script: ``localhost`` with ``--max-np`` slots.
- A host where a worker failed is blacklisted: none of its slots is used again and its other
  workers leave the job — for good, or with ``--blacklist-cooldown-range MIN MAX`` until a
  cooldown ends: ``MIN·2^k + U(0,1)·MIN`` seconds at the host's k-th blacklisting, kept within
  ``[MIN, MAX]`` (a failure during the cooldown does not extend it); then the host is used
  again while discovery lists it. Exception: without a discovery script the only host is this machine,
  and blacklisting it would end every job at its first failure, so there only the failed
  worker's slot is retired (Horovod ends such a job instead).
"""
from __future__ import annotations

import random
import subprocess
import time
from dataclasses import dataclass, field

COOLDOWN_LIMITS = (1, 3600)  # seconds: Horovod's bounds for --blacklist-cooldown-range


class DiscoveryError(RuntimeError):
    """The discovery script failed or printed something that is not a host list."""


def parse_discovery(text: str, slots_per_host: int | None) -> dict:
    """``"a:2\\nb\\n"`` → ``{"a": 2, "b": slots_per_host}`` (order kept)."""
    found: dict = {}
    for line in (raw.strip() for raw in text.splitlines()):
        if not line or line.startswith("#"):
            continue
        name, sep, slots = line.rpartition(":")
        if not sep:
            name, slots = line, ""
        if slots == "":
            if slots_per_host is None:
                raise DiscoveryError(f"host discovery: {line!r} has no slot count; print "
                                     "host:slots or pass --slots-per-host")
            count = slots_per_host
        elif slots.isdigit() and int(slots) >= 1:
            count = int(slots)
        else:
            raise DiscoveryError(f"host discovery: expected host or host:slots, got {line!r}")
        found[name] = count
    return found


def run_discovery(script: str, slots_per_host: int | None, timeout: float = 10.0) -> dict:
    try:
        done = subprocess.run([script], capture_output=True, text=True, timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DiscoveryError(f"host discovery script {script!r} failed: {exc}") from None
    if done.returncode != 0:
        raise DiscoveryError(f"host discovery script {script!r} exited with code "
                             f"{done.returncode}: {done.stderr.strip()[-300:]}")
    return parse_discovery(done.stdout, slots_per_host)


@dataclass
class Worker:
    wid: str
    host: str
    slot: int              # index of its slot on the host (never reused once failed)
    rank: int | None = None
    running: bool = True
    code: int | None = None


@dataclass
class Plan:
    """The next generation: who stays (in rank order), who starts, who must stop."""
    ranked: list = field(default_factory=list)   # Worker, rank = index
    start: list = field(default_factory=list)    # (host, slot) to start
    stop: list = field(default_factory=list)     # Worker to stop (host removed/blacklisted)


@dataclass
class HostBook:
    """What the driver knows about hosts: discovered slots (in first-seen order), the
    blacklist, and the slots retired on hosts that are not blacklisted."""
    slots: dict = field(default_factory=dict)
    blacklist: set = field(default_factory=set)
    retired: set = field(default_factory=set)    # (host, slot)
    blacklisting: bool = True
    cooldown: tuple | None = None                # (MIN, MAX) seconds, or blacklisted for good
    until: dict = field(default_factory=dict)    # host -> clock() when its cooldown ends
    strikes: dict = field(default_factory=dict)  # host -> times it was blacklisted
    clock: object = time.monotonic
    jitter: object = random.random

    def update(self, discovered: dict) -> bool:
        """Take a new discovery result; True when it changed the hosts or their slots."""
        changed = discovered != self.slots
        self.slots = dict(discovered)
        return changed

    def failed(self, worker: Worker) -> None:
        if not self.blacklisting:
            self.retired.add((worker.host, worker.slot))
            return
        self.blacklist.add(worker.host)
        now = self.clock()
        if self.cooldown is None or self.until.get(worker.host, 0) > now:
            return
        low, high = self.cooldown
        strikes = self.strikes[worker.host] = self.strikes.get(worker.host, 0) + 1
        delay = low * (1 << min(strikes, 30)) + self.jitter() * low
        self.until[worker.host] = now + max(low, min(high, delay))

    def resurrect(self) -> list:
        """Hosts whose cooldown ended, taken off the blacklist (in first-seen order)."""
        now = self.clock()
        back = [h for h, end in self.until.items() if end <= now]
        for host in back:
            del self.until[host]
            self.blacklist.discard(host)
        return back

    def plan(self, workers: list, max_np: int) -> Plan:
        """Survivors keep their relative order (the lowest surviving rank becomes rank 0 and
        its state is everybody's); free slots of usable hosts fill up to ``max_np``."""
        usable = [h for h in self.slots if h not in self.blacklist]
        plan = Plan()
        running = sorted((w for w in workers if w.running),
                         key=lambda w: (w.rank is None, w.rank if w.rank is not None else 0))
        used: dict = {}
        for w in running:
            fits = w.host in usable and w.slot < self.slots[w.host]
            if fits and len(plan.ranked) < max_np:
                plan.ranked.append(w)
                used.setdefault(w.host, set()).add(w.slot)
            else:
                plan.stop.append(w)
        for host in usable:
            for slot in range(self.slots[host]):
                if len(plan.ranked) + len(plan.start) >= max_np:
                    return plan
                if slot not in used.get(host, ()) and (host, slot) not in self.retired \
                        and not any(w.running and w.host == host and w.slot == slot
                                    for w in workers):
                    plan.start.append((host, slot))
        return plan
