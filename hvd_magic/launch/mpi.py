"""Ranks on several hosts through mpiexec (MPICH's hydra or Open MPI's mpirun).

The launcher builds one MPMD command with a segment per host, so every rank of a host gets
``HVD_HOSTNAME`` = that host's name from ``-H``, and wraps each rank in
``python -m hvd_magic.launch.rankwrap`` (see there): the wrapper tags every output line with
the rank and reports the rank's exit code as a ``[r]<exit>:code`` line. :class:`MpiJob` reads
mpiexec's output, hands tagged lines to the same :class:`RankOutput` as local ranks, and on the
first failing rank stops mpiexec (SIGTERM to its process group: mpiexec then signals every
rank on every host). Ranks bootstrap through MPI (mpi4py), as under a plain ``mpiexec``.
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

from .output import parse_tagged
from .procs import ProcessJob, describe_exit

__all__ = ["MpiJob", "build_command", "find_mpiexec", "mpi_flavor"]

# Variables passed with -x to Open MPI (it does not forward the environment by itself).
_EXPORT_PREFIXES = ("HVD_", "HOROVOD_", "PYTHON", "NCCL_", "CUDA_", "OMP_", "MKL_")
_EXPORT_NAMES = ("PATH", "LD_LIBRARY_PATH")


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


def build_command(exe: str, flavor: str, slots: Sequence, rank_cmd: Sequence[str], env: dict,
                  *, ssh_port: int | None = None, ssh_identity: str | None = None,
                  mpi_args: str | None = None) -> list:
    """The mpiexec command line that runs ``rank_cmd`` once per slot, host by host."""
    segments = [(host, len(list(group))) for host, group in groupby(slots, key=lambda s: s.host)]
    hosts = ",".join(f"{host}:{count}" for host, count in segments)
    extra = shlex.split(mpi_args) if mpi_args else []
    if flavor == "openmpi":
        cmd = [exe, "--allow-run-as-root", "-bind-to", "none", "-map-by", "slot",
               "-mca", "pml", "ob1", "-mca", "btl", "^openib", "-H", hosts]
        if ssh_port is not None or ssh_identity:
            rsh = (f"-p {int(ssh_port)} " if ssh_port is not None else "") + (
                f"-i {ssh_identity}" if ssh_identity else "")
            cmd += ["-mca", "plm_rsh_args", rsh.strip()]
        exported = sorted(k for k in env if k.startswith(_EXPORT_PREFIXES) or k in _EXPORT_NAMES)
        for key in exported:
            if key not in ("HVD_HOSTNAME", "HOROVOD_HOSTNAME"):
                cmd += ["-x", key]
        cmd += extra
        for i, (host, count) in enumerate(segments):
            cmd += ([":"] if i else []) + ["-np", str(count), "-x", f"HVD_HOSTNAME={host}",
                                           *rank_cmd]
        return cmd
    # MPICH / hydra (also the default for unknown mpiexecs): the environment is forwarded.
    cmd = [exe, "-hosts", hosts]
    wrapper = _ssh_wrapper(ssh_port, ssh_identity)
    if wrapper:
        cmd += ["-launcher", "ssh", "-launcher-exec", wrapper]
    cmd += extra
    for i, (host, count) in enumerate(segments):
        cmd += ([":"] if i else []) + ["-n", str(count), "-env", "HVD_HOSTNAME", host, *rank_cmd]
    return cmd


class MpiJob(ProcessJob):
    """Supervises one mpiexec whose ranks run under rankwrap (tagged output, exit lines)."""

    KEY = "mpiexec"

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
