"""Ranks on several hosts through mpiexec (MPICH's hydra or Open MPI's mpirun).

The launcher builds one MPMD command with a segment per host, so every rank of a host gets
``HVD_HOSTNAME`` = that host's name from ``-H``, and wraps each rank in
``python -m hvd_magic.launch.rankwrap`` (see there): the wrapper tags every output line with
the rank and reports the rank's exit code as a ``[r]<exit>:code`` line. :class:`MpiJob` reads
mpiexec's output, hands tagged lines to the same :class:`RankOutput` as local ranks, and on the
first failing rank stops mpiexec (SIGTERM to its process group: mpiexec then signals every
rank on every host); the MPICH shared-memory files this host's ranks mapped then, which only
``MPI_Finalize`` would remove, are removed once they are gone (:mod:`hvd_magic.mpi_shm`). Ranks
bootstrap through MPI (mpi4py), as under a plain ``mpiexec``.

What the ranks get of the launcher's environment (:func:`forwarded_names`): on other hosts,
only the allowlist of :func:`hvd_magic.launch.remote.forwarded_env` plus the names the user
passed (``--env``, ``run(env=...)``), as mpirun's ``-x`` does; never the rest of a login's
variables (cloud tokens, keys). MPICH's hydra forwards everything unless told otherwise, so it
gets ``-genvlist NAME,...``; Open MPI forwards nothing to other hosts, so it gets ``-x NAME``
per name. Values are read by mpiexec from its own environment: no value is on the command line.
When every host is this machine, hydra's ranks keep the whole environment (nothing leaves the
machine; hydra's local proxy would pass it on anyway).
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from itertools import groupby

from .. import mpi_shm
from . import hosts as hostlib
from . import procfs
from .output import parse_tagged
from .procs import ProcessJob, describe_exit
from .remote import forwarded_env

__all__ = ["MpiJob", "build_command", "find_mpiexec", "forwarded_names", "mpi_flavor"]

_PER_HOST = ("HVD_HOSTNAME", "HOROVOD_HOSTNAME")  # set per host segment below
# hydra takes one environment choice; one in --mpi-args is the user's (e.g. -genvall)
_HYDRA_ENV_CHOICES = ("-genvall", "-genvnone", "-genvlist")
# Hydra's -genvlist/-envlist skip a listed variable that is the last one of mpiexec's
# environment (seen with MPICH 5.0.2); build_command ends that environment with this one.
_ENV_END = "MPIEXEC_ENV_END"


def find_mpiexec() -> str | None:
    """mpiexec next to this Python (the PyPI mpich wheel), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec") or shutil.which("mpirun")


@functools.cache
def mpi_flavor(exe: str) -> str:
    """``"mpich"`` (hydra), ``"openmpi"`` or ``"unknown"``, from ``exe --version``."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if "HYDRA" in out or "MPICH" in out or "Intel(R) MPI" in out:
        return "mpich"
    if "Open MPI" in out or "OpenRTE" in out or "open-mpi" in out.lower():
        return "openmpi"
    return "unknown"


def _ssh_wrapper(port: int | None, identity: str | None) -> str | None:
    """An ``ssh`` that adds -p / -i, for hydra's -launcher-exec (it takes no ssh options)."""
    if port is None and not identity:
        return None
    opts = ([f"-p {int(port)}"] if port is not None else []) + (
        [f"-i {shlex.quote(identity)}"] if identity else [])
    folder = tempfile.mkdtemp(prefix="hvdrun-ssh-")
    path = os.path.join(folder, "ssh")
    with open(path, "w") as fh:
        fh.write(f"#!/bin/sh\nexec ssh {' '.join(opts)} \"$@\"\n")
    os.chmod(path, 0o700)
    return path


def forwarded_names(env: dict, user_names=()) -> list:
    """The variables of ``env`` that ranks on other hosts get, sorted: remote.forwarded_env's
    allowlist plus ``user_names`` (the user's --env names), less the per-host ones."""
    return sorted(k for k in forwarded_env(env, user_names) if k not in _PER_HOST)


def build_command(exe: str, flavor: str, slots: Sequence, rank_cmd: Sequence[str], env: dict,
                  *, ssh_port: int | None = None, ssh_identity: str | None = None,
                  mpi_args: str | None = None, user_names=()) -> list:
    """The mpiexec command line that runs ``rank_cmd`` once per slot, host by host; ranks on
    other hosts get :func:`forwarded_names` of ``env``, the environment mpiexec is to run
    with (for hydra, ``env`` then ends with a variable that is not forwarded: _ENV_END)."""
    segments = [(host, len(list(group))) for host, group in groupby(slots, key=lambda s: s.host)]
    hosts = ",".join(f"{host}:{count}" for host, count in segments)
    extra = shlex.split(mpi_args) if mpi_args else []
    names = forwarded_names(env, user_names)
    if flavor == "openmpi":
        cmd = [exe, "--allow-run-as-root", "-bind-to", "none", "-map-by", "slot",
               "-mca", "pml", "ob1", "-mca", "btl", "^openib", "-H", hosts]
        if ssh_port is not None or ssh_identity:
            rsh = (f"-p {int(ssh_port)} " if ssh_port is not None else "") + (
                f"-i {ssh_identity}" if ssh_identity else "")
            cmd += ["-mca", "plm_rsh_args", rsh.strip()]
        for key in names:  # Open MPI forwards nothing else to other hosts
            cmd += ["-x", key]
        cmd += extra
        for i, (host, count) in enumerate(segments):
            cmd += ([":"] if i else []) + ["-np", str(count), "-x", f"HVD_HOSTNAME={host}",
                                           *rank_cmd]
        return cmd
    # MPICH / hydra (also the default for unknown mpiexecs): hydra forwards the whole
    # environment by default; -genvlist narrows it (-genvnone with it is an error to hydra).
    cmd = [exe, "-hosts", hosts]
    wrapper = _ssh_wrapper(ssh_port, ssh_identity)
    if wrapper:
        cmd += ["-launcher", "ssh", "-launcher-exec", wrapper]
    remote = not all(hostlib.is_local(host) for host, _ in segments)
    if remote and not any(arg in _HYDRA_ENV_CHOICES for arg in extra):
        cmd += ["-genvlist", ",".join(names)] if names else ["-genvnone"]
        env.pop(_ENV_END, None)
        env[_ENV_END] = "1"  # now last, so no forwarded variable is (see _ENV_END)
    cmd += extra
    for i, (host, count) in enumerate(segments):
        cmd += ([":"] if i else []) + ["-n", str(count), "-env", "HVD_HOSTNAME", host, *rank_cmd]
    return cmd


class MpiJob(ProcessJob):
    """Supervises one mpiexec whose ranks run under rankwrap (tagged output, exit lines)."""

    KEY = "mpiexec"

    def __init__(self, *args, **kwargs):
        # No report window (procs.py Note [Report window] d): mpiexec kills every rank itself
        # when one fails, and the files below are noted when the stop starts.
        kwargs.setdefault("report_window", 0.0)
        super().__init__(*args, **kwargs)
        self._mpi_files: set[str] = set()  # this host's ranks' MPICH files (hvd_magic.mpi_shm)
        self._rank_pids: set[int] = set()

    def _frozen(self) -> list:
        return []  # (its child is mpiexec, not a rank: which rank is stopped is not known)

    def _terminate_all(self) -> None:
        # Stopped ranks never reach MPI_Finalize, which removes MPICH's file of their host: note
        # the files this host's ranks map before the signal goes, to remove them once the ranks
        # are gone (run).
        child = self._children.get(self.KEY)
        if self._kill_at is None and child is not None:
            self._rank_pids = procfs.descendants(child.proc.pid)
            self._mpi_files = mpi_shm.mapped_by(self._rank_pids)
        super()._terminate_all()

    def run(self, timeout: float | None = None):
        try:
            return super().run(timeout)
        finally:
            if self._mpi_files:
                procfs.wait_gone(self._rank_pids, timeout=5.0, poll=0.02)
                mpi_shm.remove_unmapped(self._mpi_files)  # a file still mapped stays

    def handle_line(self, key, stream: str, text: str) -> None:
        tagged = parse_tagged(text)
        if tagged is None:  # mpiexec's own messages
            self.output.note(text)
            return
        rank, kind, body = tagged
        if kind == "exit":
            try:
                code = int(body)
            except ValueError:
                code = 1
            self.rank_exited(rank, code)
        else:
            self.output.line(rank, kind, body)

    def handle_exit(self, key, code: int) -> None:
        self.result.codes[self.KEY] = code
        if code != 0 and self.result.failed is None and not self.result.interrupted:
            self.result.reason = f"mpiexec {describe_exit(code)}"
