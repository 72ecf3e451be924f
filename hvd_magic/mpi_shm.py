"""MPICH's shared-memory files of a cluster's ranks, removed once nothing maps them.

The ranks of an MPI cluster on one host share a file MPICH makes in /dev/shm
(``mpich_shm_*``, ~2 MiB of memory) and removes in ``MPI_Finalize``. A rank killed by a signal
never finalizes, nor do the ranks mpiexec then kills: the file stays until the machine
reboots, one per restart after a crash (seen in CI: one per run, from the cluster test that
SIGKILLs a rank). So the cluster notes the files its engines map once they are up, and when
those engines are gone (``%hvd_restart``, ``%hvd_stop``) removes each one no process maps any
more. A file some process still maps is left alone, as is any file the cluster did not note.
``hvdrun --mpi`` and ``run(fn, use_mpi=True)`` do the same for a job they stop
(hvd_magic/launch/mpi.py ``MpiJob``).
"""
from __future__ import annotations

import os

SHM_DIR = "/dev/shm"
PREFIX = "mpich_shm_"


def _mapped_in(pid) -> set[str]:
    """The MPICH files in /dev/shm that process ``pid`` maps ({} if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/maps", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    found = set()
    for line in lines:
        fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
        path = fields[5].strip().removesuffix(" (deleted)") if len(fields) == 6 else ""
        if path.startswith(f"{SHM_DIR}/{PREFIX}") and "/" not in path[len(SHM_DIR) + 1:]:
            found.add(path)
    return found


def mapped_by(pids) -> set[str]:
    """The MPICH files the processes ``pids`` (of this host) map now."""
    found = set()
    for pid in pids:
        found |= _mapped_in(pid)
    return found


def remove_unmapped(paths) -> list[str]:
    """Remove those of ``paths`` that no process of this host maps; returns the removed."""
    paths = {p for p in paths if os.path.exists(p)}
    if not paths:
        return []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            paths -= _mapped_in(entry)
    removed = []
    for path in sorted(paths):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:  # gone meanwhile, or not ours to remove
            pass
    return removed
