"""The shared-memory files an MPICH job stopped inside ``MPI_Init`` leaves behind.

MPICH's ranks of one host meet in a ``/dev/shm/mpich_shm_*`` file: one rank makes it in
``MPI_Init``, each maps it, and it is unlinked once every rank of the host has. A job stopped
before that (a rank failed before its init, and hvdrun's SIGTERM reached the others inside
theirs) leaves the file there for good, as plain ``mpiexec`` does. After such a job, hvdrun
removes the files of this host that appeared after the job started and that no live process
maps: a running job's ranks map its file from the moment they make it until it is unlinked, so
only a dead job's is unmapped. A file seen unmapped is looked at again a moment later, so a file
another job is just making (created, not yet mapped: microseconds) is spared. Other hosts' files
are not reached (their ranks ran there).
"""

from __future__ import annotations

import os
import time

__all__ = ["PREFIX", "sweep_mpich_files"]

PREFIX = "mpich_shm_"
_SECOND_LOOK = 0.05  # seconds between the two looks at a file's mappings


def _mapped_paths() -> set[str]:
    """Every file some live process of this user maps (from /proc/*/maps)."""
    paths: set[str] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "maps"), encoding="utf-8",
                      errors="replace") as fh:
                for line in fh:
                    path = line.split(None, 5)[5:]  # the sixth field, when the line has one
                    if path:
                        paths.add(path[0].rstrip("\n"))
        except OSError:  # gone meanwhile, or another user's
            continue
    return paths


def _candidates(directory: str, since: float) -> list[str]:
    found = []
    uid = os.getuid()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return found
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid == uid and st.st_mtime >= since:
            found.append(entry.path)
    return found


def sweep_mpich_files(since: float, directory: str = "/dev/shm") -> list[str]:
    """Removes ``directory``'s MPICH files of this user modified at or after ``since`` (a
    time.time()) that no live process maps, at two looks; returns the paths removed."""
    candidates = _candidates(directory, since)
    if not candidates:
        return []
    unmapped = [p for p in candidates if p not in _mapped_paths()]
    if not unmapped:
        return []
    time.sleep(_SECOND_LOOK)
    mapped = _mapped_paths()
    removed = []
    for path in unmapped:
        if path in mapped:
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:  # removed meanwhile (its job unlinked it)
            pass
    return removed
