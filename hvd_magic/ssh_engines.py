"""``%hvd_start --launcher ssh --hosts a:2,b:2``: engines on other hosts through ipyparallel's
SSH engine launcher (``SSHEngineSetLauncher``), ranks filling the hosts in order.

What ipyparallel needs, and what this module sets:

- ``engines``: ``{host: count}`` from the host list, filled in order as ``hvdrun -H`` does
  (hvd_magic.launch.hosts.assign), so ``-n`` may be below the slots;
- ``remote_python``: this Python (ipyparallel's default is ``python3`` on the remote PATH,
  which lacks this environment's packages); the hosts must have it at the same path, as on a
  shared file system or identical images;
- the controller listens on the interface toward the hosts (``controller_ip``, set by the
  cluster: hvd_magic.launch.hosts.address_toward), the address engines connect to.

ssh itself is configured as users do (``~/.ssh/config``: keys, ports): the launcher runs
``ssh host ...`` and ``scp`` for the connection file.
"""

from __future__ import annotations

import sys
from collections import Counter

from .errors import StartError
from .launch import hosts as hostlib


def parse(spec: str | None, n: int, launcher: str) -> list | None:
    """The host list of ``--hosts`` (None without it); StartError with the fix when it does not
    fit the launcher or ``-n``."""
    if spec is None:
        if launcher == "ssh":
            raise StartError("--launcher ssh needs the hosts and their slots, e.g. "
                             "%hvd_start -n 4 --launcher ssh --hosts node1:2,node2:2")
        return None
    if launcher != "ssh":
        raise StartError(f"--hosts is for --launcher ssh (got --launcher {launcher}); "
                         f"other launchers place engines themselves (mpi: a hostfile in "
                         f"--env, slurm/pbs: the allocation)")
    try:
        return hostlib.assign(n, hostlib.parse_hosts(spec))
    except ValueError as exc:
        raise StartError(f"--hosts: {exc}") from None


def config(slots: list):
    """The traitlets config for ``ipyparallel.Cluster`` that starts one engine per slot."""
    from traitlets.config import Config

    cfg = Config()
    cfg.SSHEngineSetLauncher.engines = dict(Counter(s.host for s in slots))
    cfg.SSHEngineSetLauncher.remote_python = sys.executable
    return cfg


def rank_order(engine_ids: list[int], by_engine: dict, slots: list) -> list[int]:
    """Engines in rank order: the hosts' order in ``--hosts`` (an engine reports its host
    name; one not in the list goes last), then registration order within a host."""
    order = {s.host: i for i, s in reversed(list(enumerate(slots)))}
    return sorted(engine_ids, key=lambda e: (order.get(by_engine[e]["host"], len(slots)), e))
