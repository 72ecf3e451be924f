"""Hosts made of network namespaces, each with its own address and its own sshd (issue #21).

:func:`namespace_hosts` makes hosts ``a`` and ``b`` (more on request):

A. A namespace per host (``ip netns add``), loopback up, and one veth pair per host into a
   bridge namespace (the "switch"), so each host has its own network stack and address
   (10.231.0.1, .2, ...), plus an "uplink" NIC with the default route (10.232.0.x:
   where nothing answers). Traffic goes only between these addresses and loopback.
B. Name resolution: ``/etc/netns/<ns>/hosts``, which ``ip netns exec`` mounts over
   ``/etc/hosts`` in that namespace; and a host name of its own: everything on a host runs
   in a UTS namespace whose hostname is the host's name (``unshare --uts``), as on a node.
C. A key pair made for this run, an sshd per host on port 2222 that accepts only that key
   (``ip netns exec <ns> sshd -D``), and ``ssh`` / ``scp`` on ``PATH`` that use the key and
   the port (what a user's ``~/.ssh/config`` does): hydra's and ipyparallel's ssh launchers
   find them there.
D. Teardown, whatever happened: the daemons and every process still in a namespace are
   killed, the namespaces and their /etc/netns folders removed; namespaces a killed run left
   behind (its pid gone) are removed before new ones are made.

Run a command on a host with :meth:`NamespaceHosts.run` (``ip netns exec``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

SSH_PORT = 2222
SUBNET = "10.231.0"
UPLINK = "10.232.0"

SSHD_CONFIG = """\
Port {port}
ListenAddress {address}
HostKey {dir}/host_key
AuthorizedKeysFile {dir}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile {dir}/sshd-{name}.pid
AcceptEnv *
PermitUserEnvironment no
MaxStartups 100
Subsystem sftp /usr/lib/openssh/sftp-server
MaxSessions 100
LogLevel ERROR
"""

SSH_CONFIG = """\
Host *
    Port {port}
    IdentityFile {dir}/id_ed25519
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    BatchMode yes
    ConnectTimeout 10
    LogLevel ERROR
    ControlMaster auto
    ControlPath {dir}/cm-%C
    ControlPersist 60
"""


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


@dataclass
class NamespaceHosts:
    """What :func:`namespace_hosts` made: host name → namespace and address, the key folder,
    and ``env`` for commands (``PATH`` with the configured ``ssh`` first)."""
    tag: str
    dir: str
    names: list
    namespaces: dict = field(default_factory=dict)
    addresses: dict = field(default_factory=dict)
    daemons: list = field(default_factory=list)
    env: dict = field(default_factory=dict)

    def on(self, host: str, cmd) -> list:
        """The command line that runs ``cmd`` (a list) on ``host``: its network namespace,
        its hostname."""
        return ["ip", "netns", "exec", self.namespaces[host], "unshare", "--uts", "sh", "-c",
                f'hostname {host} && exec "$@"', "on-host", *cmd]

    def run(self, host: str, cmd, timeout: float, **kwargs) -> subprocess.CompletedProcess:
        """``cmd`` (a list) on ``host``; output captured as text."""
        return subprocess.run(self.on(host, cmd), capture_output=True, text=True, check=False,
                              timeout=timeout, env=kwargs.pop("env", self.env), **kwargs)


def _make_network(hosts: NamespaceHosts) -> None:
    bridge_ns = f"{hosts.tag}sw"
    _sh("ip", "netns", "add", bridge_ns)
    hosts.namespaces["_switch"] = bridge_ns
    _sh("ip", "-n", bridge_ns, "link", "add", "br0", "type", "bridge")
    _sh("ip", "-n", bridge_ns, "link", "set", "br0", "up")
    for i, name in enumerate(hosts.names, 1):
        ns, address = f"{hosts.tag}{name}", f"{SUBNET}.{i}"
        _sh("ip", "netns", "add", ns)
        hosts.namespaces[name], hosts.addresses[name] = ns, address
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth",
            "peer", "name", f"p{name}", "netns", bridge_ns)
        _sh("ip", "-n", bridge_ns, "link", "set", f"p{name}", "master", "br0", "up")
        _sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _sh("ip", "-n", ns, "link", "set", "eth0", "up")
        # A second NIC holding the default route, as a node's uplink (a veth whose other end
        # sits unbridged in the switch namespace: packets sent there go nowhere). Ranks must
        # advertise the address peers reach them at (eth0), not the default route's.
        _sh("ip", "link", "add", "uplink0", "netns", ns, "type", "veth",
            "peer", "name", f"u{name}", "netns", bridge_ns)
        _sh("ip", "-n", bridge_ns, "link", "set", f"u{name}", "up")
        _sh("ip", "-n", ns, "addr", "add", f"{UPLINK}.{i}/24", "dev", "uplink0")
        _sh("ip", "-n", ns, "link", "set", "uplink0", "up")
        _sh("ip", "-n", ns, "route", "add", "default", "via", f"{UPLINK}.254", "dev", "uplink0")


def _write_hosts_files(hosts: NamespaceHosts) -> None:
    table = "".join(f"{addr} {name}\n" for name, addr in hosts.addresses.items())
    for name in hosts.names:
        folder = f"/etc/netns/{hosts.namespaces[name]}"
        os.makedirs(folder, exist_ok=True)
        with open(f"{folder}/hosts", "w") as fh:
            fh.write(f"127.0.0.1 localhost\n{table}")


def _keys_and_ssh(hosts: NamespaceHosts) -> None:
    d = hosts.dir
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/id_ed25519")
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/host_key")
    shutil.copy(f"{d}/id_ed25519.pub", f"{d}/authorized_keys")
    with open(f"{d}/ssh_config", "w") as fh:
        fh.write(SSH_CONFIG.format(port=SSH_PORT, dir=d))
    bindir = os.path.join(d, "bin")
    os.makedirs(bindir)
    for tool in ("ssh", "scp"):  # scp: ipyparallel's SSH launcher sends connection files
        with open(f"{bindir}/{tool}", "w") as fh:
            fh.write(f"#!/bin/sh\nexec {shutil.which(tool)} -F {d}/ssh_config \"$@\"\n")
        os.chmod(f"{bindir}/{tool}", 0o755)
    hosts.env = dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '')}")


def _start_sshd(hosts: NamespaceHosts, timeout: float = 20.0) -> None:
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    for name in hosts.names:
        cfg = f"{hosts.dir}/sshd_{name}.conf"
        with open(cfg, "w") as fh:
            fh.write(SSHD_CONFIG.format(port=SSH_PORT, address=hosts.addresses[name],
                                        dir=hosts.dir, name=name))
        with open(f"{hosts.dir}/sshd_{name}.log", "w") as log:  # the daemon keeps its copy
            hosts.daemons.append(subprocess.Popen(
                hosts.on(name, ["/usr/sbin/sshd", "-D", "-e", "-f", cfg]), stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + timeout
    for name in hosts.names:  # ready when `ssh host true` works from the other namespace
        other = next((n for n in hosts.names if n != name), name)
        while True:
            res = hosts.run(other, ["ssh", name, "true"], timeout=timeout)
            if res.returncode == 0:
                break
            if time.monotonic() > deadline:
                with open(f"{hosts.dir}/sshd_{name}.log") as fh:
                    raise RuntimeError(f"sshd on host {name} never answered: {res.stderr}"
                                       f"{fh.read()[-2000:]}")
            time.sleep(0.2)


def _pids_in(ns: str) -> list:
    res = _sh("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in res.stdout.split()]


def _teardown(hosts: NamespaceHosts) -> None:
    for daemon in hosts.daemons:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.pid, signal.SIGTERM)
    for daemon in hosts.daemons:
        with contextlib.suppress(subprocess.TimeoutExpired):
            daemon.wait(5)
    for ns in hosts.namespaces.values():
        for pid in _pids_in(ns):  # ranks, proxies, sessions still inside
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _sh("ip", "netns", "delete", ns, check=False)
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
    shutil.rmtree(hosts.dir, ignore_errors=True)


_OURS = re.compile(r"^hvd(\d+)n[a-z0-9]+$")


def remove_stale() -> list:
    """Namespaces (and their daemons) left by a run that was killed before its teardown:
    ours are named ``hvd<pid>n<host>``; those whose pid is gone are removed."""
    gone = []
    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        m = _OURS.match(ns)
        if not m or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        for pid in _pids_in(ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _sh("ip", "netns", "delete", ns, check=False)
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        gone.append(ns)
    return gone


@contextlib.contextmanager
def namespace_hosts(names=("a", "b")):
    """Steps A-D; yields a :class:`NamespaceHosts`."""
    remove_stale()
    tag = f"hvd{os.getpid()}n"
    hosts = NamespaceHosts(tag=tag, dir=tempfile.mkdtemp(prefix=f"{tag}-ssh-"), names=list(names))
    try:
        _make_network(hosts)
        _write_hosts_files(hosts)
        _keys_and_ssh(hosts)
        _start_sshd(hosts)
        yield hosts
    finally:
        _teardown(hosts)
