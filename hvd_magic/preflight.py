"""Checks before and right after ``%hvd_start``, each failing with the fix spelled out.

Before: the launcher's tools exist (``mpiexec`` and ``mpi4py`` for the MPI launcher) and
belong to the same MPI (an Open MPI ``mpiexec`` starting MPICH-linked ranks gives N separate
worlds of size 1). After registration: the MPI engines really form one world. When engines do
not register in time, :func:`registration_failure` explains with the launcher's own output.
Runs on the notebook's main thread; results of the slow checks are cached per process.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess
import sys

from .errors import StartError

_MPI_FAMILIES = (("Open MPI", "openmpi"), ("OpenRTE", "openmpi"), ("HYDRA", "mpich"),
                 ("MPICH", "mpich"), ("Intel(R) MPI", "mpich"), ("MVAPICH", "mpich"))

FIX_MPI = ("install an MPI and mpi4py into this environment, e.g. `pip install mpich mpi4py`, "
           "or start without MPI: %hvd_start -n 4 --launcher local")


def _family(text: str) -> str | None:
    for marker, family in _MPI_FAMILIES:
        if marker in text:
            return family
    return None


@functools.cache
def mpiexec_version(mpiexec: str) -> str:
    try:
        done = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StartError(f"`{mpiexec} --version` failed: {exc}. Fix: {FIX_MPI}")
    return (done.stdout + done.stderr).strip()


@functools.cache
def mpi4py_library(python: str) -> str:
    """The MPI library mpi4py loads, asked in a subprocess so the notebook never calls
    MPI_Init (a singleton MPI in the kernel would outlive the cluster)."""
    code = ("import mpi4py; mpi4py.rc.initialize = False; mpi4py.rc.finalize = False; "
            "from mpi4py import MPI; print(MPI.Get_library_version())")
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StartError(f"could not ask mpi4py for its MPI library: {exc}. Fix: {FIX_MPI}")
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise StartError(f"mpi4py is installed but cannot load its MPI library: {tail}. "
                         f"Fix: {FIX_MPI}")
    return done.stdout.strip()


def check_launcher(launcher: str, python: str = sys.executable) -> None:
    """Raise StartError, with the fix, when the launcher cannot work here."""
    if launcher != "mpi":
        return
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        raise StartError(f"the MPI launcher needs `mpiexec`, which is not on PATH. Fix: {FIX_MPI}")
    if importlib.util.find_spec("mpi4py") is None:
        raise StartError("the MPI launcher needs mpi4py, which is not installed "
                         f"(engines use it to learn their rank). Fix: {FIX_MPI}")
    launcher_text = mpiexec_version(mpiexec)
    library_text = mpi4py_library(python)
    ours, theirs = _family(launcher_text), _family(library_text)
    if ours and theirs and ours != theirs:
        first = library_text.splitlines()[0] if library_text else "?"
        raise StartError(
            f"mismatched MPI: {mpiexec} is {ours.replace('mpich', 'MPICH-family')} but mpi4py "
            f"is linked to {first!r}; the ranks would each start as rank 0 of 1. Fix: put the "
            f"matching mpiexec first on PATH, or rebuild mpi4py against it "
            f"(`pip install --force-reinstall --no-binary mpi4py mpi4py`)")


def check_mpi_world(infos: list[dict], n: int) -> None:
    """After registration under the MPI launcher: one world of ``n`` distinct ranks."""
    sizes = sorted({i.get("mpi_size") for i in infos}, key=str)
    ranks = sorted(i.get("mpi_rank") for i in infos if i.get("mpi_rank") is not None)
    if sizes == [n] and ranks == list(range(n)):
        return
    library = next((i.get("mpi_library") for i in infos if i.get("mpi_library")), "?")
    if sizes == [1]:
        raise StartError(
            f"the {n} engines are {n} separate MPI worlds of size 1, not one world: mpiexec "
            f"and mpi4py ({library}) come from different MPI installations. Fix: use the "
            f"mpiexec of the MPI mpi4py was built with (see `python -m mpi4py --mpi-library`), "
            f"or --launcher local")
    raise StartError(f"MPI engines report world sizes {sizes} and ranks {ranks}, expected one "
                     f"world of {n}. Fix: check `mpiexec -n {n} python -m mpi4py.bench "
                     f"helloworld`, or use --launcher local")


def registration_failure(n: int, registered: int, timeout: float, launcher: str,
                         launcher_output: str, exited: str | None) -> StartError:
    """The error for engines that did not (all) register, with the launcher's output."""
    if exited:
        head = f"the {launcher} engine launcher exited ({exited}) before {n} engines registered"
    else:
        head = f"only {registered} of {n} engines registered within {timeout:g} s"
    tail = "\n".join(launcher_output.strip().splitlines()[-30:]) or "(the launcher printed nothing)"
    hints = ["raise the wait with %hvd_start --timeout 120 on a loaded or batch system"]
    if launcher == "mpi":
        hints.insert(0, "check that `mpiexec -n 2 python -c 'import mpi4py.MPI'` works")
    if launcher not in ("local", "mpi"):
        hints.insert(0, "check the batch job's state and that engines can reach the "
                        "controller (ipyparallel binds it to this host)")
    return StartError(f"{head}.\nLauncher output (last lines):\n{tail}\nFix: " + "; ".join(hints))
