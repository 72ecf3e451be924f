"""Host lists: ``-H host1:2,host2:4`` and hostfiles, and which rank goes where.

Ranks fill hosts in the order given, ``slots`` at a time (mpirun's ``-map-by slot``), so rank
``r`` on host ``h`` has local rank ``r - first rank on h``. A host is *local* when its name
resolves to this machine (``localhost``, ``127.0.0.1``, this machine's name or one of its
addresses): local hosts are started as plain child processes, anything else needs mpiexec.
Several local names (``-H localhost:2,127.0.0.1:1``) make several "hosts" on this machine:
each rank then gets ``HVD_HOSTNAME`` = its host's name, which exercises the multi-host paths
(local/cross ranks, TCP between hosts, hierarchical allreduce) on one machine.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Host",
    "Slot",
    "address_toward",
    "assign",
    "is_local",
    "local_hosts",
    "only_loopback",
    "parse_hosts",
    "read_hostfile",
    "slots_of",
]


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


@dataclass(frozen=True)
class Slot:
    """Where one rank runs: its host and its place there and across hosts."""
    rank: int
    host: str
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def parse_hosts(spec: str) -> list:
    """``"a:2,b:4"`` → ``[Host("a", 2), Host("b", 4)]``; a host without ``:slots`` has 1 slot."""
    hosts = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        name, sep, slots = item.rpartition(":")
        if not sep or "]" in slots:  # "host" or a bare IPv6 address "[::1]"
            name, slots = item, "1"
        name = name.strip("[]")
        if not name or not slots.isdigit() or int(slots) < 1:
            raise ValueError(f"host list {spec!r}: expected host:slots with slots >= 1, "
                             f"got {item!r}")
        hosts.append(Host(name, int(slots)))
    if not hosts:
        raise ValueError(f"host list {spec!r} names no host")
    names = [h.name for h in hosts]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"host list {spec!r} names {', '.join(dup)} more than once; "
                         "give each host once with its total slots")
    return hosts


def read_hostfile(path: str) -> list:
    """A hostfile in mpirun's format: ``host slots=N`` (or ``host:N``) lines, ``#`` comments."""
    items = []
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            name, slots = parts[0], "1"
            for extra in parts[1:]:
                key, _, value = extra.partition("=")
                if key == "slots":
                    slots = value
            if ":" in name and len(parts) == 1 and not name.startswith("["):
                name, slots = name.rsplit(":", 1)
            if not slots.isdigit():
                raise ValueError(f"{path}:{lineno}: bad slots in {line!r}")
            items.append(f"{name}:{slots}")
    return parse_hosts(",".join(items))


def assign(np: int, hosts: Sequence[Host] | None) -> list:
    """One :class:`Slot` per rank: ranks fill ``hosts`` in order (all local when None)."""
    if np < 1:
        raise ValueError(f"number of processes must be >= 1, got {np}")
    if not hosts:
        hosts = [Host("localhost", np)]
    total = sum(h.slots for h in hosts)
    if np > total:
        listing = ",".join(f"{h.name}:{h.slots}" for h in hosts)
        raise ValueError(f"-np {np} needs {np} slots but the host list {listing} has {total}; "
                         "add hosts or slots (host:slots), or lower -np")
    per_host = []
    left = np
    for h in hosts:
        take = min(h.slots, left)
        if take:
            per_host.append((h.name, take))
        left -= take
    cross_sizes = [sum(1 for _, n in per_host if n > i) for i in range(max(n for _, n in per_host))]
    slots, rank = [], 0
    for index, (name, count) in enumerate(per_host):
        for local in range(count):
            cross_rank = sum(1 for _, n in per_host[:index] if n > local)
            slots.append(Slot(rank, name, local, count, cross_rank, cross_sizes[local]))
            rank += 1
    return slots


def slots_of(host_per_rank: Sequence[str]) -> list:
    """The :class:`Slot` of every rank when rank ``r`` runs on ``host_per_rank[r]`` (Spark tasks
    land where the scheduler puts them, not host by host). Local ranks count in rank order on
    each host; cross ranks in rank order among equal local ranks, as the core's bootstrap does."""
    hosts = list(host_per_rank)
    locals_ = [hosts[:r].count(h) for r, h in enumerate(hosts)]
    slots = []
    for rank, host in enumerate(hosts):
        same_local = [q for q in range(len(hosts)) if locals_[q] == locals_[rank]]
        slots.append(Slot(rank, host, locals_[rank], hosts.count(host),
                          same_local.index(rank), len(same_local)))
    return slots


def _own_addresses() -> set:
    found = {"127.0.0.1", "::1"}
    for name in {socket.gethostname(), socket.getfqdn()}:
        try:
            found.update(info[4][0] for info in socket.getaddrinfo(name, None))
        except OSError:
            pass
    return found


_OWN: set | None = None


def is_local(name: str) -> bool:
    """True when ``name`` is this machine (loopback, its hostname, or one of its addresses)."""
    global _OWN
    if name in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        if ipaddress.ip_address(name).is_loopback:
            return True
    except ValueError:
        pass
    if _OWN is None:
        _OWN = _own_addresses()
    if name in _OWN:
        return True
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except OSError:
        return False
    return any(ipaddress.ip_address(a.split("%")[0]).is_loopback or a in _OWN for a in addrs)


def address_toward(names: Sequence[str]) -> str:
    """The address ranks on ``names`` reach this machine at: the source address of the route
    toward the first of them that is another machine (Note [Advertised address] in
    engine_native/bootstrap.py: not the default route's, which may be an uplink the other
    hosts cannot reach), else the default route's."""
    toward = next((n for n in names if not is_local(n)), None) or "192.0.2.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((toward, 9))  # no packet is sent; the kernel picks the interface
        return probe.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())
    finally:
        probe.close()


def local_hosts(hosts: Sequence[Host] | None) -> bool:
    """True when every host of the list is this machine (no list at all counts as local)."""
    return not hosts or all(is_local(h.name) for h in hosts)


def only_loopback(hosts: Sequence[Host] | None) -> bool:
    """True when every host name is a loopback alias (a test's fake multi-host on one machine)."""
    def loop(name: str) -> bool:
        if name == "localhost":
            return True
        try:
            return ipaddress.ip_address(name).is_loopback
        except ValueError:
            return False
    return not hosts or all(loop(h.name) for h in hosts)

