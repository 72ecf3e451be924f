"""Who is who and where to connect: rank discovery and address exchange (DESIGN §4).

Order: explicit arguments, then MPI (mpi4py COMM_WORLD, when the process was started by
mpiexec), then the environment (``HVD_*``, ``HOROVOD_*``, ``OMPI_COMM_WORLD_*``, ``PMI_*``).
Addresses travel through MPI when present, otherwise through the authenticated rendezvous
store (``HVD_RENDEZVOUS=host:port`` + ``HVD_SECRET``) that the launcher runs.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import secrets
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional

from . import _core

_MPI_LAUNCH_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID",
                    "HYDI_CONTROL_FD")
_RANK_VARS = ("HVD_RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_SIZE_VARS = ("HVD_SIZE", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")

_init_count = 0  # inits in this process: scopes rendezvous keys so re-init never reads stale ones


@dataclass
class World:
    rank: int
    size: int
    host_ids: list = field(default_factory=list)
    local_rank: int = 0
    local_size: int = 1
    cross_rank: int = 0
    cross_size: int = 1
    source: str = "single"  # args | mpi | env | single
    listen_address: tuple = ("", 0)


def _first_env(names) -> Optional[str]:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return value
    return None


def _env_int(names, what: str) -> Optional[int]:
    value = _first_env(names)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"init(): {what} from the environment is not an integer: {value!r}")


def _launched_by_mpiexec() -> bool:
    return any(name in os.environ for name in _MPI_LAUNCH_VARS)


def _mpi_comm(comm):
    if comm is not None:
        if isinstance(comm, (list, tuple)):
            raise ValueError("init(comm=[...]): a list of ranks is not supported; pass an mpi4py "
                             "communicator or use add_process_set() after init()")
        return comm
    if not _launched_by_mpiexec() or "HVD_RANK" in os.environ:
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD


def host_id() -> str:
    """This rank's host identity; ``HVD_HOSTNAME`` overrides it (tests make 'hosts' this way)."""
    return os.environ.get("HVD_HOSTNAME") or socket.gethostname()


def machine_id() -> str:
    """The kernel this rank runs on, a digest of its boot id (the real host name where the
    boot id cannot be read): ranks of fake hosts or of containers on one node may share its
    CPUs, whatever their host names (Note [Yielding spins] in mesh.cc)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot_id = f.read().strip()
    except OSError:
        boot_id = b""
    return hashlib.sha256(boot_id).hexdigest()[:16] if boot_id else "host:" + socket.gethostname()


def pid_namespace() -> str:
    """This process's pid namespace ("pid:[inode]", "" where it cannot be read): ranks of one
    kernel in different containers share machine_id but not pids, and the core reads a peer's
    process state by pid only where both match (runtime/stopped_ranks.h)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _peer_entry(address: str, port: int) -> tuple:
    """This rank's line in the table every rank passes to the core (transport::PeerInfo)."""
    return (host_id(), address, port, os.getpid(), machine_id(), _core.process_cpus(),
            pid_namespace())


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _routable_address(toward: str) -> str:
    """The local address the kernel would use to reach ``toward`` (no packet is sent)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((toward, 9))
        return probe.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())
    finally:
        probe.close()


def _toward_peers(hosts: list) -> Optional[str]:
    """Note [Advertised address]: a node with several NICs (an uplink holding the default
    route, a cluster network between the nodes) must advertise the address its peers reach it
    at, which is the source address of the route toward a peer, not toward the internet. The
    first other host name that resolves to a non-loopback address (``-H`` names, hostnames)
    is that peer; None when there is none (fake hosts such as ``HVD_HOSTNAME=hostA`` or
    loopback aliases on one machine): then the default route decides, as before."""
    me = host_id()
    for host in dict.fromkeys(hosts):
        if host == me:
            continue
        try:
            found = socket.getaddrinfo(host, None, socket.AF_INET)
        except (OSError, UnicodeError):
            continue
        if not any(ipaddress.ip_address(info[4][0]).is_loopback for info in found):
            return found[0][4][0]
    return None


def _bind_address(single_host: bool, toward: Optional[str]) -> tuple[str, str]:
    """(address to bind, address to advertise). Loopback whenever the whole job is local."""
    chosen = os.environ.get("HVD_IFACE_ADDRESS")
    if chosen:
        return chosen, chosen
    if single_host or (toward is not None and _is_loopback(toward)):
        return "127.0.0.1", "127.0.0.1"
    advertised = _routable_address(toward or "8.8.8.8")
    return advertised, advertised


def _topology(world: World, hosts: list) -> None:
    world.host_ids = hosts
    same_host = [r for r in range(world.size) if hosts[r] == hosts[world.rank]]
    world.local_rank = same_host.index(world.rank)
    world.local_size = len(same_host)
    local_ranks = [sum(1 for q in range(r) if hosts[q] == hosts[r]) for r in range(world.size)]
    cross = [r for r in range(world.size) if local_ranks[r] == world.local_rank]
    world.cross_rank = cross.index(world.rank)
    world.cross_size = len(cross)


def _connect(world: World, peers: list, secret: bytes, job_id: str) -> None:
    _core.init(world.rank, peers, secret, job_id)
    _topology(world, [p[0] for p in peers])


def _init_mpi(comm) -> World:
    world = World(rank=comm.Get_rank(), size=comm.Get_size(), source="mpi")
    hosts = comm.allgather(host_id())
    bind, advertised = _bind_address(len(set(hosts)) == 1, _toward_peers(hosts))
    port = _core.listen(bind)
    world.listen_address = (advertised, port)
    secret, job_id = comm.bcast((secrets.token_bytes(32), uuid.uuid4().hex[:12]), root=0)
    peers = comm.allgather(_peer_entry(advertised, port))
    _connect(world, [tuple(p) for p in peers], secret, f"{job_id}-{_init_count}")
    return world


def _init_rendezvous(rank: int, size: int, rendezvous: Optional[str],
                     secret_hex: Optional[str], job_id: Optional[str], source: str,
                     scope: Optional[str] = None, abandon=None) -> World:
    world = World(rank=rank, size=size, source=source)
    if not 0 <= rank < size:
        raise ValueError(f"init(): rank {rank} is outside [0, {size})")
    if size == 1:
        port = _core.listen("127.0.0.1")
        world.listen_address = ("127.0.0.1", port)
        _connect(world, [_peer_entry("127.0.0.1", port)], secrets.token_bytes(32),
                 f"{uuid.uuid4().hex[:12]}-{_init_count}")
        return world
    if not rendezvous or not secret_hex:
        raise ValueError(
            f"init(): rank {rank} of {size} needs a rendezvous to find its peers; set "
            "HVD_RENDEZVOUS=host:port and HVD_SECRET (hvdrun and %hvd_start do this), or start "
            "the ranks with mpiexec and install mpi4py")
    from .rendezvous import RendezvousClient

    secret = bytes.fromhex(secret_hex)
    job = job_id or "job"
    bind, advertised = _bind_address(False, rendezvous.rsplit(":", 1)[0])
    port = _core.listen(bind)
    world.listen_address = (advertised, port)
    # Elastic workers join a generation with different init counts: the scope names the world.
    core_job = scope.replace("/", "-") if scope else f"{job}-{_init_count}"
    scope = scope or f"{job}/init{_init_count}"
    timeout = float(os.environ.get("HVD_START_TIMEOUT", "60"))
    with RendezvousClient(rendezvous, secret) as client:
        me = _peer_entry(advertised, port)
        client.set(f"{scope}/{rank}", json.dumps(me).encode())
        values = _wait_peers(client, [f"{scope}/{r}" for r in range(size)], timeout, abandon)
    peers = [tuple(json.loads(v)) for v in values]
    _connect(world, peers, secret, core_job)
    return world


def _wait_peers(client, keys: list, timeout: float, abandon) -> list:
    """Every peer's address; with ``abandon`` (elastic), give up as soon as it says the world
    being formed was replaced (Note [Joining a generation] in elastic_world)."""
    if abandon is None:
        return client.wait_all(keys, timeout=timeout)
    from .elastic_world import Superseded

    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.wait_all(keys, timeout=max(0.0, min(0.5, deadline - time.monotonic())))
        except TimeoutError as exc:
            if abandon():
                raise Superseded() from None
            if time.monotonic() >= deadline:
                raise TimeoutError(f"elastic bootstrap: not every rank of the new world arrived "
                                   f"within HVD_START_TIMEOUT ({timeout:g} s): {exc}") from None


def _init_elastic(rendezvous, secret_hex, job_id) -> World:
    from . import elastic_world

    def connect(rank, size, scope, abandon):
        return _init_rendezvous(rank, size, rendezvous, secret_hex, job_id, "elastic",
                                scope=scope, abandon=abandon)
    return elastic_world.join(connect)


def bootstrap(comm=None, rank: Optional[int] = None, size: Optional[int] = None,
              rendezvous: Optional[str] = None, secret: Optional[str] = None,
              job_id: Optional[str] = None) -> World:
    """Find this rank's place in the job, connect the core to every peer, return the World."""
    global _init_count
    _init_count += 1
    rendezvous = rendezvous or os.environ.get("HVD_RENDEZVOUS") or _horovod_rendezvous()
    secret = secret or os.environ.get("HVD_SECRET")
    job_id = job_id or os.environ.get("HVD_JOB_ID")
    if rank is not None or size is not None:
        if rank is None or size is None:
            raise ValueError("init(): pass both rank and size, or neither")
        return _init_rendezvous(rank, size, rendezvous, secret, job_id, "args")
    if os.environ.get("HVD_ELASTIC_WORKER"):
        return _init_elastic(rendezvous, secret, job_id)
    mpi = _mpi_comm(comm)
    if mpi is not None:
        return _init_mpi(mpi)
    env_rank = _env_int(_RANK_VARS, "rank")
    env_size = _env_int(_SIZE_VARS, "size")
    if env_rank is not None and env_size is not None:
        return _init_rendezvous(env_rank, env_size, rendezvous, secret, job_id, "env")
    return _init_rendezvous(0, 1, None, None, None, "single")


def _horovod_rendezvous() -> Optional[str]:
    addr = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    return f"{addr}:{port}" if addr and port else None
