"""GPU pinning for every way hvd-magic starts ranks, through one function:
:func:`engine_native.gpu.pin_gpu` (one GPU per local rank, round robin when ranks outnumber
GPUs, by narrowing ``CUDA_VISIBLE_DEVICES`` before CUDA is initialised).

Who pins, always before user code and before anything touches ``torch.cuda``:

- ``%hvd_start`` and the kernel: :func:`hvd_magic.engine_side.init_engine` on every engine;
  the driver says once when ranks share GPUs (:func:`sharing_note`).
- ``hvd_magic.run``, ``HorovodRunner``, Spark tasks: the rank process itself
  (``launch/task.py`` -> :func:`pin_this_rank`), from ``HVD_LOCAL_RANK``/``HVD_LOCAL_SIZE``.
- ``hvdrun``: ranks run foreign commands, so their environment is pinned before they start:
  by hvdrun for ranks on this machine, by ``launch/rankwrap.py`` on each host under mpiexec.

``gpus="none"`` (``--gpus none``) hides every GPU (``CUDA_VISIBLE_DEVICES=""``): CPU-only,
nothing to discover. Without a GPU nothing changes and no CUDA library is touched, so CPU-only
training pays no CUDA context. Whoever pinned records the result in the rank's environment
(``HVD_GPU_PIN``, see :mod:`hvd_magic.gpu_compat`): a process started by a pinned one does not
pin again, and the dashboard shows what was pinned. ``torch.cuda.set_device(hvd.local_rank())``
keeps working in narrowed ranks: Note [set_device(hvd.local_rank())] in gpu_compat.

>>> pin(local_rank=1, local_size=4)            # in the rank, before torch.cuda is used
{'device': 'cuda:0', 'gpu_index': 1, 'name': 'NVIDIA H100 80GB HBM3', ..., 'local_rank': 1}
"""

from __future__ import annotations

import json
import os
import sys
import warnings

from .gpu_compat import PIN_ENV, install_from_env, pin_from_env

GPUS_CHOICES = ("auto", "none")
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_site")
# (local rank, local size) variables, in order: our launchers, Horovod's, Open MPI, MPICH/hydra.
_LOCAL_VARS = (("HVD_LOCAL_RANK", "HVD_LOCAL_SIZE"), ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
               ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
               ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"))

_pinned: dict | None = None  # this process's own pin (os.environ), for the dashboard


def local_position(environ=None) -> tuple[int, int] | None:
    """``(local_rank, local_size)`` from the launcher's variables, or None when unknown."""
    environ = os.environ if environ is None else environ
    for rank_var, size_var in _LOCAL_VARS:
        rank, size = environ.get(rank_var, ""), environ.get(size_var, "")
        if rank.isdigit() and size.isdigit() and int(rank) < int(size):
            return int(rank), int(size)
    return None


def check_choice(gpus: str, what: str) -> str:
    if gpus not in GPUS_CHOICES:
        raise ValueError(f"{what}: gpus must be one of {', '.join(GPUS_CHOICES)}, got {gpus!r}")
    return gpus


def pin(local_rank: int, local_size: int, gpus: str = "auto", *, environ=None, devices=None,
        sharing=None, set_device_rank: int | None = None) -> dict:
    """Pin one rank: :func:`engine_native.gpu.pin_gpu`, recorded in ``environ``.

    Parameters
    ----------
    local_rank, local_size : this rank's place among the ranks of its host.
    gpus : "auto" pins a GPU when there is one; "none" hides every GPU.
    environ : the rank's environment to read and update (default ``os.environ``: this process).
    devices : passed to pin_gpu (a discovery done once for several ranks, or tests).
    sharing : ``callable(text)`` told pin_gpu's warning when ranks share GPUs (default: the
        warning is not shown; the caller says it once from the result's ``staged``).
    set_device_rank : the ordinal Horovod scripts pass to ``torch.cuda.set_device``
        (``hvd.local_rank()``), when it is not ``local_rank`` (several fake hosts on one
        machine); recorded as ``local_rank`` for gpu_compat.

    Returns
    -------
    dict
        pin_gpu's result plus ``local_rank`` and ``narrowed``; ``{"device": "cpu", "reason":
        ...}`` without a GPU, with ``gpus="none"`` or when pinning failed (the reason says so).
        An environment pinned before (by a parent process) is returned as it was.
    """
    own = environ is None
    environ = os.environ if own else environ
    earlier = pin_from_env(environ)
    if earlier is not None:
        return _remember(earlier, own)
    if gpus == "none":
        environ["CUDA_VISIBLE_DEVICES"] = ""
        out = {"device": "cpu", "reason": "GPUs hidden (--gpus none)"}
    else:
        check_choice(gpus, "pin")
        try:
            from engine_native import gpu

            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always", RuntimeWarning)
                out = gpu.pin_gpu(local_rank, local_size, devices=devices, environ=environ)
        except Exception as exc:  # a broken nvidia-smi or torch: say so, run on CPU
            out = {"device": "cpu", "reason": f"GPU pinning failed: {type(exc).__name__}: {exc}"}
            said = []
        for w in said:
            if sharing is not None and issubclass(w.category, RuntimeWarning):
                sharing(str(w.message))
    out = dict(out, local_rank=local_rank if set_device_rank is None else set_device_rank,
               narrowed=out.get("pinned_by") == "CUDA_VISIBLE_DEVICES")
    environ[PIN_ENV] = json.dumps(out, separators=(",", ":"))
    return _remember(out, own)


def _remember(out: dict, own: bool) -> dict:
    global _pinned
    if own:
        _pinned = dict(out)
        install_from_env()  # Note [set_device(hvd.local_rank())]
    return out


def child_env(environ: dict) -> dict:
    """``environ`` of a rank that runs a foreign command (hvdrun): when its pin narrowed
    ``CUDA_VISIBLE_DEVICES``, every Python started in it loads gpu_compat through
    ``gpu_site/sitecustomize.py`` (first on PYTHONPATH). Returns ``environ``, updated."""
    pin = pin_from_env(environ)
    if pin and pin.get("narrowed"):
        rest = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIR]
        environ["PYTHONPATH"] = os.pathsep.join([SITE_DIR] + rest)
    return environ


def pinned() -> dict | None:
    """This process's pin (made here or inherited through ``HVD_GPU_PIN``), or None."""
    return _pinned if _pinned is not None else pin_from_env()


def pin_this_rank(gpus: str = "auto") -> dict | None:
    """In a rank process started by our launchers: pin it from its local position (a rank
    whose launcher pinned it already keeps that). Local rank 0 says on stderr when the ranks
    of its host share GPUs, so a host says it once. None when the local position is unknown."""
    position = local_position()
    if position is None and pin_from_env() is None:
        return None
    local_rank, local_size = position or (0, 1)
    say = _stderr_once if local_rank == 0 else None
    return pin(local_rank, local_size, gpus, sharing=say)


def _stderr_once(text: str) -> None:
    sys.stderr.write(f"hvd_magic: {text}\n")
    sys.stderr.flush()


def sharing_note(pins: list[tuple[str, dict]]) -> str | None:
    """One line for the driver when ranks share GPUs: ``pins`` is ``[(host, pin), ...]`` for
    every rank; None when no rank shares."""
    by_host: dict[str, list[dict]] = {}
    for host, p in pins:
        if p.get("staged"):
            by_host.setdefault(host, []).append(p)
    if not by_host:
        return None
    parts = [f"{len(ps)} ranks on {host} share {ps[0].get('gpus', '?')} GPU(s)"
             for host, ps in sorted(by_host.items())]
    return ("; ".join(parts) + ". NCCL needs one GPU per rank, so the ranks of a GPU reduce "
            "through CUDA IPC and one rank per GPU joins NCCL; each GPU's time is divided "
            "between its ranks (shared under MPS instead). Fix: start at most one rank per GPU "
            "(%hvd_start -n N) for full speed")
